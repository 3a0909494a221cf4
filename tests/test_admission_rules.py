"""The admission rules that tell vLLM 0.33 and 0.34 apart, in the spec and
the reference: chunked prefill off (`enable_chunked_prefill=False`: the
waiting loop stops at a prompt that would need a chunk, 0.33 and 0.34; 0.8.x
ignores the switch), the long-prefill threshold only with chunked prefill
(0.34), and 0.34's opt-in cache-aware admission order. At their defaults
none of them changes anything (the pinned counts and golden traces say so);
here each is shown to act, per profile, in the spec, the reference, the
explicit search, check-trace and the replay's workload format."""

from __future__ import annotations

from pathlib import Path

import pytest

from flightcheck.reference import Request, SamplingParams, Scheduler, SchedulerConfig
from flightcheck.reference.request import RequestStatus
from flightcheck.spec import Config, Prompt
from flightcheck.spec.transitions import Arrive, Schedule, step
from flightcheck.spec.schedule import schedule
from flightcheck.spec.state import initial_state
from flightcheck.verification.explicit import search as explicit
from flightcheck.verification.explicit.search import initial, successors
from flightcheck.verification.models import ADMISSION_MODELS, CACHE_AWARE_K2, UNCHUNKED_K2
from flightcheck.verification.traces.check import check_events, read_events
from flightcheck.verification.traces.reading import MalformedTrace
from flightcheck.vllm.differential import decisions
from flightcheck.vllm.generate import FAMILIES, campaign_workloads
from flightcheck.vllm.reference_run import run_reference
from flightcheck.vllm.workload import WorkloadError, workload_from_json

# check_events runs the full replay and the incremental checker alike
pytestmark = pytest.mark.usefixtures("both_checkers")

# -- chunked prefill off ------------------------------------------------------------
# Two prompts of 4 and 3 tokens arrive together; the budget is 6 =
# max_model_len; the threshold is `threshold`.

# profile, threshold -> the first batch: (request, start, n) per entry
UNCHUNKED_FIRST_BATCH = {
    ("vllm-0.34", 2): [(0, 0, 4)],             # threshold off without chunking; 3 > 2 left: stop
    ("vllm-0.33", 2): [(0, 0, 2), (1, 0, 2)],  # the threshold still cuts, and a cut prompt fits
    ("vllm-0.8.5", 2): [(0, 0, 2), (1, 0, 2)],
    ("vllm-0.34", 0): [(0, 0, 4)],
    ("vllm-0.33", 0): [(0, 0, 4)],             # 3 > 2 left: the loop stops
    ("vllm-0.8.5", 0): [(0, 0, 4), (1, 0, 2)],  # 0.8.x's V1 scheduler chunks anyway
}


def spec_first_batch(profile: str, threshold: int, chunked: bool = False) -> list[tuple[int, int, int]]:
    cfg = Config(num_stages=2, max_num_batched_tokens=6, max_num_seqs=2, block_size=2, num_blocks=8,
                 max_model_len=6, prefix_caching=False, long_prefill_token_threshold=threshold,
                 enable_chunked_prefill=chunked, profile=profile)
    state = initial_state(2, cfg.num_blocks)
    for r, length in enumerate((4, 3)):
        state = step(state, cfg, Arrive(r, Prompt(length, 2, ())))
    scheduled = schedule(state, cfg)
    return [(e.req, e.start, e.n) for e in scheduled.entries]


def reference_first_batch(profile: str, threshold: int, chunked: bool = False) -> list[tuple[int, int, int]]:
    scheduler = Scheduler(SchedulerConfig(max_num_batched_tokens=6, max_num_seqs=2, max_model_len=6,
                                          block_size=2, num_blocks=8, enable_prefix_caching=False,
                                          long_prefill_token_threshold=threshold,
                                          enable_chunked_prefill=chunked, profile=profile))
    for r, length in enumerate((4, 3)):
        scheduler.add_request(Request(str(r), list(range(10 * r + 3, 10 * r + 3 + length)),
                                      SamplingParams(max_tokens=2)))
    return [(int(e.req_id), e.num_computed_tokens, e.num_new_tokens) for e in scheduler.schedule().entries]


@pytest.mark.parametrize(("profile", "threshold"), list(UNCHUNKED_FIRST_BATCH))
def test_chunked_prefill_off_admits_a_prompt_whole_or_stops(profile: str, threshold: int) -> None:
    want = UNCHUNKED_FIRST_BATCH[profile, threshold]
    assert spec_first_batch(profile, threshold) == want
    assert reference_first_batch(profile, threshold) == want


@pytest.mark.parametrize("profile", ["vllm-0.33", "vllm-0.34"])
def test_with_chunked_prefill_on_the_second_prompt_gets_a_chunk(profile: str) -> None:
    assert spec_first_batch(profile, 0, chunked=True) == [(0, 0, 4), (1, 0, 2)]
    assert reference_first_batch(profile, 0, chunked=True) == [(0, 0, 4), (1, 0, 2)]


def test_chunked_prefill_off_needs_a_budget_of_max_model_len() -> None:
    with pytest.raises(ValueError, match="max_model_len"):
        Config(max_num_batched_tokens=5, max_model_len=6, enable_chunked_prefill=False)
    with pytest.raises(ValueError, match="max_model_len"):
        SchedulerConfig(max_num_batched_tokens=5, max_model_len=6, block_size=2, num_blocks=8,
                        enable_chunked_prefill=False)
    with pytest.raises(ValueError, match="cache_aware_admission_threshold"):
        Config(cache_aware_admission_threshold=1.5)


# -- the cache-aware admission order ----------------------------------------------
# One seat; r0 (a prefix block, label 7) is admitted and runs; then r1 (cold)
# and r2 (warm: r0's block) wait for the seat. Usage: r0 holds 2 of 4 blocks.

def spec_waiting_after_a_call(profile: str, window: int = 2, threshold: float = 0.0) -> tuple[int, ...]:
    cfg = Config(num_stages=2, max_num_batched_tokens=4, max_num_seqs=1, block_size=2, num_blocks=4,
                 max_model_len=6, prefix_caching=True, cache_aware_admission_window=window,
                 cache_aware_admission_threshold=threshold, profile=profile)
    state = step(initial_state(3, cfg.num_blocks), cfg, Arrive(0, Prompt(3, 2, (7,))))
    state = step(state, cfg, Schedule())
    state = step(state, cfg, Arrive(1, Prompt(2, 2, (9,))))
    state = step(state, cfg, Arrive(2, Prompt(3, 2, (7,))))
    scheduled = schedule(state, cfg)
    assert not any(e.req != 0 for e in scheduled.entries)    # no seat: nobody admitted, the order stays
    return scheduled.state.waiting


def reference_waiting_after_a_call(profile: str, window: int = 2, threshold: float = 0.0) -> list[str]:
    scheduler = Scheduler(SchedulerConfig(max_num_batched_tokens=4, max_num_seqs=1, max_model_len=6,
                                          block_size=2, num_blocks=4, enable_prefix_caching=True,
                                          cache_aware_admission_window=window,
                                          cache_aware_admission_threshold=threshold, profile=profile))
    prefix = [5, 6]
    scheduler.add_request(Request("r0", [*prefix, 11], SamplingParams(max_tokens=2)))
    scheduler.schedule()
    scheduler.add_request(Request("r1", [20, 21], SamplingParams(max_tokens=2)))
    scheduler.add_request(Request("r2", [*prefix, 12], SamplingParams(max_tokens=2)))
    assert all(e.req_id == "r0" for e in scheduler.schedule().entries)
    return [r.request_id for r in scheduler.waiting]


@pytest.mark.parametrize(("profile", "window", "threshold", "order"), [
    ("vllm-0.34", 2, 0.0, (2, 1)),          # the warm request moves ahead
    ("vllm-0.34", 2, 0.5, (2, 1)),          # usage 2/4 reaches 0.5
    ("vllm-0.34", 2, 0.75, (1, 2)),         # ... but not 0.75
    ("vllm-0.34", 1, 0.0, (1, 2)),          # a window of one moves nothing
    ("vllm-0.34", 0, 0.0, (1, 2)),          # off
    ("vllm-0.34-async", 2, 0.0, (2, 1)),
    ("vllm-0.33", 2, 0.0, (1, 2)),          # 0.33 has no such knob: FCFS
])
def test_the_cache_aware_window_moves_a_warm_request_ahead(profile: str, window: int, threshold: float,
                                                          order: tuple[int, int]) -> None:
    assert spec_waiting_after_a_call(profile, window, threshold) == order
    assert reference_waiting_after_a_call(profile, window, threshold) == [f"r{r}" for r in order]


def test_a_preempted_request_keeps_its_slot_in_the_reorder() -> None:
    from collections import deque

    from flightcheck.reference.admission_order import reorder_by_cached_prefix
    from flightcheck.reference.kv_cache_manager import KVCacheManager

    kv = KVCacheManager(4, 2, True)
    warm = Request("warm", [5, 6, 7], SamplingParams(max_tokens=2))
    holder = Request("holder", [5, 6, 8], SamplingParams(max_tokens=2))
    assert kv.allocate_slots(holder, 3) is not None      # caches block [5, 6]
    cold, preempted = (Request(name, [30 + i, 40 + i], SamplingParams(max_tokens=2))
                       for i, name in enumerate(("cold", "preempted")))
    preempted.status = RequestStatus.PREEMPTED
    waiting = deque([cold, preempted, warm])
    reorder_by_cached_prefix(waiting, kv, window=3, threshold=0.0)
    assert [r.request_id for r in waiting] == ["warm", "preempted", "cold"]


# -- the explicit search ----------------------------------------------------------

# (states, edges, max depth) -- change only with a reviewed change of semantics.
PINNED = {UNCHUNKED_K2.name: (248, 385, 11), CACHE_AWARE_K2.name: (366, 699, 10)}


@pytest.mark.parametrize("model", ADMISSION_MODELS, ids=lambda m: m.name)
def test_the_admission_models_violate_nothing(model) -> None:
    result = explicit.search(model)
    assert result.complete and (result.num_states, result.num_edges, result.max_depth) == PINNED[model.name]
    # targets a two-request model cannot reach are not violations
    broken = [v.property for v in result.violations if v.path]
    assert not broken
    assert all(result.liveness.values())


def schedule_edges(model) -> set:
    """The reachable schedule steps of `model`: (state, next state) pairs."""
    seen, frontier, edges = {initial(model)}, [initial(model)], set()
    while frontier:
        state = frontier.pop()
        for action, nxt in successors(model, state):
            if isinstance(action, Schedule):
                edges.add((state, nxt))
            if nxt not in seen:
                seen.add(nxt)
                frontier.append(nxt)
    return edges


@pytest.mark.parametrize("model", ADMISSION_MODELS, ids=lambda m: m.name)
def test_each_admission_model_tells_0_34_from_0_33(model) -> None:
    assert schedule_edges(model) != schedule_edges(model.under_profile("vllm-0.33"))


def test_z3_leaves_the_admission_knobs_to_the_explicit_search() -> None:
    from flightcheck.verification.z3.encoding.state import Layout
    with pytest.raises(ValueError, match="explicit search"):
        Layout.of(UNCHUNKED_K2)


# -- check-trace and the differential families ------------------------------------

def reference_events(raw: dict, profile: str) -> list[dict]:
    events = run_reference(raw, profile).events
    events[0]["profile"] = profile
    return events


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("profile", ["vllm-0.8.5", "vllm-0.33", "vllm-0.34", "vllm-0.34-async"])
def test_check_trace_accepts_the_reference_on_each_family(family: str, profile: str) -> None:
    for raw in campaign_workloads(5, 6, family=family):
        result = check_events(reference_events(raw, profile))
        assert result.ok, (raw["name"], result.message)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_family_tells_0_34_from_0_33(family: str) -> None:
    differ = [raw["name"] for raw in campaign_workloads(5, 20, family=family)
              if decisions(run_reference(raw, "vllm-0.33").events, block_offset=1)
              != decisions(run_reference(raw, "vllm-0.34").events, block_offset=1)]
    assert differ


def test_a_0_34_trace_of_the_reorder_is_rejected_under_0_33() -> None:
    rejected = []
    for raw in campaign_workloads(5, 20, family="cache-aware"):
        events = reference_events(raw, "vllm-0.34")
        assert events[0]["notes_empty_batches"] is True
        result = check_events(events, profile="vllm-0.33")
        if not result.ok:
            rejected.append(result.property)
    assert rejected and set(rejected) == {"schedule_decision"}


def test_a_family_is_the_seeds_plain_workload_with_its_knobs() -> None:
    plain = campaign_workloads(3, 4)
    assert plain == campaign_workloads(3, 4, family=None)
    for raw in campaign_workloads(3, 4, family="unchunked"):
        assert raw["config"]["enable_chunked_prefill"] is False
        workload_from_json(raw)
    for raw in campaign_workloads(3, 4, family="cache-aware"):
        assert raw["config"]["cache_aware_admission_window"] > 0
        workload_from_json(raw)


def test_the_workload_format_takes_the_knobs_and_refuses_what_vllm_refuses() -> None:
    base = {"config": {"num_stages": 2, "max_num_batched_tokens": 8, "num_blocks": 10, "max_model_len": 8},
            "requests": [{"prompt_len": 3}]}
    config = workload_from_json(base).config
    assert (config.enable_chunked_prefill, config.cache_aware_admission_window,
            config.cache_aware_admission_threshold) == (True, 0, 0.5)
    knobs = {"enable_chunked_prefill": False, "cache_aware_admission_window": 4,
             "cache_aware_admission_threshold": 0.25}
    config = workload_from_json({**base, "config": {**base["config"], **knobs}}).config
    assert (config.enable_chunked_prefill, config.cache_aware_admission_window,
            config.cache_aware_admission_threshold) == (False, 4, 0.25)
    for bad in ({"enable_chunked_prefill": False, "max_num_batched_tokens": 4},
                {"cache_aware_admission_threshold": 2}, {"cache_aware_admission_window": -1},
                {"enable_chunked_prefill": "no"}):
        with pytest.raises(WorkloadError):
            workload_from_json({**base, "config": {**base["config"], **bad}})


def test_a_trace_config_outside_the_knobs_bounds_is_malformed() -> None:
    raw = campaign_workloads(5, 1, family="cache-aware")[0]
    events = reference_events(raw, "vllm-0.34")
    events[0]["cache_aware_admission_threshold"] = 1.5
    with pytest.raises(MalformedTrace, match="cache_aware_admission_threshold: expected a number from 0 to 1"):
        check_events(events)


# A trace of vLLM 0.34.0's own AsyncScheduler (replayed with the window on,
# campaign seed 1, workload 51 of the cache-aware family): an empty
# schedule() call at engine step 7, while r0 holds 4 of 5 blocks, moved the
# warm r2 ahead of the cold r1; at the next batch r0 had finished and the
# pool was free, so a checker that replays noted empty calls only at the next
# batch reorders nothing there and calls vLLM's admission of r2 wrong.
REORDER_IN_EMPTY_CALL = (Path(__file__).parent / "data" / "vllm" / "traces-0.34"
                         / "cache-aware-async-reorder-in-empty-call.jsonl")


def test_the_reorder_of_a_noted_empty_call_is_taken_when_the_call_was_made() -> None:
    events = read_events(REORDER_IN_EMPTY_CALL.read_text().splitlines())
    assert events[0]["vllm_version"] == "0.34.0" and events[0]["notes_empty_batches"]
    assert check_events(events).ok
    result = check_events(events, profile="vllm-0.33-async")      # FCFS: r1 first
    assert not result.ok and result.property == "schedule_decision"
