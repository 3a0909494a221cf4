"""One batch output's load failures, judged jointly (spec/kv_reports.py
`fail_kv_output`, docs/kv-connector.md "One output, several failures").

On every state of a few connector models (a bounded breadth-first walk of
the explicit search's successors):

* the joint scan of one failure (recompute) is `fail_kv_load` (the action the explicit
  search and the Z3 encodings explore): the two readings are one rule;
* the joint action of two failures reaches a state their failures reach
  one by one in some order, and every order the spec allows reaches it (so
  the search, which explores one failure per output, covers every output
  with several); on the model where a loader's
  and a sharer's sync loads fail together, in one order only: applied in the
  other, the sharer's own report is refused (the false C2 rejection of
  vLLM 0.34.0 on workload 191 of the all-features seed 2 set: its trace is
  tests/data/kv/vllm/034_joint_failures_loader_and_sharer.jsonl).
"""

from __future__ import annotations

from collections import deque
from itertools import permutations

from flightcheck.spec import Config, KvConnector, Prompt, State, step
from flightcheck.spec.kv_reports import _scan_invalid_blocks, fail_kv_output
from flightcheck.spec.transitions import FailKvLoad, FailKvOutput
from flightcheck.verification.explicit import search as explicit
from flightcheck.verification.kv_models import KV_LOAD_ERROR_K2, KV_LOAD_FAIL_K2, KV_SHARED_PREFIX
from flightcheck.verification.models import Model

# r0 loads its first block synchronously; r1, admitted after it, holds that
# block through its prefix hit and loads its second block synchronously.
KV_LOADER_AND_SHARER = Model(
    "kv-loader-and-sharer",
    Config(num_stages=2, max_num_batched_tokens=8, max_num_seqs=2, block_size=2, num_blocks=6,
           max_model_len=8, prefix_caching=True, profile="vllm-0.34", kv_connector=KvConnector()),
    (Prompt(3, 1, (1,), external_hit=2), Prompt(5, 1, (1, 2), external_hit=2)),
    allow_stop=False, allow_abort=True, kv_failures=True,
)


def reachable(model: Model, limit: int = 6000) -> list[State]:
    seen = {explicit.initial(model)}
    queue, states = deque(seen), []
    while queue and len(states) < limit:
        s = queue.popleft()
        states.append(s)
        for _, nxt in explicit.successors(model, s):
            if nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    return states


def failures(model: Model, s: State) -> list[FailKvLoad]:
    return [a for a in explicit.kv_reports(model, s)
            if isinstance(a, FailKvLoad) and step(s, model.cfg, a) is not None]


def one_by_one(s: State, cfg: Config, order: tuple[FailKvLoad, ...]) -> State | None:
    for f in order:
        s = step(s, cfg, f)
        if s is None:
            return None
    return s


def check_model(model: Model) -> tuple[int, int, int]:
    """(single failures, pairs, pairs that only one order reaches)."""
    singles = pairs = one_order = 0
    for s in reachable(model):
        fs = failures(model, s)
        for f in fs:
            singles += 1
            if model.cfg.kv_connector.load_failure_policy == "recompute":
                assert _scan_invalid_blocks(s, model.cfg, ((f.req, f.from_block),)) == step(s, model.cfg, f), (f, s)
        for f, g in permutations(fs, 2):
            if f.req >= g.req:
                continue
            joint = step(s, model.cfg, FailKvOutput((f, g)))
            if joint is None:
                continue
            pairs += 1
            assert joint == step(s, model.cfg, FailKvOutput((g, f)))     # the output's order is no order
            orders = [one_by_one(s, model.cfg, order) for order in ((f, g), (g, f))]
            assert joint in orders, (f, g, s)
            assert all(x in (None, joint) for x in orders), (f, g, s)    # an order the spec allows agrees
            one_order += None in orders
    return singles, pairs, one_order


def test_loader_and_sharer_failing_together():
    singles, pairs, one_order = check_model(KV_LOADER_AND_SHARER)
    assert singles and pairs and one_order


def test_joint_scan_agrees_with_the_searched_action():
    for model in (KV_LOAD_FAIL_K2, KV_LOAD_ERROR_K2, KV_SHARED_PREFIX):
        singles, _, _ = check_model(model)
        assert singles


def test_joint_guards():
    s = reachable(KV_LOADER_AND_SHARER)
    cfg = KV_LOADER_AND_SHARER.cfg
    both = next(x for x in s if len({f.req for f in failures(KV_LOADER_AND_SHARER, x)}) == 2)
    f = failures(KV_LOADER_AND_SHARER, both)[0]
    assert fail_kv_output(both, cfg, ()) is None                                   # no failure
    assert fail_kv_output(both, cfg, ((f.req, f.from_block), (f.req, f.from_block))) is None   # twice
    assert fail_kv_output(both, cfg, ((f.req, f.from_block),)) == step(both, cfg, f)
