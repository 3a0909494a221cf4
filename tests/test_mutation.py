"""Machine-made mutants (verification/refinement/mutation.py): generated
with stable keys, applied in-process and undone, killed by the fuzzer when
they change behaviour; the triage file names only mutants that exist."""

from __future__ import annotations

from pathlib import Path

import pytest

from flightcheck.reference.scheduler import Scheduler
from flightcheck.verification.refinement.mutation import (
    MODULES,
    TARGETS,
    MutantResult,
    applied,
    baseline_failures,
    mutants_of,
    read_record,
    read_triage,
    run_mutant,
    score,
    settings_line,
)

from .fixtures import load_benchmark

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

# The runs the mutation score makes for each seed (benchmarks/mutation_score.py
# DEFAULT_PROFILES): the default run, then each 0.33 profile pinned.
SCORED_RUNS: tuple[str | None, ...] = (None, "vllm-0.33", "vllm-0.33-async")


def _mutant(key: str):
    path = next(p for p in MODULES if p.endswith(key.split("::")[0]))
    return next(m for m in mutants_of(path) if m.key == key)


def test_every_target_file_yields_mutants_with_unique_keys():
    for path in TARGETS:
        keys = [m.key for m in mutants_of(path)]
        assert keys and len(keys) == len(set(keys))


def test_a_mutant_is_in_force_only_inside_its_block():
    mutant = _mutant("scheduler.py::Scheduler._clip::Sub->Add#1")
    original = Scheduler._clip.__code__
    with applied(mutant):
        assert Scheduler._clip.__code__ is not original
    assert Scheduler._clip.__code__ is original
    assert "-" in mutant.diff and "+" in mutant.diff and "max_model_len +" in mutant.diff


def test_the_issues_survivors_are_killed_at_the_ci_budget():
    """Issue 23's survivors that change behaviour: the length clip, a
    `continue` turned `break` in finish_requests (several aborts at once, an
    unknown id first) and after an entry that sampled nothing; with the
    runs the mutation score makes (the default run, then vllm-0.33, then
    vllm-0.33-async, per seed). The last `continue` → `break` is killed by
    seed 0's vllm-0.33 run; the default run alone kills it from seed 0 at
    step 2,838 (docs/fuzzing.md, "The simplest draws")."""
    for key in ("scheduler.py::Scheduler._clip::Sub->BitXor#1",
                "scheduler.py::Scheduler.finish_requests::continue->break#1",
                "update.py::OutputUpdate.update_from_output::continue->break#2",
                "completion.py::append_sampled::Is->IsNot#1"):
        result = run_mutant(_mutant(key), 2_000, [0, 1], profiles=SCORED_RUNS)
        assert result.status == "killed", key


def test_the_preallocation_of_vllm_0_8_4_is_driven_at_the_ci_budget():
    """0.8.4's preallocation runs only under its profile, which now has a
    share of every run: its mutants that take no preallocation, too little,
    or too much at the per-request cap are killed (Add->BitOr, which differs
    only when the sum binds, still survives: docs/fuzzing.md). Two of them
    here (none taken, the cap); the mutation score runs them all."""
    for key in ("kv_cache_manager.py::KVCacheManager._with_preallocation::Not->drop#1",
                "kv_cache_manager.py::KVCacheManager._with_preallocation::Sub->Add#1"):
        result = run_mutant(_mutant(key), 2_000, [0, 1])
        assert result.status == "killed", key


def test_the_preallocation_survivor_falls_to_a_run_pinned_to_vllm_0_8_4():
    """`_with_preallocation`'s `+` → `|` survives the score's runs, which
    give 0.8.4 222 of each seed's 2,000 steps; a run with every step under
    0.8.4 kills it (seed 2 at step 543, seed 0 at 1,246): it changes
    behaviour, and the fuzzer reaches it given the steps. (Step 443 before
    the 0.8.4 profiles' `demands_blocks_past_max_model_len`: a request whose
    drafts past max_model_len cannot have their blocks is now preempted, not
    scheduled clipped, which moves seed 2's run; the unmutated reference
    still passes it.)"""
    result = run_mutant(_mutant("kv_cache_manager.py::KVCacheManager._with_preallocation::Add->BitOr#1"),
                        2_000, [2], profiles=("vllm-0.8.4",))
    assert (result.status, result.steps) == ("killed", 543), result


def test_the_triage_names_only_existing_mutants_and_functions():
    triage = read_triage()
    mutants = [m for path in MODULES for m in mutants_of(path)]
    assert set(triage.equivalent) <= {m.key for m in mutants}
    assert set(triage.out_of_scope) <= {m.function for m in mutants}
    assert all(reason.strip() for reason in [*triage.equivalent.values(),
                                             *triage.out_of_scope.values()])


def test_score_counts_timeouts_as_kills_and_leaves_triaged_mutants_out():
    mutant = _mutant("scheduler.py::Scheduler._clip::Sub->Add#1")
    results = [MutantResult(mutant, s) for s in ("killed", "timeout", "survived", "equivalent")]
    assert score(results)["score"] == round(2 / 3, 4)


def test_the_unmutated_reference_passes_every_run_the_score_makes():
    """A score is only meaningful if the runs pass on the reference as it is
    (a failing run would "kill" every mutant): the default run, vllm-0.33's
    and vllm-0.33-async's."""
    assert baseline_failures(2_000, [0], (None, "vllm-0.33", "vllm-0.33-async")) == []


def test_a_mutant_only_vllm_0_33_tells_apart_is_killed_by_its_run():
    """The release-order default (reverse with caching, forward without) is
    what both 0.8.x profiles pass, so a run under them cannot see a mutant
    that ignores the order passed; vllm-0.33 reverses without caching, so
    its pinned run kills it, and so does the default run, in its 0.33 part
    (the default run drives every profile: fuzz.py `profile_steps`)."""
    mutant = _mutant("kv_cache_manager.py::KVCacheManager.__init__::Is->IsNot#1")
    assert run_mutant(mutant, 2_000, [0, 1],
                      profiles=("vllm-0.8.5", "vllm-0.8.4")).status == "survived"
    assert run_mutant(mutant, 2_000, [0, 1], profiles=("vllm-0.33",)).status == "killed"
    by_default = run_mutant(mutant, 2_000, [0, 1], profiles=(None,))
    assert by_default.status == "killed"
    assert 1_334 + 222 < by_default.steps <= 1_334 + 2 * 222, by_default   # the 0.33 part


def test_the_profiles_set_the_two_flags_of_0_33s_waiting_loop_alike():
    """The one waiting loop (`Scheduler._schedule_waiting`) reads 0.33's two
    rules as separate constants: the deferred resumption (from the
    `stale_output_counters`) and the whole-sequence gate
    (`full_sequence_admission`). Every profile sets them alike, as vLLM's
    releases do (0.33 both, 0.8.x neither), so no run mixes them in a way no
    vLLM version shipped; a profile that does is new ground for the triage
    of `_schedule_waiting`'s mutants (docs/mutation-equivalents.toml)."""
    from flightcheck.reference.profiles import PROFILES
    assert {(p.stale_output_counters, p.full_sequence_admission) for p in PROFILES.values()} \
        <= {(True, True), (False, False)}


def test_the_fuzzer_checks_has_requests_and_the_predicted_fate_under_0_33():
    """`has_requests()` (what vLLM 0.33's engine schedules on: unfinished
    requests or finished ids not yet carried to the workers) and `fate_of`
    (a drop-mode orphan's output discarded) are checked against the spec's
    statuses and counters at every step."""
    for key in ("scheduler.py::Scheduler.has_requests::Or->And#1",
                "update.py::OutputUpdate._predicted_fate::Is->IsNot#1"):
        result = run_mutant(_mutant(key), 2_000, [0, 1], profiles=(None, "vllm-0.33"))
        assert result.status == "killed", key


def test_the_async_placeholder_invariant_the_triage_rests_on(monkeypatch):
    """Seven async mutants are triaged equivalent on one invariant (docs/
    mutation-equivalents.toml): under vllm-0.33-async a running request with
    placeholders has num_computed_tokens == num_tokens + placeholders - 1, so
    its running count is never <= 0, and a live output's placeholders are
    still all counted when it settles (>= 1 + the drafts it rejects, >= the
    tokens it returns). Checked at every call of the steps the mutants sit in,
    over an async fuzz run that reaches each of them."""
    from flightcheck.verification.refinement.fuzz import fuzz
    reached = {"schedule with placeholders": 0, "rejections settled": 0, "tokens settled": 0}
    schedule = Scheduler.schedule
    count = Scheduler._num_new_tokens_running
    settle_rejected = Scheduler._settle_rejected_placeholders
    settle = Scheduler._settle_placeholders

    def checked_schedule(self: Scheduler):
        for request in self.running:
            placeholders = request.num_output_placeholders
            if placeholders > 0:
                reached["schedule with placeholders"] += 1
                assert request.num_computed_tokens == (
                    len(request.all_token_ids) + placeholders - 1), request.request_id
        return schedule(self)

    def checked_count(self: Scheduler, request, token_budget: int) -> int:
        assert (len(request.all_token_ids) + len(request.spec_token_ids)
                + request.num_output_placeholders - request.num_computed_tokens) > 0
        return count(self, request, token_budget)

    def checked_settle_rejected(self: Scheduler, request, num_rejected: int) -> None:
        reached["rejections settled"] += 1
        assert request.num_output_placeholders >= 1 + num_rejected >= 2
        settle_rejected(self, request, num_rejected)

    def checked_settle(self: Scheduler, request, num_returned: int) -> None:
        if num_returned > 0:
            reached["tokens settled"] += 1
            assert request.num_output_placeholders >= num_returned
        settle(self, request, num_returned)

    monkeypatch.setattr(Scheduler, "schedule", checked_schedule)
    monkeypatch.setattr(Scheduler, "_num_new_tokens_running", checked_count)
    monkeypatch.setattr(Scheduler, "_settle_rejected_placeholders", checked_settle_rejected)
    monkeypatch.setattr(Scheduler, "_settle_placeholders", checked_settle)
    result = fuzz(1_000, 1, shrink=False, profile="vllm-0.33-async")
    assert not result.failed, result.failure
    assert all(reached.values()), reached


def test_the_whole_sequence_check_is_asked_of_tableless_requests_that_need_a_block(monkeypatch):
    """Three fits_whole_sequence mutants are triaged equivalent (docs/
    mutation-equivalents.toml) on two facts, checked at every call over a
    vllm-0.33 fuzz run: the request asked about holds no table, and it
    needs at least one block beyond its hit (its hit stops a token short of
    its sequence, which is at most max_model_len), so `max(0, needed)` and
    `max(1, needed)` agree."""
    from flightcheck.reference.kv_cache_manager import KVCacheManager
    from flightcheck.verification.refinement.fuzz import fuzz
    fits = KVCacheManager.fits_whole_sequence
    calls = []

    def checked_fits(self: KVCacheManager, request, new_computed_blocks, max_model_len: int) -> bool:
        assert not self.req_to_blocks.get(request.request_id), request.request_id
        assert request.num_tokens <= max_model_len, request.request_id
        whole = -(-min(request.num_tokens, max_model_len) // self.block_size)
        calls.append(whole - len(new_computed_blocks))
        assert calls[-1] >= 1, (request.request_id, calls[-1])
        return fits(self, request, new_computed_blocks, max_model_len)

    monkeypatch.setattr(KVCacheManager, "fits_whole_sequence", checked_fits)
    for profile in ("vllm-0.33", "vllm-0.33-async"):
        result = fuzz(1_000, 1, shrink=False, profile=profile)
        assert not result.failed, result.failure
    assert calls and min(calls) == 1, (len(calls), min(calls, default=None))


def test_a_record_gives_only_kills_and_only_for_unchanged_functions(tmp_path):
    """--reuse: a saved output's kills, timeouts and survivors are read, and
    the runs it made (a survivor is taken only from a record of the same
    runs: an added run could kill it)."""
    record = tmp_path / "record.txt"
    record.write_text(
        "killed       scheduler.py::Scheduler._clip::Gt->Lt#1                seed 0, 100 steps\n"
        "killed       scheduler.py::Scheduler._clip::0->1#1                  seed 1, 3 steps (recorded)\n"
        "timeout      scheduler.py::Scheduler._schedule_running::Add->BitOr#2\n"
        "survived     scheduler.py::Scheduler._predicted_fate::IsNot->Is#1\n"
        "equivalent   scheduler.py::Scheduler._clip::Gt->GtE#1\n"
        "-            if x > y:\n"
        "\n# 2000 steps, seeds [0, 1], runs ['default', 'vllm-0.33']: {'killed': 2}; 9 s\n")
    recorded = read_record(record)
    assert recorded.kills == {
        "scheduler.py::Scheduler._clip::Gt->Lt#1": ("killed", 0, 100),
        "scheduler.py::Scheduler._clip::0->1#1": ("killed", 1, 3),
        "scheduler.py::Scheduler._schedule_running::Add->BitOr#2": ("timeout", None, None)}
    assert recorded.survivors == {"scheduler.py::Scheduler._predicted_fate::IsNot->Is#1"}
    assert recorded.settings == settings_line(2_000, [0, 1], (None, "vllm-0.33"))
    # Comments and layout aside, a file's functions are the same as themselves.
    from flightcheck.verification.refinement.mutation import function_sources
    sources = function_sources("reference/scheduler.py")
    assert "Scheduler._clip" in sources and "Scheduler._is_async_skipped" in sources


ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(("argv", "message"), [
    (["--seeds", "x,1"], "--seeds: not an integer"),
    (["--seeds", ","], "at least one entry"),
    (["--steps", "0"], "must be at least 1"),
    (["--profiles", "vllm-9.9"], "unknown profile 'vllm-9.9'"),
    (["--reuse", "no-such-record.txt", "--reuse-commit", "HEAD"], "--reuse: no such file"),
    (["--reuse", str(ROOT / "docs/results/mutation-score.txt"), "--reuse-commit", "0" * 40],
     "git cannot show the reference there"),
])
def test_the_mutation_score_refuses_bad_arguments_in_one_line(argv, message, capsys):
    """Refused before any mutant runs: argparse's exit 2 and one line saying why."""
    with pytest.raises(SystemExit) as exit_:
        load_benchmark("mutation_score").main(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
