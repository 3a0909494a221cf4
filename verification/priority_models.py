"""The priority policy's model-checking constants (docs/request-states.md,
"Priority scheduling"), kept apart from the spec as `models.py` and
`kv_models.py` keep theirs: two small models, each searched under vLLM 0.33
and 0.34, sync and async, and the model each priority mutant is hunted on.

* `prio-victim-k2`: a low-priority request admitted first and a
  high-priority one behind it in a pool of 3 blocks, drafts on: the victim
  is the low-priority request, often scheduled earlier in the same call
  (its tokens and drafts handed back, #23347, #28558).
* `prio-skip-k2`: a low-priority request admitted first and two
  high-priority ones, in a pool of 4: the low-priority one, visited and
  skipped with its token in flight, is the victim of a request behind it
  (the index moved back, #49097).
* `prio-unwritten-k3`: KV8 (spec/kv_unwritten.py), prefix caching on: a
  low-priority request chunked by the long-prefill threshold, handed back
  from a chunk that caches a block it would have finished, then re-admitted
  on that block as a prefix hit (docs/vllm-unwritten-kv-findings.md,
  finding 1; `PRIORITY_UNWRITTEN_MODELS`); `prio-unwritten-k1`, the same
  run with one batch in flight (the slow tests' twin, not in the suite).
"""

from __future__ import annotations

from dataclasses import replace

from flightcheck.spec import Config, Prompt
from flightcheck.verification.models import Model
from flightcheck.verification.mutants.priority import PRIORITY_BUGS, PRIORITY_PROFILE

# Targets of every profile these models are too small (or too short of stop
# tokens) to reach; the profile's own models reach them.
_PRIORITY_SKIPPED = ("stopped_with_output_in_flight", "two_prefill_chunks_in_flight")


def _under(model: Model, profile: str) -> Model:
    """`model` under `profile`, renamed after it ("prio-skip-k2@vllm-0.33")."""
    return replace(model.under_profile(profile), name=f"{model.name}@{profile}")


PRIO_VICTIM_K2 = Model(
    "prio-victim-k2",
    Config(num_stages=2, max_num_batched_tokens=4, max_num_seqs=2, block_size=2, num_blocks=3,
           max_model_len=6, prefix_caching=False, num_spec_tokens=1, profile=PRIORITY_PROFILE,
           scheduling_policy="priority"),
    (Prompt(2, 3, priority=1), Prompt(1, 3, priority=0)),
    allow_stop=False, skip_targets=_PRIORITY_SKIPPED,
)
PRIO_SKIP_K2 = Model(
    "prio-skip-k2",
    Config(num_stages=2, max_num_batched_tokens=4, max_num_seqs=3, block_size=2, num_blocks=4,
           max_model_len=6, prefix_caching=False, profile=PRIORITY_PROFILE, scheduling_policy="priority"),
    (Prompt(2, 3, priority=1), Prompt(1, 3, priority=0), Prompt(1, 3, priority=0)),
    allow_stop=False, allow_abort=False, skip_targets=_PRIORITY_SKIPPED,
)
_MODELS = (PRIO_VICTIM_K2, PRIO_SKIP_K2)
# vLLM 0.34 with finding 1's fix of the unwritten-KV findings: the policy's
# models under it, and KV8's below.
UNWRITTEN_KV_FIXED = "vllm-0.34-unwritten-kv-fixed"
PRIORITY_PROFILE_MODELS: dict[str, tuple[Model, ...]] = {
    profile: tuple(m if profile == PRIORITY_PROFILE else _under(m, profile) for m in _MODELS)
    for profile in ("vllm-0.33", "vllm-0.33-async", "vllm-0.34", "vllm-0.34-async", UNWRITTEN_KV_FIXED)
}

# --- KV8 (spec/kv_unwritten.py; docs/vllm-unwritten-kv-findings.md, finding 1):
# the kept workload's shape (tests/data/vllm/unwritten) at blocks of 4 and a
# threshold of 3. r0 (9 tokens, labels 1, 2, the worst rank) is admitted
# behind r1 (1 token, the best: under 0.34 the threshold needs two eligible
# requests) and chunked @0+3, @3+3; r2 (9 tokens, the same labels, the middle
# rank) arrives after r0's admission and is admitted behind r0's second chunk,
# with a hit on r0's first block (that batch writes its last token); it needs
# a block for its next chunk when r0's @6+3 has taken the last one and cached
# its second block (tokens 4-7, 6-7 never run): r0 is handed back, its
# fresh partial block goes to the free queue's head and to r2, block 1 keeps
# its label, and r0's re-admission reads it as a hit. Under vLLM 0.34's rules
# (and 0.33's) KV8 breaks in 10 steps; under the fix
# (`vllm-0.34-unwritten-kv-fixed`) it holds. `Config.check_unwritten_kv`
# puts `unwritten_kv` in the state's identity.
PRIO_UNWRITTEN_K3 = Model(
    "prio-unwritten-k3",
    Config(num_stages=3, max_num_batched_tokens=14, max_num_seqs=3, block_size=4, num_blocks=4,
           max_model_len=10, prefix_caching=True, long_prefill_token_threshold=3, profile=PRIORITY_PROFILE,
           scheduling_policy="priority", check_unwritten_kv=True),
    (Prompt(9, 1, (1, 2), priority=2), Prompt(1, 1, priority=0), Prompt(9, 1, (1, 2), priority=1)),
    allow_stop=False, allow_abort=False, skip_targets=("stale_output_delivered",),
)
# The same run with one batch in flight and two seats (`prio-unwritten-k1`):
# each schedule waits for the batch before it, r1 finishes before r2 takes
# its seat, and the hand-back and the hit come as in the K = 3 run, one
# `complete` between the schedules (10 steps). 242 states under 0.33's,
# 0.34's rules and the fix alike; KV8 broken under the first two, kept
# under the fix. Not one of the suite's models: the slow tests check the
# facts KV8's k-induction tracks inside a `schedule` call on every call of
# its runs (tests/test_z3_unwritten.py; the proof is on prio-unwritten-k3).
PRIO_UNWRITTEN_K1 = replace(PRIO_UNWRITTEN_K3, name="prio-unwritten-k1",
                            cfg=replace(PRIO_UNWRITTEN_K3.cfg, num_stages=1, max_num_seqs=2))
# `verify --priority`'s KV8 rows, per profile: violated under vLLM 0.33's and
# 0.34's rules (a vLLM bug), proved under the fix; the fix's profile has the
# policy's other models too.
PRIORITY_UNWRITTEN_MODELS: dict[str, tuple[Model, ...]] = {
    profile: (PRIO_UNWRITTEN_K3 if profile == PRIORITY_PROFILE else _under(PRIO_UNWRITTEN_K3, profile),)
    for profile in ("vllm-0.33", "vllm-0.34", UNWRITTEN_KV_FIXED)
}

# Each mutant's model: the one whose scenario its bug needs.
PRIORITY_MUTANT_MODELS: dict[str, Model] = {
    "victim_kept_in_batch_pr23347": PRIO_VICTIM_K2,
    "preempted_drafts_kept_pr28558": PRIO_VICTIM_K2,
    "victim_index_not_adjusted_pr49097": PRIO_SKIP_K2,
}
assert set(PRIORITY_MUTANT_MODELS) == {m.name for m in PRIORITY_BUGS}


def priority_mutant_model(name: str) -> Model:
    """The model the priority mutant `name` is hunted on, with it in force."""
    return PRIORITY_MUTANT_MODELS[name].with_mutant(name)
