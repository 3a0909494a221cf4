"""The reference's `vllm-0.33` profile (reference/profiles.py), one rule per
test on a tiny scenario, each beside what 0.8.5 does there; 0.33's engine
loop (reference/drive.py `VLLM_0_33_LOOP`); check-trace (function and
command) on the reference's 0.33 traces. The refinement fuzzer under the
profile is in tests/test_refinement.py."""

from __future__ import annotations

import io
import random
from collections.abc import Callable

import pytest

from flightcheck.reference import (Engine, ModelRunnerOutput, Request, RequestStatus, SamplingParams,
                                   Scheduler, SchedulerConfig, ScriptedExecutor, TraceWriter,
                                   make_scheduler)
from flightcheck.reference.block_pool import BlockPool
from flightcheck.reference.completion import Fate
from flightcheck.reference.consistency import consistency_errors
from flightcheck.reference.drive import VLLM_0_8_5_LOOP, VLLM_0_33_LOOP
from flightcheck.reference.engine import loop_for_config
from flightcheck.verification.traces.check import check_events, read_events

from . import reference_trace_runs as runs

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

EOS = 2


def config(profile: str = "vllm-0.33", **overrides: object) -> SchedulerConfig:
    knobs: dict[str, object] = dict(max_num_batched_tokens=6, max_num_seqs=4, max_model_len=8,
                                    block_size=2, num_blocks=4, enable_prefix_caching=False,
                                    num_pipeline_stages=3, profile=profile)
    knobs.update(overrides)
    return SchedulerConfig(**knobs)  # type: ignore[arg-type]


def request(name: str, num_prompt: int, max_tokens: int = 8, first: int = 10,
            stop_token_ids: tuple[int, ...] = ()) -> Request:
    return Request(name, list(range(first, first + num_prompt)),
                   SamplingParams(max_tokens=max_tokens, stop_token_ids=stop_token_ids), eos_token_id=EOS)


def scheduled(output) -> list[tuple[str, int, int]]:
    return [(e.req_id, e.num_computed_tokens, e.num_new_tokens) for e in output.entries]


def complete(scheduler: Scheduler, output, tokens: dict[str, int]):
    """Complete `output`, each sampling entry returning its token in `tokens`."""
    returned = {e.req_id: [tokens[e.req_id]] if e.samples else [] for e in output.entries}
    return scheduler.update_from_output(output, ModelRunnerOutput.from_tokens(returned))


# -- the constants ------------------------------------------------------------

def test_the_0_33_profile_names_each_rule_and_0_8_x_has_none_of_them():
    rules = SchedulerConfig(profile="vllm-0.33").version_profile
    assert (rules.unhashed_blocks_to_head and rules.threshold_needs_company and rules.sampled_token_slot == 1
            and rules.full_sequence_admission and rules.stop_tokens_before_length
            and rules.stale_output_counters and rules.flush_finished_every_schedule)
    assert rules.engine_loop == "vllm-0.33" and rules.continue_prefill
    for old in ("vllm-0.8.5", "vllm-0.8.4"):
        profile = SchedulerConfig(profile=old).version_profile
        assert not (profile.unhashed_blocks_to_head or profile.threshold_needs_company
                    or profile.sampled_token_slot or profile.full_sequence_admission
                    or profile.stop_tokens_before_length or profile.stale_output_counters
                    or profile.flush_finished_every_schedule)


def test_0_33_releases_a_table_last_block_first_with_or_without_prefix_caching():
    # SingleTypeKVCacheManager.free reverses the table in both cases (0.8.x: forward without caching).
    assert SchedulerConfig(profile="vllm-0.33", enable_prefix_caching=False).release_order == "reverse"
    assert SchedulerConfig(profile="vllm-0.33", enable_prefix_caching=True).release_order == "reverse"


def test_drop_mode_needs_the_0_33_counters():
    assert SchedulerConfig(profile="vllm-0.33", drop_stale_output=True).drop_stale_output
    with pytest.raises(ValueError, match="drop_stale_output"):
        SchedulerConfig(profile="vllm-0.8.5", drop_stale_output=True)


# -- BlockPool.free_blocks ----------------------------------------------------

def test_unhashed_freed_blocks_go_to_the_head_in_order_and_hashed_ones_to_the_tail():
    pool = BlockPool(6, enable_caching=True, unhashed_blocks_to_head=True)
    blocks = pool.get_new_blocks(4)                       # 0..3; free queue [4, 5]
    pool.cache_block(blocks[1], 111)
    pool.free_blocks([blocks[3], blocks[2], blocks[1], blocks[0]])   # a table, last block first
    assert pool.free_block_ids() == [3, 2, 0, 4, 5, 1]    # unhashed reused first, hashed at the LRU tail
    old = BlockPool(6, enable_caching=True)
    blocks = old.get_new_blocks(4)
    old.cache_block(blocks[1], 111)
    old.free_blocks([blocks[3], blocks[2], blocks[1], blocks[0]])
    assert old.free_block_ids() == [4, 5, 3, 2, 1, 0]     # 0.8.x: every one to the tail


def test_without_caching_every_freed_block_goes_to_the_head():
    pool = BlockPool(5, enable_caching=False, unhashed_blocks_to_head=True)
    blocks = pool.get_new_blocks(3)
    pool.free_blocks(reversed(blocks))
    assert pool.free_block_ids() == [2, 1, 0, 3, 4]


# -- Scheduler.schedule: threshold, clip, admission gate ----------------------

@pytest.mark.parametrize("profile, chunk", [("vllm-0.33", 6), ("vllm-0.8.5", 2)])
def test_the_long_prefill_threshold_binds_only_with_company(profile, chunk):
    scheduler = Scheduler(config(profile, long_prefill_token_threshold=2, max_model_len=16, num_blocks=8))
    scheduler.add_request(request("a", 7))
    assert scheduled(scheduler.schedule()) == [("a", 0, chunk)]
    scheduler.add_request(request("b", 7, first=30))
    assert scheduled(scheduler.schedule()) == [("a", chunk, 1 if chunk == 6 else 2), ("b", 0, 2)]


@pytest.mark.parametrize("profile, num_scheduled", [("vllm-0.33", 1), ("vllm-0.8.5", 2)])
def test_a_running_request_is_clipped_one_short_of_max_model_len(profile, num_scheduled):
    # A decode with one draft at position 6 of max_model_len 8: 0.33 leaves
    # room for the sampled token (max_model_len - num_computed - 1).
    scheduler = Scheduler(config(profile, num_spec_tokens=1))
    scheduler.add_request(request("a", 6))
    first = scheduler.schedule()
    scheduler.update_from_output(first, ModelRunnerOutput.from_tokens({"a": [50]}, {"a": [51]}))
    second = scheduler.schedule()
    assert scheduled(second) == [("a", 6, num_scheduled)]


@pytest.mark.parametrize("profile, admitted", [("vllm-0.33", False), ("vllm-0.8.5", True)])
def test_admission_needs_room_for_the_whole_sequence(profile, admitted):
    # 4 blocks of 2: a holds 2; b's 6-token prompt needs 3 blocks, its first
    # 2-token chunk only one.
    scheduler = Scheduler(config(profile, max_num_batched_tokens=6))
    scheduler.add_request(request("a", 4))
    scheduler.add_request(request("b", 6, first=30))
    assert scheduled(scheduler.schedule()) == [("a", 0, 4), ("b", 0, 2)] if admitted \
        else scheduled(scheduler.schedule()) == [("a", 0, 4)]


# -- check_stop order ---------------------------------------------------------

@pytest.mark.parametrize("profile, reason", [("vllm-0.33", "stop"), ("vllm-0.8.5", "length")])
@pytest.mark.parametrize("stop_token", [EOS, 7])
def test_a_stop_token_sampled_as_the_last_allowed_token_finishes_as_stop_in_0_33(profile, reason, stop_token):
    scheduler = Scheduler(config(profile))
    scheduler.add_request(request("a", 2, max_tokens=1, stop_token_ids=(7,)))
    (out,) = complete(scheduler, scheduler.schedule(), {"a": stop_token})
    assert out.finish_reason == reason


# -- vLLM 0.33's counters: deferral, delivery, drop mode -----------------------

def preempted_with_stale_output(profile: str = "vllm-0.33", drop: bool = False):
    """a (4 tokens) and b (4, in two chunks) fill the 4 blocks; b's second
    chunk is in flight when a's decode needs a block: b is preempted with 2
    stale tokens in flight. c (1 token) waits behind b."""
    scheduler = make_scheduler(config(profile, drop_stale_output=drop),
                               TraceWriter(io.StringIO(), eos_token_id=EOS))
    for name, length, first in (("a", 4, 10), ("b", 4, 30)):
        scheduler.add_request(request(name, length, first=first))
    batch1 = scheduler.schedule()
    assert scheduled(batch1) == [("a", 0, 4), ("b", 0, 2)]
    batch2 = scheduler.schedule()
    assert scheduled(batch2) == [("b", 2, 2)]
    complete(scheduler, batch1, {"a": 50})
    scheduler.add_request(request("c", 1, first=70))
    batch3 = scheduler.schedule()
    assert scheduled(batch3) == [("a", 4, 1)] and batch3.preempted_req_ids == ["b"]
    return scheduler, batch2, batch3


def test_preemption_makes_the_in_flight_tokens_stale():
    scheduler, _, _ = preempted_with_stale_output()
    b = scheduler.requests["b"]
    assert b.status is RequestStatus.PREEMPTED and b.num_computed_tokens == 0
    assert (b.num_in_flight_tokens, b.num_stale_output_tokens, b.drop_stale_output) == (2, 2, False)
    assert scheduler.requests["a"].num_in_flight_tokens == 1


def test_deliver_mode_defers_the_resumption_and_a_later_request_passes_it():
    scheduler, batch2, _ = preempted_with_stale_output()
    batch4 = scheduler.schedule()
    assert scheduled(batch4) == [("c", 0, 1)]                 # b skipped, c admitted past it
    assert [r.request_id for r in scheduler.waiting] == ["b"]  # b kept its place
    assert scheduler.fate_of(batch2.entries[0]) is Fate.ORPHANED
    (out,) = complete(scheduler, batch2, {"b": 60})           # the stale output is delivered
    b = scheduler.requests["b"]
    assert out.new_token_ids == [60] and b.status is RequestStatus.PREEMPTED and b.num_tokens == 5
    assert (b.num_in_flight_tokens, b.num_stale_output_tokens) == (0, 0)
    assert not consistency_errors(scheduler)


def test_0_8_5_resumes_at_once_and_keeps_fcfs():
    scheduler, batch2, _ = preempted_with_stale_output("vllm-0.8.5")
    # b, at the head, does not fit (1 block free, it needs 2): c waits behind it.
    assert scheduled(scheduler.schedule()) == []
    assert [r.request_id for r in scheduler.waiting] == ["b", "c"]


def test_drop_mode_resumes_at_once_and_discards_the_stale_output():
    scheduler, batch2, _ = preempted_with_stale_output(drop=True)
    b = scheduler.requests["b"]
    assert b.drop_stale_output and not scheduler._is_resumption_deferred(b)
    assert scheduled(scheduler.schedule()) == []                # b heads the queue (no room): no skip
    assert scheduler.fate_of(batch2.entries[0]) is Fate.SUPERSEDED
    assert complete(scheduler, batch2, {"b": 60}) == []         # discarded
    assert b.num_tokens == 4 and (b.num_in_flight_tokens, b.num_stale_output_tokens) == (0, 0)


def test_an_output_is_looked_up_by_id_but_an_older_request_of_the_id_is_not_bound_to_the_new_one():
    scheduler = Scheduler(config(max_num_batched_tokens=8))
    scheduler.add_request(request("r0", 4))
    old = scheduler.schedule()
    scheduler.finish_requests("r0", RequestStatus.FINISHED_ABORTED)
    scheduler.add_request(request("r0", 3, first=40))          # the id reused, old batch in flight
    new = scheduler.schedule()
    assert scheduled(new) == [("r0", 0, 3)]
    assert complete(scheduler, old, {"r0": 99}) == []           # dropped: vLLM would append it
    reused = scheduler.requests["r0"]
    assert reused.num_tokens == 3 and reused.num_in_flight_tokens == 3
    (out,) = complete(scheduler, new, {"r0": 51})
    assert out.new_token_ids == [51] and reused.num_in_flight_tokens == 0


def test_finished_ids_travel_with_an_empty_batch_in_0_33():
    for profile, carried in (("vllm-0.33", {"a"}), ("vllm-0.8.5", set())):
        scheduler = Scheduler(config(profile))
        scheduler.add_request(request("a", 2, max_tokens=1))
        complete(scheduler, scheduler.schedule(), {"a": 50})
        assert scheduler.has_requests() and not scheduler.has_unfinished_requests()
        empty = scheduler.schedule()
        assert empty.is_empty and empty.finished_req_ids == carried
        assert scheduler.has_requests() is (profile != "vllm-0.33")


# -- EngineCore.step_with_batch_queue of 0.33 ---------------------------------

def test_the_0_33_engine_queues_empty_batches_and_steps_while_batches_are_in_flight():
    scheduler = Scheduler(config(max_num_batched_tokens=8, num_blocks=8, max_model_len=16))
    engine = Engine(scheduler, ScriptedExecutor())
    assert engine.loop is VLLM_0_33_LOOP and loop_for_config(scheduler.config) is VLLM_0_33_LOOP
    assert loop_for_config(SchedulerConfig()) is VLLM_0_8_5_LOOP
    scheduler.add_request(request("a", 4, max_tokens=2))
    assert engine.step() is None and engine.num_in_flight_batches == 1    # a's prefill
    # a waits for its token: the next call schedules an empty batch, which takes a slot.
    assert engine.step() is None
    assert engine.num_in_flight_batches == 2 and engine.num_token_batches_in_flight == 1
    assert engine.batch_queue[1][0].is_empty
    # The queue (3 deep) is full after a third: that call completes the oldest, a's prefill.
    outputs = engine.step()
    assert [o.request_id for o in outputs] == ["a"] and engine.num_in_flight_batches == 2
    # Completing the empty batch changes nothing and returns None.
    assert engine.step() is None
    rest = engine.run(max_steps=100)
    assert [o.finish_reason for o in rest if o.finished] == ["length"]
    assert engine.num_in_flight_batches == 0 and engine.num_submitted_batches == 2


def test_a_0_33_run_with_preemptions_and_aborts_ends_with_every_request_finished():
    lines = drive_0_33(seed=3, prefix_caching=True)
    assert lines[-1] == '{"ev":"end"}'


# -- check-trace on the reference's 0.33 traces --------------------------------

def drive_0_33(seed: int, prefix_caching: bool, drop: bool = False,
               after_action: Callable[[Engine], None] | None = None) -> list[str]:
    """A seeded run of the golden runs' shape under 0.33 (arrivals with shared
    prefixes, aborts, names reused after an abort, drafts, EOS and stop ids),
    every step the 0.33 engine's own; no outside finish (the spec has none).
    `after_action` sees the engine after every action."""
    rng = random.Random(seed)
    base = runs.config_for(True, seed, "vllm-0.33", prefix_caching)
    cfg = SchedulerConfig(**{**base.__dict__, "drop_stale_output": drop, "continue_prefill": None})
    sink = io.StringIO()
    scheduler = make_scheduler(cfg, TraceWriter(sink, eos_token_id=runs.EOS))
    engine = Engine(scheduler, ScriptedExecutor(runs._sample))
    names: list[str] = []
    for action in range(runs.NUM_ACTIONS):
        roll = rng.random()
        if roll < 0.3 and len(names) < 30:
            runs._arrive(engine, rng, names)
        elif roll < 0.36 and names:
            engine.abort_request(rng.choice(names + ["nobody"]))
        elif roll < 0.45 and names:
            name = rng.choice(names)
            if name not in scheduler.requests:
                engine.add_request(Request(name, [*runs.PREFIXES[0][:4], action],
                                           SamplingParams(max_tokens=3), eos_token_id=runs.EOS))
        else:
            engine.step()
        if after_action is not None:
            after_action(engine)
    engine.run(max_steps=2000)
    scheduler.trace.end()
    return sink.getvalue().splitlines()


@pytest.mark.parametrize("prefix_caching", [True, False])
@pytest.mark.parametrize("seed", range(6))
def test_check_trace_accepts_the_reference_0_33_traces_under_the_0_33_profile(seed, prefix_caching):
    lines = drive_0_33(seed, prefix_caching)
    incremental = check_events(read_events(lines), profile="vllm-0.33")
    full = check_events(read_events(lines), profile="vllm-0.33", full=True)
    assert incremental.ok, incremental.to_json()
    assert full.to_json() == incremental.to_json()


def test_the_same_traces_are_rejected_under_0_8_5_rules():
    rejected = [seed for seed in range(6)
                if not check_events(read_events(drive_0_33(seed, False)), profile="vllm-0.8.5").ok]
    assert rejected, "no 0.33 trace told apart from 0.8.5's rules"


def counter_errors(engine: Engine) -> list[str]:
    """The invariants on vLLM 0.33's counters (docs/profiles.md §"Invariants per profile"), against the batches in
    flight: IF1 `num_in_flight_tokens` = the tokens of the request's entries
    in flight (its own: not an older request's of the same id); IF2 the stale
    share = those scheduled before its last preemption, 0 <= stale <=
    in-flight; IF3 a RUNNING request has no deliver-mode stale share."""
    errors = []
    entries = [e for output, _ in engine.batch_queue for e in output.entries]
    for request in engine.scheduler.requests.values():
        own = [e for e in entries if e.req_id == request.request_id
               and e.incarnation >= request.first_incarnation]
        in_flight = sum(e.num_new_tokens for e in own)
        stale = sum(e.num_new_tokens for e in own if e.incarnation < request.incarnation)
        if request.num_in_flight_tokens != in_flight:
            errors.append(f"{request.request_id}: num_in_flight_tokens {request.num_in_flight_tokens}, "
                          f"entries in flight {in_flight}")
        if request.num_stale_output_tokens != stale or not 0 <= stale <= in_flight:
            errors.append(f"{request.request_id}: stale {request.num_stale_output_tokens}, "
                          f"entries of earlier incarnations {stale}")
        if request.status is RequestStatus.RUNNING and request.num_stale_output_tokens \
                and not request.drop_stale_output:
            errors.append(f"{request.request_id}: RUNNING with a deliver-mode stale share")
    return errors


@pytest.mark.parametrize("drop", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_the_counters_equal_the_batches_in_flight_after_every_action(seed, drop):
    found: list[str] = []

    def check(engine: Engine) -> None:
        found.extend(counter_errors(engine))

    lines = drive_0_33(seed, seed % 2 == 0, drop=drop, after_action=check)
    assert lines[-1] == '{"ev":"end"}'
    assert not found, found[:5]


# -- the command line ---------------------------------------------------------

def test_flightcheck_check_trace_accepts_a_reference_0_33_trace_with_profile_vllm_0_33(tmp_path):
    import json
    import subprocess
    import sys
    path = tmp_path / "ref-033.jsonl"
    path.write_text("\n".join(drive_0_33(2, True)) + "\n")
    proc = subprocess.run([sys.executable, "-m", "flightcheck.cli", "check-trace", str(path),
                           "--profile", "vllm-0.33", "--json"], capture_output=True, text=True, timeout=120)
    out = json.loads(proc.stdout)
    assert proc.returncode == 0 and out["ok"] and out["profile"] == "vllm-0.33", proc.stdout + proc.stderr
