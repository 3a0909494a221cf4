"""The spec's mutants, as patches: each is a small named edit of the spec
function (or the few functions) it alters, with where the bug comes from and
what kills it (the property, and the length of the shortest counterexample
`flightcheck verify --json` reports).

An edit reads `_edit("schedule._preempt", OLD, NEW)`: in spec/schedule.py's
`_preempt`, the one piece of code OLD becomes NEW. OLD and NEW are an
expression, a keyword argument (`num_computed=0`, no spaces around `=`) or
statements; OLD is matched as code, so a reworded docstring or comment, or a
re-wrapped line, leaves the edit applying; a change to the code it edits
makes it fail loudly (patch.py, `MutantNoLongerApplies`). NEW may use only
the names the edited module has.

A historical mutant is a bug some vLLM version had; a synthetic one exists
to show that one property carries weight (tests/test_property_weight.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import FunctionType
from typing import Literal

from flightcheck.verification.mutants.patch import Edit, edited_functions

# The spec modules a mutant may edit functions of, by the short name a
# target is written with ("schedule._add_entry").
SPEC_MODULES: dict[str, str] = {
    "schedule": "flightcheck.spec.schedule",
    "actions": "flightcheck.spec.actions",
    # the KV connector (kv_connector.py's mutants): its waiting loop, its
    # fence and holds, its reports, and the reports the explicit search's
    # environment makes (a fabricated connector edits those)
    "kv_loads": "flightcheck.spec.kv_loads",
    "kv_fence": "flightcheck.spec.kv_fence",
    "kv_reports": "flightcheck.spec.kv_reports",
    # structured output (grammar.py's mutants)
    "grammar": "flightcheck.spec.grammar",
    "search": "flightcheck.verification.explicit.search",
    # the priority policy (priority.py's mutants)
    "priority": "flightcheck.spec.priority",
    # streaming sessions (sessions.py's mutants)
    "sessions": "flightcheck.spec.sessions",
    # reset and pause (reset_pause.py's mutants)
    "reset_pause": "flightcheck.spec.reset_pause",
    # the prefill cadence (cadence.py's mutants)
    "cadence": "flightcheck.spec.cadence",
    # LoRA's cap and the prompt-logprobs limit (lora.py's mutants edit schedule.py)
    "lora": "flightcheck.spec.lora",
}


@dataclass(frozen=True)
class Mutant:
    name: str
    kind: Literal["historical", "synthetic"]
    history: str                    # where the bug comes from, what the edit does and what broke
    edits: tuple[Edit, ...]         # applied in order; several may edit one function
    killed_by: str                  # the property its shortest counterexample breaks
    shortest: int                   # that counterexample's length, in steps
    profile: str | None = None      # the one profile it is hunted under; None: every profile

    @property
    def targets(self) -> list[str]:
        """The spec functions it edits, "module.function", in the order first edited."""
        return list(dict.fromkeys(target_of(e) for e in self.edits))

    def edits_of(self, target: str) -> tuple[Edit, ...]:
        """Its edits of the spec function `target` ("module.function")."""
        return tuple(e for e in self.edits if target_of(e) == target)

    @property
    def replaces(self) -> dict[str, FunctionType]:
        """The functions it edits, "module.function" -> a function object of
        its own with the edits made (the spec's own untouched): for reading."""
        return {target: edited_functions(self.name, self.edits_of(target))[0] for target in self.targets}


def target_of(edit: Edit) -> str:
    """The spec function an edit edits, as a target is written: "schedule._preempt"."""
    return f"{edit.module.rsplit('.', 1)[1]}.{edit.function}"


def _edit(target: str, old: str, new: str) -> Edit:
    module, function = target.split(".")
    return Edit(SPEC_MODULES[module], function, old, new)


def _mutant(name: str, kind: Literal["historical", "synthetic"], history: str, *edits: Edit,
            killed_by: str, shortest: int, profile: str | None = None) -> Mutant:
    return Mutant(name, kind, history, edits, killed_by, shortest, profile)


HISTORICAL: tuple[Mutant, ...] = (
    _mutant("advance_at_completion", "historical",
            "num_computed advanced when the output returns while prefill continues: "
            "double scheduling, what scheduled_req_ids prevented (#15307). The counter is not "
            "moved at schedule time, so the next batch schedules the same tokens again",
            _edit("schedule._advance_counter",
                  "state.with_request(e.req, num_computed=state.requests[e.req].num_computed + e.n)",
                  "state"),
            _edit("actions._settle_live", "return state", """
                  req = state.requests[e.req]
                  return state.with_request(e.req, num_computed=req.num_computed + e.n)"""),
            killed_by="S3_contiguous_coverage", shortest=2),
    _mutant("shared_snapshot", "historical",
            "one snapshot object per request, overwritten by the next batch while the previous "
            "one is in flight (CachedRequestData reused before vLLM 0.8.5): the request's live "
            "in-flight entries take the new snapshot's values and return tokens for the wrong range",
            _edit("schedule._launch", "state = count_in_flight(state, step.cfg, e)", """
                  state = count_in_flight(state, step.cfg, e)
                  state = replace(state, in_flight=tuple(
                      tuple(replace(x, start=e.start, n=e.n, samples=e.samples, drafts=e.drafts)
                            if x.req == e.req and x.fate is Fate.LIVE else x for x in b)
                      for b in state.in_flight))"""),
            killed_by="S4_snapshot_immutability", shortest=3),
    _mutant("final_chunk_from_live_counter", "historical",
            "whether a batch samples is decided at completion from the live counter, not from "
            "the batch's snapshot (#13637 design note): with a later chunk already scheduled, an "
            "earlier chunk passes for the final one and samples",
            _edit("actions.entry_samples", "return e.samples", """
                  if e.fate is Fate.LIVE:
                      req = state.requests[e.req]
                      return req.num_computed >= req.num_tokens
                  return e.samples"""),
            killed_by="S5_one_sample_per_prefill", shortest=4),
    _mutant("snapshot_omits_prefix_hit", "historical",
            "the snapshot's start leaves out the prefix-cache hit, so the final chunk looks "
            "partial and its token is dropped: the request hangs (#13637)",
            _edit("schedule._add_entry", "samples = req.num_computed + num_new - drafts >= known", """
                  start = 0 if cached else req.num_computed
                  samples = start + num_new - drafts >= known"""),
            _edit("schedule._add_entry",
                  "ScheduledEntry(r, req.num_computed, num_new, cached, drafts, samples, step.new_blocks)",
                  "ScheduledEntry(r, start, num_new, cached, drafts, samples, step.new_blocks)"),
            killed_by="S3_contiguous_coverage", shortest=7),
    _mutant("rejections_not_subtracted", "historical",
            "spec-decode rejections not subtracted from num_computed: the KV counter runs ahead "
            "of the request's tokens",
            _edit("actions._subtracts_rejections", "fate is Fate.LIVE", "False"),
            killed_by="S8_spec_accounting", shortest=5),
    _mutant("decode_while_token_in_flight", "historical",
            "the num_new_tokens == 0 gate removed: a decode is scheduled while the previous "
            "token is still in flight",
            _edit("schedule._num_new_running", "return _clip(step, r, step.state.num_new_tokens(r))", """
                  num_new = _clip(step, r, step.state.num_new_tokens(r))
                  req = step.state.requests[r]
                  if num_new == 0 and req.num_tokens <= req.num_computed < step.cfg.max_model_len:
                      return 1
                  return num_new"""),
            killed_by="S1_counter_bounds", shortest=3),
    _mutant("stale_output_applied_to_resumed", "historical",
            "the output of a batch scheduled before a preemption is applied by name to the "
            "resumed request (vLLM 0.8.5, PP >= 3): its orphaned entries become live again",
            _edit("schedule._supersede_orphans", "Fate.SUPERSEDED", "Fate.LIVE"),
            killed_by="S13_fates_only_age", shortest=7),
    _mutant("inflight_set_not_cleared_on_preemption", "historical",
            "one-batch-per-request: scheduled_req_ids keeps a preempted request, the "
            "unscheduled count drifts and the engine stops scheduling (vLLM 0.8.1-0.8.4)",
            _edit("schedule._preempt", "state.scheduled_ids - {victim}", "state.scheduled_ids"),
            killed_by="S11_pipeline_depth", shortest=8),
    _mutant("rejections_subtracted_after_reset", "historical",
            "spec-decode rejections of a stale batch subtracted from the counter that "
            "preemption reset (the guard vLLM 0.12.0 added), driving it negative",
            _edit("actions._subtracts_rejections", "fate is Fate.LIVE", "fate in (Fate.LIVE, Fate.ORPHANED)"),
            killed_by="S1_counter_bounds", shortest=9),
)

SYNTHETIC: tuple[Mutant, ...] = (
    _mutant("budget_ignored", "synthetic",
            "the token budget is not charged for running requests: the budget does not clip "
            "a running request, and no entry is charged to it",
            _edit("schedule._num_new_running", "return _clip(step, r, step.state.num_new_tokens(r))", """
                  budget, step.budget = step.budget, step.state.num_new_tokens(r)    # lifted
                  num_new = _clip(step, r, step.state.num_new_tokens(r))
                  step.budget = budget
                  return num_new"""),
            _edit("schedule._add_entry", "step.budget -= num_new", ""),
            killed_by="S10_queues_and_budgets", shortest=5),
    _mutant("max_num_seqs_ignored", "synthetic",
            "admission does not check max_num_seqs",
            _edit("schedule._has_free_seat", "len(step.state.running) < step.cfg.max_num_seqs", "True"),
            killed_by="S10_queues_and_budgets", shortest=3),
    _mutant("threshold_ignored_on_admission", "synthetic",
            "long_prefill_token_threshold is not applied to admissions",
            _edit("schedule._num_new_waiting",
                  "return _clip(step, r, step.state.requests[r].num_tokens - len(hit) * step.cfg.block_size)", """
                  threshold, step.threshold = step.threshold, 0                      # lifted
                  num_new = _clip(step, r, step.state.requests[r].num_tokens - len(hit) * step.cfg.block_size)
                  step.threshold = threshold
                  return num_new"""),
            killed_by="S10_queues_and_budgets", shortest=2),
    _mutant("no_length_cap", "synthetic",
            "max_tokens is not checked after an appended token",
            _edit("actions._stop_reason", """
                  if req.num_output >= req.max_tokens:
                      return Status.FINISHED_LENGTH""", ""),
            killed_by="S2_length_cap", shortest=5),
    _mutant("blocks_not_freed_on_abort", "synthetic",
            "an aborted request keeps its blocks (and its block table): they never return to the pool",
            _edit("actions._finish",
                  "blocks.free_table(state.pool, req.block_table, cfg.release_order, cfg.rules.unhashed_blocks_to_head)",
                  "state.pool if status is Status.FINISHED_ABORTED else "
                  "blocks.free_table(state.pool, req.block_table, cfg.release_order, cfg.rules.unhashed_blocks_to_head)"),
            _edit("actions._finish", "block_table=()",
                  "block_table=req.block_table if status is Status.FINISHED_ABORTED else ()"),
            killed_by="S9_kv_ownership", shortest=3),
    _mutant("admit_after_preemption", "synthetic",
            "admission runs in a step that preempted, so a request can be preempted and "
            "re-admitted in one step",
            _edit("schedule.schedule", "not step.preempted and runs_waiting_loop(state)",
                  "runs_waiting_loop(state)"),
            killed_by="S12_status_monotonicity", shortest=5),
    _mutant("orphan_kept_after_reschedule", "synthetic",
            "a rescheduled request's orphaned entries stay orphaned, bound to a request that is "
            "RUNNING again",
            _edit("schedule._supersede_orphans",
                  "retire_entries(state, r, frozenset({Fate.ORPHANED}), Fate.SUPERSEDED)", "state"),
            killed_by="S7_output_binding", shortest=7),
    _mutant("preempt_keeps_counter", "synthetic",
            "preemption does not reset num_computed, though the KV it counted is freed",
            _edit("schedule._preempt", "num_computed=0", "num_computed=req.num_computed"),
            killed_by="S1_counter_bounds", shortest=5),
    _mutant("preemption_clears_inflight_drafts", "synthetic",
            "in-flight batches alias the request's draft list, which preemption clears",
            _edit("schedule._preempt",
                  "state = retire_entries(state, victim, frozenset({Fate.LIVE}), Fate.ORPHANED)", """
                  state = retire_entries(state, victim, frozenset({Fate.LIVE}), Fate.ORPHANED)
                  state = replace(state, in_flight=tuple(
                      tuple(replace(e, drafts=0) if e.req == victim else e for e in b)
                      for b in state.in_flight))"""),
            killed_by="S4_snapshot_immutability", shortest=8),
    _mutant("empty_batch_submitted", "synthetic",
            "a schedule call that only preempted still enqueues an empty batch, taking a "
            "pipeline slot for nothing",
            _edit("schedule._launch", """
                  if not step.entries and not step.cfg.rules.empty_batches:
                      return state""", ""),
            killed_by="S11_pipeline_depth", shortest=6),
    _mutant("arrival_counter_stale", "synthetic",
            "an arriving request keeps a stale num_computed until admitted",
            _edit("actions.arrive", "num_computed=0", "num_computed=1"),
            killed_by="S1_counter_bounds", shortest=1),
    _mutant("overlapping_chunks", "synthetic",
            "a continuing prefill chunk restarts one token early, recomputing a token already "
            "in flight (when budget and threshold leave room; it is charged for that token too), "
            "and the counter moves to the end of the widened entry",
            _edit("schedule._add_entry",
                  "step.entries.append(ScheduledEntry(r, req.num_computed, num_new, cached, drafts, samples, "
                  "step.new_blocks))", """
                  start, n = req.num_computed, num_new
                  if (step.state.entries_of(r) and step.budget > num_new and start > 0
                          and not 0 < step.cfg.long_prefill_token_threshold <= num_new):
                      start, n = start - 1, num_new + 1
                  step.entries.append(ScheduledEntry(r, start, n, cached, drafts, samples, step.new_blocks))"""),
            _edit("schedule._add_entry", "step.budget -= num_new", "step.budget -= n"),
            _edit("schedule._advance_counter", "state.requests[e.req].num_computed + e.n", "e.start + e.n"),
            killed_by="S3_contiguous_coverage", shortest=3),
    _mutant("stale_drafts_on_prefill_chunk", "synthetic",
            "a prefill chunk's snapshot records a draft, as if the request's old proposal were "
            "still scheduled (drafts may ride only on a sampling entry)",
            _edit("schedule._add_entry", "samples = req.num_computed + num_new - drafts >= known", """
                  samples = req.num_computed + num_new - drafts >= known
                  if not samples and step.cfg.num_spec_tokens:
                      drafts = 1"""),
            killed_by="S5_one_sample_per_prefill", shortest=2),
    _mutant("draft_cap_ignored", "synthetic",
            "the drafter may propose k + 1 drafts",
            _edit("actions.max_next_drafts", "cfg.num_spec_tokens", "cfg.num_spec_tokens + 1"),
            killed_by="S8_spec_accounting", shortest=3),
    _mutant("complete_refuses_orphans", "synthetic",
            "a batch holding an orphaned entry can never be consumed",
            _edit("actions.is_complete_enabled", "bool(state.in_flight)",
                  "bool(state.in_flight) and not any(e.fate is Fate.ORPHANED for e in state.in_flight[0])"),
            killed_by="L3_drain", shortest=6),
    _mutant("schedule_blocked_when_idle", "synthetic",
            "the engine will not schedule while nothing is in flight",
            _edit("schedule.is_schedule_enabled", "len(state.in_flight) >= cfg.queue_depth",
                  "len(state.in_flight) >= cfg.queue_depth or not state.in_flight"),
            killed_by="L2_no_deadlock", shortest=1),
    _mutant("no_block_for_last_token", "synthetic",
            "allocation rounds down, the last partial block is missing",
            _edit("schedule._num_required_blocks", "blocks.cdiv(num_tokens, cfg.block_size)",
                  "num_tokens // cfg.block_size"),
            killed_by="S9_kv_ownership", shortest=2),
)

# Mutants of rules only one profile has (vLLM 0.33's stale-output counters):
# every other profile never calls the functions they edit, so they are
# hunted under that profile only (`flightcheck verify --profile vllm-0.33`),
# on the model `models.mutant_model(name, profile)` names, and kept out of
# MUTANTS (the every-profile set the default run and its golden file hold).
COUNTERS_0_33: tuple[Mutant, ...] = (
    _mutant("resumption_not_deferred", "historical",
            "vLLM 0.33's deferral of a preempted request with stale output in flight left out "
            "(Scheduler.schedule's waiting loop, num_stale_output_tokens): 0.8.5's bug returns, "
            "the request resumes while its old output is in flight and that output is applied "
            "to the running request",
            _edit("schedule._has_stale_output", "req.num_stale != 0 and not req.drop_stale", "False"),
            killed_by="IF3_no_stale_resumption", shortest=10, profile="vllm-0.33"),
    _mutant("drop_leaves_counters", "synthetic",
            "drop mode discards a stale output without settling the request's counters "
            "(Scheduler.update_from_output)",
            _edit("actions._settle_counters", "req = state.requests[r]", """
                  req = state.requests[r]
                  if stale and req.drop_stale:
                      return state"""),
            killed_by="IF1_in_flight_counter", shortest=9, profile="vllm-0.33"),
    _mutant("stale_drained_by_wrong_batch", "synthetic",
            "the stale count is drained by the size of another batch of the request than the one "
            "that completed, its newest still in flight (Scheduler.update_from_output)",
            _edit("actions._settle_counters", "req = state.requests[r]", """
                  req = state.requests[r]
                  newest = [x for b in state.in_flight for x in b if x.req == r]
                  size = newest[-1].n if newest else e.n"""),
            _edit("actions._settle_counters", "num_stale=req.num_stale - e.n if stale else req.num_stale",
                  "num_stale=req.num_stale - size if stale else req.num_stale"),
            killed_by="IF2_stale_counter", shortest=10, profile="vllm-0.33"),
    _mutant("in_flight_kept_without_output", "synthetic",
            "the in-flight counter is not decremented for an entry whose output is empty (a partial "
            "prefill chunk), as if the decrement sat behind update_from_output's skip of requests "
            "without generated tokens",
            _edit("actions._settle_counters", "req = state.requests[r]", """
                  if not e.samples:
                      return state
                  req = state.requests[r]"""),
            killed_by="IF1_in_flight_counter", shortest=3, profile="vllm-0.33"),
    # The hardened variant's two guards against a reused request id
    # (Profile.stale_test, Profile.in_flight_floor): with unique names neither
    # guard ever binds, so these are hunted on the profile's name-reuse
    # model, and killed only by a property the hardened base keeps there
    # (models.NAME_REUSE_MUTANT_MODELS, suite.hunt_mutant_against_base).
    _mutant("stale_tested_by_truthiness", "historical",
            "the waiting loop defers a preempted request while its stale count is truthy "
            "(`num_stale_output_tokens and not drop_stale_output`, vLLM 0.33's Scheduler.schedule) "
            "instead of > 0: a stale count a reused request id drove below 0 never drains, "
            "the request is never resumed and the engine spins on empty batches",
            _edit("schedule._has_positive_stale_output", "req.num_stale > 0", "req.num_stale != 0"),
            killed_by="L1_L3_every_request_can_finish", shortest=7, profile="vllm-0.33-hardened"),
    _mutant("in_flight_below_zero", "historical",
            "update_from_output subtracts an output's tokens from num_in_flight_tokens with no floor "
            "(vLLM 0.33): an old incarnation's output bound through a reused request id drives "
            "the new request's counter below 0",
            _edit("actions._floor_in_flight", "state.with_request(r, num_in_flight=0)", "state"),
            killed_by="IF0_in_flight_never_negative", shortest=5, profile="vllm-0.33-hardened"),
)

# Mutants of vLLM 0.33's asynchronous scheduling (AsyncScheduler: output
# placeholders, the decode stagger, the max_tokens guard), hunted under
# `vllm-0.33-async` only: every other profile keeps the placeholders at 0 and
# the countdown unset, so the functions they edit change nothing there.
ASYNC_0_33: tuple[Mutant, ...] = (
    _mutant("async_rejections_not_settled", "synthetic",
            "rejected drafts are not taken back from num_output_placeholders "
            "(Scheduler.update_from_output's `num_output_placeholders -= num_rejected` left out)",
            _edit("actions._settle_rejected_placeholders",
                  "replace(req, placeholders=req.placeholders - rejected)", "req"),
            killed_by="IA1_placeholders", shortest=6, profile="vllm-0.33-async"),
    _mutant("async_placeholders_kept_on_preemption", "synthetic",
            "Scheduler._preempt_request does not reset num_output_placeholders to 0",
            _edit("schedule._reset_placeholders",
                  "step.state = step.state.with_request(victim, placeholders=0)", ""),
            killed_by="IA1_placeholders", shortest=12, profile="vllm-0.33-async"),
    _mutant("async_stagger_ignored", "synthetic",
            "the running loop's `current_step < next_decode_eligible_step` skip (V2 runner, PP) "
            "left out: decodes of one request closer than pp_size steps",
            _edit("schedule._stagger_pending", "step.state.requests[r].decode_countdown > 0", "False"),
            killed_by="S6p_async_decode_gating", shortest=3, profile="vllm-0.33-async"),
    _mutant("async_max_tokens_guard_off_by_one", "synthetic",
            "the async max_tokens guard reads `num_computed_tokens + 1 - num_output_placeholders` "
            "for `+ 2`: a decode past max_tokens is scheduled",
            _edit("schedule._placeholders_reach_max_tokens", "req.num_computed + 2 - req.placeholders",
                  "req.num_computed + 1 - req.placeholders"),
            killed_by="IA2_placeholders_within_max_tokens", shortest=5, profile="vllm-0.33-async"),
    _mutant("async_decode_on_stale_placeholder", "synthetic",
            "a request preempted and resumed at once (drop mode) counts its stale decodes still in "
            "flight as its own placeholders and schedules decodes on them",
            _edit("schedule._admit", "was_preempted = state.requests[r].status is Status.PREEMPTED", """
                  was_preempted = state.requests[r].status is Status.PREEMPTED
                  stale = sum(1 + e.drafts for e in state.entries_of(r, fate=Fate.ORPHANED) if e.samples)"""),
            _edit("schedule._admit", "num_computed=hit_tokens", "num_computed=hit_tokens, placeholders=stale"),
            killed_by="S5a_async_sampling", shortest=11, profile="vllm-0.33-async"),
)
