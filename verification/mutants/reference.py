"""The reference scheduler's mutants, as patches: each re-introduces one
historical bug (or, where noted, a bug that was only ever a design hazard)
as a small named edit of the one or two `Scheduler` steps it alters
(reference/scheduler.py, and the `update_from_output` steps of
reference/update.py), with its history. They are kept out of `reference/`,
which never asks whether a mutant is on; `patching.reference_applied(name)`
puts one in force for the duration of a run, through the one mechanism every
mutant uses (patch.py: the module recompiled with the edit, the method's code
object swapped, so `Scheduler`, its subclasses and every instance run it).

An edit reads `_edit("scheduler.Scheduler._preempt", OLD, NEW)`: in
reference/scheduler.py's `Scheduler._preempt`, the one piece of code OLD
becomes NEW (README.md, "How to write a mutant"). State a mutant needs of its
own lives in the scheduler instance (`self.__dict__.setdefault(...)` in NEW).

The fuzzer must catch every one (`flightcheck fuzz --mutant NAME`);
tests/test_reference_mutants.py shows each one's damage on a small scenario.
"""

from __future__ import annotations

from flightcheck.verification.mutants.reference_base import REFERENCE_MODULES, ReferenceMutant, _edit, _mutant
from flightcheck.verification.mutants.reference_kv import KV_CONNECTOR

# Read from here by the registry, the tests and the commands (the KV
# connector's mutants and the base live in their own modules).
__all__ = ["REFERENCE_MODULES", "ReferenceMutant", "KV_CONNECTOR"]

ADVANCE_AT_COMPLETION = "advance_at_completion"
SHARED_SNAPSHOT = "shared_snapshot"
FINAL_CHUNK_FROM_LIVE_COUNTER = "final_chunk_from_live_counter"
SNAPSHOT_OMITS_PREFIX_HIT = "snapshot_omits_prefix_hit"
REJECTIONS_NOT_SUBTRACTED = "rejections_not_subtracted"
DECODE_WHILE_TOKEN_IN_FLIGHT = "decode_while_token_in_flight"
STALE_OUTPUT_APPLIED_TO_RESUMED = "stale_output_applied_to_resumed"
INFLIGHT_SET_NOT_CLEARED_ON_PREEMPTION = "inflight_set_not_cleared_on_preemption"
REJECTIONS_SUBTRACTED_AFTER_RESET = "rejections_subtracted_after_reset"
OUTPUT_BOUND_BY_NAME = "output_bound_by_name"

EVERY_PROFILE: tuple[ReferenceMutant, ...] = (
    _mutant(ADVANCE_AT_COMPLETION,
            "num_computed_tokens advanced in update_from_output while prefill "
            "continues: the same tokens are scheduled twice (what scheduled_req_ids "
            "prevented before #15307, v0.8.1-0.8.2)",
            # nothing advances at schedule time ...
            _edit("scheduler.Scheduler._update_after_schedule", """
                  for request, entry in zip(batch.requests, batch.entries):
                      request.num_computed_tokens += entry.num_new_tokens""", ""),
            # ... the counter advances when the batch completes
            _edit("update.OutputUpdate._settle_live", """
                  if self._one_batch_per_request:
                      self.scheduled_req_ids.discard(request.request_id)""", """
                  if self._one_batch_per_request:
                      self.scheduled_req_ids.discard(request.request_id)
                  request.num_computed_tokens += entry.num_new_tokens""")),
    _mutant(SHARED_SNAPSHOT,
            "one mutable CachedRequestData per request, overwritten by the next batch "
            "while the previous one is in flight (vLLM <= 0.8.4 object reuse, #13637 (c))",
            # the snapshot is made by a local maker that overwrites the request's one snapshot
            _edit("scheduler.Scheduler._cached_entry", "CachedRequestData", "shared_snapshot"),
            _edit("scheduler.Scheduler._cached_entry", "num_known = num_new_tokens - num_drafts", """
                  num_known = num_new_tokens - num_drafts

                  def shared_snapshot(*values):
                      from dataclasses import fields
                      fresh = CachedRequestData(*values)
                      entry = self.__dict__.setdefault("shared_snapshots", {}).setdefault(
                          request.request_id, fresh)
                      for field in fields(CachedRequestData):
                          setattr(entry, field.name, getattr(fresh, field.name))
                      return entry"""),
            # the request's snapshot goes when the request does
            _edit("scheduler.Scheduler._free_request", "self.finished_req_ids.add(req_id)", """
                  self.finished_req_ids.add(req_id)
                  self.__dict__.get("shared_snapshots", {}).pop(req_id, None)""")),
    _mutant(FINAL_CHUNK_FROM_LIVE_COUNTER,
            "update_from_output decides whether an entry sampled from the live "
            "request counter, not the batch's snapshot (#13637 design note (d)); "
            "visible with a worker that samples every chunk "
            "(ScriptedExecutor(sample_every_chunk=True), as vLLM <= 0.8.2)",
            _edit("update.OutputUpdate._samples", "return entry.samples", """
                  if fate is Fate.LIVE:
                      return request.num_computed_tokens >= request.num_tokens
                  return entry.samples""")),
    _mutant(SNAPSHOT_OMITS_PREFIX_HIT,
            "the snapshot's num_computed_tokens leaves out the prefix-cache hit: the "
            "final chunk looks partial, its token is dropped, the request hangs "
            "(#13637, 2025-03-14)",
            _edit("scheduler.Scheduler._admit",
                  "self._cached_entry(request, num_hit_tokens, num_new_tokens, 0, new_blocks, resumed=True)",
                  "self._cached_entry(request, 0, num_new_tokens, 0, new_blocks, resumed=True)"),
            _edit("scheduler.Scheduler._admit",
                  "new_request_data(request, num_hit_tokens, num_hit_tokens, num_new_tokens, new_blocks)",
                  "new_request_data(request, 0, num_hit_tokens, num_new_tokens, new_blocks)")),
    _mutant(REJECTIONS_NOT_SUBTRACTED,
            "spec-decode rejections not subtracted from num_computed_tokens "
            "(#13637 (d): 'simply subtracts the number of rejected tokens')",
            _edit("update.OutputUpdate._subtract_rejections", "fate is Fate.LIVE", "False")),
    _mutant(DECODE_WHILE_TOKEN_IN_FLIGHT,
            "the num_new_tokens == 0 skip removed for decodes: one token is scheduled "
            "while the previous sampled token is still in flight (0.8.5 running-loop gate)",
            _edit("scheduler.Scheduler._num_new_tokens_running", """
                  if num_new_tokens > 0:
                      return self._clip(num_new_tokens, num_computed, token_budget)
                  return 0""", """
                  if num_new_tokens > 0:
                      return self._clip(num_new_tokens, num_computed, token_budget)
                  if request.num_tokens <= num_computed < self.config.max_model_len:
                      return 1          # its sampled token is still in flight
                  return 0""")),
    _mutant(STALE_OUTPUT_APPLIED_TO_RESUMED,
            "an output of a batch scheduled before a preemption is applied by name to "
            "the resumed, RUNNING request (vLLM 0.8.5 with PP >= 3; fixed by #20739)",
            _edit("update.OutputUpdate._fate", """
                  if incarnation == request.orphaned_incarnation:
                      return ORPHANED
                  return SUPERSEDED""", """
                  if incarnation == request.orphaned_incarnation:
                      return ORPHANED
                  return LIVE if request.status == RUNNING else SUPERSEDED""")),
    _mutant(INFLIGHT_SET_NOT_CLEARED_ON_PREEMPTION,
            "one-batch-per-request: scheduled_req_ids keeps a request preempted while "
            "in flight, get_num_unscheduled_requests undercounts and the engine stops "
            "scheduling (inferred from vLLM 0.8.1-0.8.4)",
            _edit("scheduler.Scheduler._preempt", "self._drop_in_flight_mark(request, running=False)", "")),
    _mutant(REJECTIONS_SUBTRACTED_AFTER_RESET,
            "spec-decode rejections of an orphaned batch subtracted from the counter "
            "that preemption reset to 0 (the v0.12.0 `num_computed_tokens > 0` guard, #28473)",
            _edit("update.OutputUpdate._subtract_rejections", "fate is Fate.LIVE", "True")),
    _mutant(OUTPUT_BOUND_BY_NAME,
            "an output applied by request name: an aborted id re-added as a new "
            "request gets the old batch's tokens (#42492 / #42523)",
            _edit("update.OutputUpdate._fate", """
                  if incarnation == request.orphaned_incarnation:
                      return ORPHANED
                  return SUPERSEDED""", """
                  if incarnation == request.orphaned_incarnation:
                      return ORPHANED
                  return LIVE if incarnation < request.first_incarnation else SUPERSEDED""")),
)


# Mutants of vLLM 0.33's rules (its stale-output counters and lookup by id):
# under any other profile the steps they edit never run, so they are fuzzed
# under that profile only (`fuzz(..., profile="vllm-0.33")`) and kept out of
# MUTANTS (the every-profile set the 0.8.x kill matrix holds). The first three
# are the reference's counterparts of the spec's mutants of the same names
# (spec.py); the last is vLLM 0.33's own binding, which only a reused id can
# tell from the reference's.
RESUMPTION_NOT_DEFERRED = "resumption_not_deferred"
DROP_LEAVES_COUNTERS = "drop_leaves_counters"
OUTPUT_BOUND_BY_ID_ALONE = "output_bound_by_id_alone"
IN_FLIGHT_KEPT_WITHOUT_OUTPUT = "in_flight_kept_without_output"

COUNTERS_0_33: tuple[ReferenceMutant, ...] = (
    _mutant(RESUMPTION_NOT_DEFERRED,
            "vLLM 0.33's deferral of a preempted request with deliver-mode stale output in "
            "flight left out of the waiting loop (`skip_request`): 0.8.5's bug returns, the "
            "request resumes and its stale output reaches the running request",
            _edit("scheduler.Scheduler._is_resumption_deferred",
                  "bool(request.num_stale_output_tokens) and not request.drop_stale_output", "False"),
            profile="vllm-0.33"),
    _mutant(DROP_LEAVES_COUNTERS,
            "drop mode discards a stale output without settling the request's counters "
            "(`update_from_output`): the in-flight count keeps the dropped batch's tokens and "
            "the stale share never drains",
            _edit("update.OutputUpdate._fate_by_counters",
                  "request.num_in_flight_tokens -= entry.num_new_tokens", """
                  if (entry.incarnation >= request.first_incarnation
                          and request.num_stale_output_tokens > 0 and request.drop_stale_output):
                      return SUPERSEDED     # dropped before the counters are settled
                  request.num_in_flight_tokens -= entry.num_new_tokens"""),
            profile="vllm-0.33"),
    _mutant(IN_FLIGHT_KEPT_WITHOUT_OUTPUT,
            "the counters are not settled for an entry that returns no token (a partial "
            "prefill chunk), as if the decrement sat behind `update_from_output`'s skip of "
            "requests without generated tokens: the in-flight count never drains",
            _edit("update.OutputUpdate._fate_by_counters",
                  "request.num_in_flight_tokens -= entry.num_new_tokens", """
                  if entry.incarnation >= request.first_incarnation and not entry.samples:
                      if request.num_stale_output_tokens > 0:     # judged, counters untouched
                          return SUPERSEDED if request.drop_stale_output else ORPHANED
                      return LIVE
                  request.num_in_flight_tokens -= entry.num_new_tokens"""),
            profile="vllm-0.33"),
    _mutant(OUTPUT_BOUND_BY_ID_ALONE,
            "vLLM 0.33's `update_from_output`: an output looked up by request id alone, with no "
            "incarnation check, so a batch of an aborted request whose id was re-added lands on "
            "the new request, tokens and counters (the id-reuse bug, "
            "docs/vllm-0.33-id-reuse.md); inert with fresh ids",
            _edit("update.OutputUpdate._fate_by_counters", "not self._outputs_by_id_alone", "False"),
            profile="vllm-0.33"),
)

# Mutants of vLLM 0.33's asynchronous scheduling (AsyncScheduler: output
# placeholders, the decode stagger, the max_tokens guard), fuzzed under
# `vllm-0.33-async` only (every other profile keeps no placeholders and no
# stagger, so the steps they edit change nothing there): the reference's
# counterparts of the spec's mutants of the same names (spec.py).
ASYNC_REJECTIONS_NOT_SETTLED = "async_rejections_not_settled"
ASYNC_PLACEHOLDERS_KEPT_ON_PREEMPTION = "async_placeholders_kept_on_preemption"
ASYNC_STAGGER_IGNORED = "async_stagger_ignored"
ASYNC_MAX_TOKENS_GUARD_OFF_BY_ONE = "async_max_tokens_guard_off_by_one"
ASYNC_DECODE_ON_STALE_PLACEHOLDER = "async_decode_on_stale_placeholder"

ASYNC_0_33: tuple[ReferenceMutant, ...] = (
    _mutant(ASYNC_REJECTIONS_NOT_SETTLED,
            "rejected drafts are not taken back from num_output_placeholders "
            "(`update_from_output`'s `num_output_placeholders -= num_rejected` left out): the "
            "request keeps placeholders no entry stands for",
            _edit("update.OutputUpdate._settle_rejected_placeholders", """
                  if request.num_output_placeholders > 0:
                      request.num_output_placeholders -= num_rejected""", ""),
            profile="vllm-0.33-async"),
    _mutant(ASYNC_PLACEHOLDERS_KEPT_ON_PREEMPTION,
            "`_preempt_request` does not reset num_output_placeholders to 0: the resumed "
            "request counts tokens of its stale output as its own",
            _edit("scheduler.Scheduler._reset_placeholders", "request.num_output_placeholders = 0", ""),
            profile="vllm-0.33-async"),
    _mutant(ASYNC_STAGGER_IGNORED,
            "the running loop's `current_step < next_decode_eligible_step` skip (V2 runner, "
            "PP) left out: two decodes of one request closer than pp_size schedule() calls",
            _edit("scheduler.Scheduler._is_async_skipped",
                  "self.current_step < request.next_decode_eligible_step", "False"),
            profile="vllm-0.33-async"),
    _mutant(ASYNC_MAX_TOKENS_GUARD_OFF_BY_ONE,
            "the async max_tokens guard reads `num_computed_tokens + 1 - "
            "num_output_placeholders` for `+ 2`: a decode whose token can only pass "
            "max_tokens is scheduled",
            _edit("scheduler.Scheduler._is_async_skipped",
                  "request.num_computed_tokens + 2 - placeholders",
                  "request.num_computed_tokens + 1 - placeholders"),
            profile="vllm-0.33-async"),
    _mutant(ASYNC_DECODE_ON_STALE_PLACEHOLDER,
            "a preempted request resumed while its stale output is still in flight (drop mode) "
            "takes the placeholders it had at preemption back as its own, so the running loop "
            "schedules decodes on tokens of the old, dropped output",
            # preemption remembers the count it resets ...
            _edit("scheduler.Scheduler._reset_placeholders", "request.num_output_placeholders = 0", """
                  remembered = self.__dict__.setdefault("placeholders_at_preemption", {})
                  remembered[request.request_id] = request.num_output_placeholders
                  request.num_output_placeholders = 0"""),
            # ... and a resumption with stale output still in flight takes it back
            _edit("scheduler.Scheduler._admit", "request.orphaned_incarnation = None", """
                  request.orphaned_incarnation = None
                  remembered = self.__dict__.setdefault("placeholders_at_preemption", {}).pop(
                      request.request_id, 0)
                  if was_preempted and request.num_stale_output_tokens > 0:
                      request.num_output_placeholders = remembered"""),
            profile="vllm-0.33-async"),
)


# The priority policy's historical bugs (docs/request-states.md), caught by
# the priority refinement fuzzer (verification/refinement/priority_machine.py)
# under vLLM 0.34; not fuzzed by the default runs (no priority there).
PRIORITY: tuple[ReferenceMutant, ...] = (
    _mutant("victim_kept_in_batch_pr23347",
            "the priority victim, scheduled earlier in the same call, keeps its entry, tokens and budget "
            "in the batch (vLLM issue #23347)",
            _edit("priority.PriorityPolicy._remove_priority_victim", """
                  if victim.request_id in batch.num_scheduled_tokens:
                      self._hand_back(batch, victim)""", ""),
            profile="vllm-0.34"),
    _mutant("preempted_drafts_kept_pr28558",
            "the hand-back of a priority victim leaves its scheduled drafts in the batch (vLLM PR #28558)",
            _edit("priority.PriorityPolicy._hand_back", "batch.spec_decode_tokens.pop(req_id, None)", "pass"),
            profile="vllm-0.34"),
    _mutant("victim_index_not_adjusted_pr49097",
            "the running loop's index moves back only for a victim scheduled in the same call, not for one "
            "visited and skipped before it (vLLM issue #49097)",
            _edit("priority.PriorityPolicy._remove_priority_victim",
                  "victim_index < self.running.index(request)",
                  "victim_index < self.running.index(request) and victim.request_id in batch.num_scheduled_tokens"),
            profile="vllm-0.34"),
)

# Streaming sessions' bugs in the reference (reference/sessions.py), named as
# the spec's (verification/mutants/sessions.py). Not fuzzed by the default
# runs (no session there): each is caught by the sessions refinement fuzzer
# (verification/refinement/sessions_machine.py, tests/test_sessions_refinement.py)
# and by the spec and the reference run in lockstep on random sessions
# (tests/test_sessions_lockstep.py).
SESSIONS: tuple[ReferenceMutant, ...] = (
    _mutant("continuation_applied_while_running_pr52693",
            "an input sent while the session runs is applied at once and the session enqueued: it is in "
            "running and a waiting queue at once (vLLM issue #52693)",
            _edit("sessions.StreamingSessions.add_session_input", "session.streaming_queue.append(update)", """
                  if session.status == RequestStatus.RUNNING and update is not None:
                      self._take_input(session, update)
                      session.status = RequestStatus.RUNNING
                      self.waiting.append(session)
                  else:
                      session.streaming_queue.append(update)"""),
            profile="vllm-0.34-async"),
    _mutant("turn_output_not_dropped_pr52765",
            "at a turn's end the old turn's in-flight output is not marked stale: it is appended to the "
            "next turn (vLLM PR #52765)",
            _edit("sessions.StreamingSessions._handle_stopped", "request.drop_stale_output = True", ""),
            _edit("sessions.StreamingSessions._handle_stopped",
                  "request.num_stale_output_tokens = request.num_in_flight_tokens", ""),
            profile="vllm-0.34-async"),
    _mutant("stop_keeps_optimistic_tokens_omni5183",
            "a stop under async scheduling clears the placeholders but keeps their tokens computed "
            "(vllm-omni PR #5183)",
            _edit("sessions.StreamingSessions._handle_stopped",
                  "request.num_computed_tokens -= request.num_output_placeholders", ""),
            profile="vllm-0.34-async"),
    _mutant("waiting_session_seat_freed",
            "the admission cap counts only running requests, not parked sessions (synthetic)",
            _edit("sessions.StreamingSessions._seats_taken",
                  "len(self.running) + self.num_waiting_for_streaming_input", "len(self.running)"),
            profile="vllm-0.34-async"),
)


# Structured output's bugs in the reference (reference/grammar.py), named as
# the spec's (verification/mutants/grammar.py); each caught by the grammar
# refinement fuzzer (verification/refinement/grammar_machine.py,
# tests/test_grammar_refinement.py), not by the default runs (no grammar there).
GRAMMAR: tuple[ReferenceMutant, ...] = (
    _mutant("stale_fsm_bitmask_29379",
            "a structured request scheduled again with its output in flight does not defer the batch's "
            "bitmask: the engine builds it at once from an FSM that output has not advanced yet (vLLM issue "
            "#29379)",
            _edit("grammar.Grammars._mark_pending_structured_output",
                  "request.num_output_placeholders > 1 + len(entry.spec_token_ids)", "False"),
            profile="vllm-0.34-async"),
    _mutant("failed_grammar_left_waiting_pr45012",
            "a grammar whose compilation failed is never recorded as an error: its request waits for it "
            "for ever, skipped by every waiting loop (vLLM PR #45012; handled since PR #47312)",
            _edit("grammar.Grammars._blocked_on_grammar", """
                  if request.grammar == FAILED:
                      self.grammar_compile_error_reqs.add(request.request_id)""", ""),
            profile="vllm-0.34-async"),
    _mutant("compiling_grammar_scheduled",
            "the waiting loop takes a request whose grammar still compiles for a ready one (synthetic)",
            _edit("grammar.Grammars._blocked_on_grammar", "request.grammar == READY",
                  "request.grammar in (READY, COMPILING)"),
            profile="vllm-0.34-async"),
)

# Reset's and pause's bugs in the reference (reference/reset_pause.py), named as
# the spec's (verification/mutants/reset_pause.py); each caught by the
# reset-and-pause refinement fuzzer (verification/refinement/reset_pause_machine.py,
# tests/test_reset_pause_refinement.py), not by the default runs (no reset there).
RESET_PAUSE: tuple[ReferenceMutant, ...] = (
    _mutant("reset_delivers_stale_output",
            "a reset of the running requests preempts them in deliver mode: their outputs in flight are "
            "applied when they return (synthetic)",
            _edit("reset_pause.ResetPause._preempt_dropping_output", "request.drop_stale_output = True", "pass"),
            profile="vllm-0.34-async"),
    _mutant("paused_all_runs_running_loop",
            "PAUSED_ALL keeps the running loop's token budget: running requests go on (synthetic)",
            _edit("reset_pause.ResetPause._runs_running_loop",
                  "return self.pause_state != PauseState.PAUSED_ALL", "return True"),
            profile="vllm-0.34-async"),
    _mutant("paused_new_admits_waiting",
            "PAUSED_NEW admits waiting requests as if unpaused (synthetic)",
            _edit("reset_pause.ResetPause._takes_waiting_queue",
                  "return self.pause_state == PauseState.UNPAUSED",
                  "return self.pause_state != PauseState.PAUSED_ALL"),
            profile="vllm-0.34-async"),
    _mutant("stale_rejections_settled_pr46066",
            "a reset request's stale decode, returning in drop mode after the request resumed, has its "
            "drafts taken back as rejected from the resumed request's fresh `num_computed_tokens` and "
            "placeholders (each behind its `> 0` guard) before it is discarded (vLLM PR #46066; 0.34.0's "
            "`update_from_output` skips a drop-mode stale output first). As the spec's twin, every draft "
            "counts as rejected (one outcome the verifier may return): the edit is where the output is "
            "bound, which does not see the tokens (`update_from_output` itself is the tracing "
            "scheduler's override too)",
            _edit("update.OutputUpdate._fate_by_counters",
                  "return SUPERSEDED if request.drop_stale_output else ORPHANED", """
                  if request.drop_stale_output and entry.spec_token_ids and entry.samples:
                      if request.num_computed_tokens > 0:
                          request.num_computed_tokens -= len(entry.spec_token_ids)
                      if request.num_output_placeholders > 0:
                          request.num_output_placeholders -= len(entry.spec_token_ids)
                  return SUPERSEDED if request.drop_stale_output else ORPHANED"""),
            profile="vllm-0.34-async"),
)

# LoRA's cap and the prompt-logprobs limit in the reference (reference/lora.py,
# the waiting loop, the cache manager's lookup), named as the spec's
# (verification/mutants/lora.py); each caught by the LoRA refinement fuzzer
# (verification/refinement/lora_machine.py, tests/test_refinement_lora.py),
# not by the default runs (no LoRA there).
LORA: tuple[ReferenceMutant, ...] = (
    _mutant("lora_no_admission_cap_issue14495",
            "nothing at admission keeps a step's LoRAs within max_loras: the waiting loop never passes a "
            "request over for its LoRA (vLLM issue #14495, \"No free lora slots\")",
            _edit("lora.LoraCap._held_by_lora_cap",
                  "len(loras) == max_loras and request.lora_int_id not in loras", "False"),
            profile="vllm-0.34"),
    _mutant("lora_cap_stops_admission_pr15422",
            "the waiting loop stops at a request whose LoRA the cap cannot take, instead of passing it over: "
            "the requests behind it wait (before vLLM PR #15422)",
            _edit("waiting.WaitingLoop._schedule_waiting", "request = self.waiting[index]", """
                  request = self.waiting[index]
                  if self._held_by_lora_cap(request):
                      break"""),
            profile="vllm-0.34"),
    _mutant("lora_cap_counts_scheduled_running_v0_8_5",
            "the cap counts the LoRAs of the requests scheduled in this step only, not of every running one: "
            "a running request with its tokens in flight frees its adapter's slot (vLLM 0.8.5 and 0.8.4)",
            _edit("waiting.WaitingLoop._schedule_waiting", "self._held_by_lora_cap(request)", """
                  (self.config.max_loras > 0 and request.lora_int_id > 0
                   and len({r.lora_int_id for r in self.running if r.lora_int_id > 0
                            and r.request_id in batch.num_scheduled_tokens}) == self.config.max_loras
                   and request.lora_int_id not in {r.lora_int_id for r in self.running
                                                   if r.request_id in batch.num_scheduled_tokens})"""),
            profile="vllm-0.34"),
    _mutant("prompt_logprobs_read_prefix_cache_issue3251",
            "a request that asks for prompt logprobs reads its cached prefix: the logits of the cached "
            "positions are never computed (vLLM issue #3251)",
            _edit("kv_cache_manager.KVCacheManager.get_computed_blocks",
                  "not self.enable_caching or request.prompt_logprobs", "not self.enable_caching"),
            profile="vllm-0.34"),
)

# Where the priority policy meets streaming sessions (reference/sessions.py
# under `_priority`): synthetic, as no vLLM bug of the pair's rules is known
# (its one finding, a parked session's input re-keying a heap, is vLLM's own
# behaviour, which the reference keeps); each caught by the priority-sessions
# refinement fuzzer (verification/refinement/priority_sessions_machine.py,
# tests/test_refinement_priority_sessions.py).
PRIORITY_SESSIONS: tuple[ReferenceMutant, ...] = (
    _mutant("stopped_session_joins_tail_under_priority",
            "under the priority policy a stopping session joins the tail of its queue instead of being "
            "pushed at its (priority, arrival) place (synthetic)",
            _edit("sessions.StreamingSessions._handle_stopped", """
                  if self._priority:
                      ordered = sorted(queue, key=lambda r: (r.priority, r.arrival_time, r.request_id))
                      queue.clear()
                      queue.extend(ordered)""", ""),
            profile="vllm-0.34"),
    _mutant("session_input_keeps_first_arrival",
            "a session taking an input keeps its first arrival time, not the input's (synthetic; vLLM's "
            "`_update_request_as_session` takes `update.arrival_time`)",
            _edit("sessions.StreamingSessions._take_input", "session.arrival_time = update.arrival_time", ""),
            profile="vllm-0.34"),
)

# -- the registry: by name, and by the profile each is fuzzed under -----------------

REFERENCE_MUTANTS: dict[str, ReferenceMutant] = {m.name: m for m in EVERY_PROFILE + COUNTERS_0_33 + ASYNC_0_33
                                                 + KV_CONNECTOR + PRIORITY + SESSIONS + GRAMMAR + RESET_PAUSE
                                                 + LORA + PRIORITY_SESSIONS}
# the KV connector's (not fuzzed: no fuzzer run has a connector)
KV_MUTANTS: dict[str, str] = {m.name: m.history for m in KV_CONNECTOR}

# name -> its history (every profile's mutants, in definition order)
MUTANTS: dict[str, str] = {m.name: m.history for m in EVERY_PROFILE}
# profile -> {name: history} of the mutants fuzzed under it only
PROFILE_MUTANTS: dict[str, dict[str, str]] = {}
for _m in COUNTERS_0_33 + ASYNC_0_33:
    PROFILE_MUTANTS.setdefault(_m.profile or "", {})[_m.name] = _m.history
# the priority policy's (fuzzed only by the priority fuzzer)
PRIORITY_MUTANTS: dict[str, str] = {m.name: m.history for m in PRIORITY}
# streaming sessions' (fuzzed only by the sessions fuzzer)
SESSION_MUTANTS: dict[str, str] = {m.name: m.history for m in SESSIONS}
# structured output's and reset-and-pause's (fuzzed only by their own fuzzers)
GRAMMAR_MUTANTS: dict[str, str] = {m.name: m.history for m in GRAMMAR}
RESET_PAUSE_MUTANTS: dict[str, str] = {m.name: m.history for m in RESET_PAUSE}
# LoRA's cap and the prompt-logprobs limit (fuzzed only by the LoRA fuzzer)
LORA_MUTANTS: dict[str, str] = {m.name: m.history for m in LORA}
# the priority policy's beside sessions (fuzzed only by the priority-sessions fuzzer)
PRIORITY_SESSION_MUTANTS: dict[str, str] = {m.name: m.history for m in PRIORITY_SESSIONS}
# every mutant the default runs fuzz (the KV connector's, the priority policy's,
# the sessions', structured output's, reset-and-pause's, LoRA's and the
# priority-sessions pair's are not)
ALL_MUTANTS: dict[str, str] = {name: m.history for name, m in REFERENCE_MUTANTS.items()
                               if name not in KV_MUTANTS and name not in PRIORITY_MUTANTS
                               and name not in SESSION_MUTANTS and name not in GRAMMAR_MUTANTS
                               and name not in RESET_PAUSE_MUTANTS and name not in LORA_MUTANTS
                               and name not in PRIORITY_SESSION_MUTANTS}


def reference_mutant(name: str) -> ReferenceMutant:
    """The reference mutant called `name`; ValueError naming the known ones otherwise."""
    if name in REFERENCE_MUTANTS:
        return REFERENCE_MUTANTS[name]
    raise ValueError(f"unknown mutant {name!r}; known: {', '.join(REFERENCE_MUTANTS)}")


def profile_of_mutant(name: str) -> str | None:
    """The profile a mutant is fuzzed under (None: every profile's)."""
    return reference_mutant(name).profile


def check_mutant(name: str | None) -> None:
    """Raise ValueError unless `name` is None or a known reference mutant."""
    if name is not None:
        reference_mutant(name)
