"""The priority policy beside the KV connector: its model-checking constants
(docs/request-states.md, "Features together"), kept apart from the spec as
`priority_models.py` and `kv_models.py` keep theirs.

* `prio-kv-k2`: two async loads of two priorities, the later arrival of the
  better rank, either allowed to fail (request- and block-level), in a pool
  of 4 blocks, under vLLM 0.34 (`max_num_inflight_kv_loads` 2: the loads
  wait in `async_kv_waiting`, a priority heap) and 0.33, sync and async:
  both parked at once, `kv_holding_waiting` in rank order (PR4), promoted,
  rolled back and resumed by rank, with the policy's and the connector's
  invariants checked on every state.
* `prio-kv-hold-k2`: a low-priority async load of its whole prompt and a
  plain high-priority request behind it that needs more of the pool than
  the load leaves: the load must be promoted first (#57841's limit).
"""

from __future__ import annotations

from dataclasses import replace

from flightcheck.spec import Config, KvConnector, Prompt
from flightcheck.verification.models import Model
from flightcheck.verification.mutants.priority_kv import PRIORITY_KV_BUGS, PRIORITY_KV_PROFILE

# Targets of every profile these models are too small to reach (the
# profile's own models reach them).
_SKIPPED = ("preempted_request_resumes_and_finishes", "resumption_deferred", "stale_output_delivered",
            "decode_behind_decode", "stopped_with_output_in_flight", "two_prefill_chunks_in_flight")


def _under(model: Model, profile: str) -> Model:
    """`model` under `profile`, renamed after it ("prio-kv-k2@vllm-0.33")."""
    return replace(model.under_profile(profile), name=f"{model.name}@{profile}")


PRIO_KV_K2 = Model(
    "prio-kv-k2",
    Config(num_stages=2, max_num_batched_tokens=3, max_num_seqs=2, block_size=2, num_blocks=4,
           max_model_len=6, prefix_caching=False, profile=PRIORITY_KV_PROFILE, scheduling_policy="priority",
           kv_connector=KvConnector(max_inflight_loads=2)),
    (Prompt(2, 1, external_hit=2, load_async=True, priority=1),
     Prompt(3, 1, external_hit=2, load_async=True, priority=0)),
    allow_stop=False, kv_failures=True, skip_targets=_SKIPPED,
)
PRIO_KV_HOLD_K2 = Model(
    "prio-kv-hold-k2",
    Config(num_stages=2, max_num_batched_tokens=4, max_num_seqs=2, block_size=2, num_blocks=3,
           max_model_len=6, prefix_caching=False, profile=PRIORITY_KV_PROFILE, scheduling_policy="priority",
           kv_connector=KvConnector()),
    (Prompt(4, 1, external_hit=4, load_async=True, priority=1), Prompt(3, 1, priority=0)),
    allow_stop=False, allow_abort=False, skip_targets=_SKIPPED + ("blocks_freed_behind_fence",),
)
_MODELS = (PRIO_KV_K2, PRIO_KV_HOLD_K2)
PRIORITY_KV_PROFILE_MODELS: dict[str, tuple[Model, ...]] = {
    profile: tuple(m if profile == PRIORITY_KV_PROFILE else _under(m, profile) for m in _MODELS)
    for profile in ("vllm-0.33", "vllm-0.33-async", "vllm-0.34", "vllm-0.34-async")
}

# Each mutant's model: the one whose scenario its bug needs.
PRIORITY_KV_MUTANT_MODELS: dict[str, Model] = {
    "load_ranked_behind_new_request_pr57841": PRIO_KV_HOLD_K2,
    "parked_load_joins_tail_under_priority": PRIO_KV_K2,
}
assert set(PRIORITY_KV_MUTANT_MODELS) == {m.name for m in PRIORITY_KV_BUGS}


def priority_kv_mutant_model(name: str) -> Model:
    """The model the mutant `name` is hunted on, with it in force."""
    return PRIORITY_KV_MUTANT_MODELS[name].with_mutant(name)
