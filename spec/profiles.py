"""The version profiles: where vLLM versions differ in a way the spec can see,
each difference is a named constant of a `Profile`, documented with the vLLM
function it is read from.

A profile models a version's *intended* behaviour. Its bugs (0.8.4's counter
drift and stale completions, 0.8.5's stale token) are never part of a
profile: they live with the verification, as counterexamples of this spec.

Abstracted away: every knob that is the same in all profiles (those are plain
`Config` fields), and everything `config.py` already abstracts.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

ReleaseOrder = Literal["reverse", "forward"]
Policy = Literal["continue-prefill", "one-batch-per-request"]
StaleTest = Literal["truthy", "positive"]
DraftSource = Literal["completion", "submission", "placeholders"]


@dataclass(frozen=True)
class Profile:
    """One vLLM version's constants."""

    name: str
    # The scheduling policy. vLLM 0.8.1-0.8.4 `Scheduler.schedule` skips a
    # request in `scheduled_req_ids` (one batch per request, with the engine's
    # gate in `EngineCore.step_with_batch_queue`); 0.8.5 continues prefill
    # chunks of a request already in flight ("[V1][PP] Continue scheduling
    # prefill chunks").
    policy: Policy
    # `KVCacheManager.free` (0.8.4 and 0.8.5): with prefix caching on, a
    # table is released last block first (`reversed(blocks)`) so its tail is
    # evicted first; with prefix caching off, in table order.
    release_order_with_prefix_caching: ReleaseOrder
    release_order_without_prefix_caching: ReleaseOrder
    # `KVCacheManager.__init__(num_preallocate_tokens=64)` in 0.8.4: whenever
    # `allocate_slots` needs new blocks it takes
    # `max(0, cdiv(num_preallocate_tokens, block_size) - num_lookahead_tokens // block_size)`
    # more, capped by the free blocks and by `cdiv(max_model_len, block_size)`
    # blocks per request; they join the request's table. 0.8.5 removed it.
    num_preallocate_tokens: int
    # `BlockPool.cache_full_blocks` (0.8.x) stores
    # `cached_block_hash_to_block[hash][block_id]`: a second full block whose
    # hash is already cached is cached too. `BlockPool.get_cached_block`
    # serves a hit from the first copy in that dict (the oldest still cached);
    # `_maybe_evict_cached_block` removes only the evicted block's copy.
    cache_duplicate_blocks: bool
    # `BlockPool.free_blocks` (0.33): of the blocks a freed table brings to
    # reference count 0 (visited in the order `KVCacheManager.free` gives,
    # last block first), those with no block hash (or all, with prefix
    # caching off) go to the HEAD of the free queue, in that order
    # (`FreeKVCacheBlockQueue.prepend_n`: reused first); hashed ones to the
    # tail (`append_n`: LRU). 0.8.x: every freed block to the tail.
    unhashed_blocks_to_head: bool = False
    # `Scheduler.schedule` (0.33): the long-prefill threshold is in force only
    # when `get_request_counts()` gives more than one request (running +
    # waiting), counted once at the start of the call. 0.8.x: always.
    threshold_needs_company: bool = False
    # `Scheduler.schedule`, running loop (0.33): a running request's tokens
    # are clipped to `max_model_len - num_computed_tokens -
    # num_sampled_tokens_per_step` (1 for generation). 0.8.x: no "- 1".
    # The waiting loop has no such clip in either version.
    sampled_token_slot: int = 0
    # `KVCacheManager.allocate_slots(full_sequence_must_fit=
    # scheduler_reserve_full_isl)` (0.33, on by default): a waiting or
    # preempted request is admitted only if blocks for its whole current
    # sequence (`min(num_tokens, max_model_len)`, less its prefix hit) fit
    # in the free queue, not just its first chunk's. 0.8.x: the chunk's.
    full_sequence_admission: bool = False
    # `Scheduler.schedule`, waiting loop (0.33): a preempted request whose
    # stale output is still in flight (`num_stale_output_tokens and not
    # drop_stale_output`, deliver mode) is skipped (`skip_request`), not a
    # stop: requests behind it may be admitted past it, and it keeps its
    # place. The spec sees that reason as the request's ORPHANED entries in
    # flight. 0.8.x: resumes it at once (its orphans superseded).
    defer_resume_while_stale: bool = False
    # `check_stop` (v1/core/sched/utils.py, 0.33): EOS, then the stop ids,
    # then the length cap (`max_model_len`, `max_tokens`). 0.8.x: the
    # length cap first.
    stop_tokens_before_length: bool = False
    # `Request.num_in_flight_tokens` / `num_stale_output_tokens` /
    # `drop_stale_output` (0.33): per-request counters kept apart from the
    # batches. `Scheduler._update_after_schedule` adds each entry's n to the
    # in-flight counter; `Scheduler._preempt_request` copies it into the stale
    # counter (and sets the drop flag in drop mode); `update_from_output`
    # looks the output up BY NAME (`self.requests.get(req_id)`), subtracts n
    # from the in-flight counter and, while the stale counter is `> 0`, treats
    # the output as stale (subtracting n from it too): delivered to the
    # PREEMPTED request in deliver mode, discarded in drop mode. The waiting
    # loop defers the resumption while the stale counter is truthy
    # (`num_stale_output_tokens and not drop_stale_output`). 0.8.x: no
    # counters; the entries' fates alone decide (the counters stay 0).
    stale_output_counters: bool = False
    # `EngineCore.step_with_batch_queue` (0.33): `schedule()` runs on every
    # engine step while `Scheduler.has_requests()`, and its result joins the
    # batch queue even with 0 tokens (it carries finished and preempted ids to
    # the workers); popping it changes no request. 0.8.x: a step that
    # schedules nothing queues nothing.
    empty_batches: bool = False
    # --- asynchronous scheduling (vLLM 0.33.0 `AsyncScheduler` with the V2
    # model runner, under pipeline parallelism K); all off in sync profiles.
    # `AsyncScheduler._update_after_schedule`: every scheduled entry that is
    # not a prefill chunk adds `1 + #drafts scheduled` to the request's
    # `num_output_placeholders`; `Scheduler.schedule`'s running loop then
    # counts them in `num_new_tokens` (so a decode is scheduled before the
    # previous token exists) and skips a request whose placeholders surely
    # reach max_tokens (`num_computed + 2 - placeholders >= num_prompt +
    # max_tokens`); `update_from_output` / `_update_request_with_output`
    # settle them (rejected drafts, then returned tokens, each when not stale
    # and `> 0`); `_preempt_request` resets them to 0.
    output_placeholders: bool = False
    # `VllmConfig.max_concurrent_batches` (config/vllm.py): the batch queue
    # holds K + 1 batches under async scheduling with the V2 runner (K sync).
    extra_queued_batches: int = 0
    # `AsyncScheduler.__init__`: `decode_stagger = pipeline_parallel_size`;
    # `_update_after_schedule` sets `next_decode_eligible_step = current_step
    # + decode_stagger` for a sampling entry, and the running loop skips a
    # request while `current_step < next_decode_eligible_step`
    # (`current_step += 1` on every `schedule()` call, empty ones included).
    # The spec keeps a per-request countdown instead (`Request.decode_countdown`).
    decode_stagger_is_pipeline_depth: bool = False
    # `update_from_output` (0.33): with placeholders in play or drafts
    # configured (`has_output_placeholders or self.num_spec_tokens > 0`), a
    # live output of a RUNNING request hashes the blocks its settled tokens
    # fill (`cache_blocks(request, num_computed - num_in_flight)`), before a
    # stop frees them (so the sync 0.33 profile makes the call only with k > 0).
    cache_settled_blocks_on_output: bool = False
    # The waiting loop's stale test (`Scheduler.schedule`, 0.33): vLLM defers
    # a preempted request while `num_stale_output_tokens and not
    # drop_stale_output` -- "truthy", so a stale count driven below 0 (a
    # reused request id, docs/vllm-0.33-id-reuse.md) defers it for ever,
    # since `update_from_output` drains the count only while it is `> 0`.
    # "positive": the test `num_stale_output_tokens > 0` the doc proposes, the
    # same as the drain's (the hardened variant; no vLLM release has it).
    # Under unique names the two agree (IF2: the count is never negative).
    stale_test: StaleTest = "truthy"
    # `update_from_output` (0.33) subtracts each output's tokens from
    # `num_in_flight_tokens` with no floor and no check. True: the result is
    # floored at 0 (`max(0, ...)`), the hardened variant's guard, the closest
    # to the doc's `assert num_in_flight_tokens >= 0` that keeps the engine
    # running: an output bound to the wrong incarnation can then not carry a
    # negative count into the stale counter at preemption. Under unique names
    # the floor never binds (IF1).
    in_flight_floor: bool = False
    # --- speculative decoding: where a request's drafts for its next step
    # come from (spec/drafts.py reads it; the seam is `drafts_come_with_output`):
    # "completion" (0.8.x): `Scheduler.update_from_output` sets
    # `spec_token_ids` from the model's output (`Sample.next_drafts`).
    # "submission" (0.33 sync): `EngineCore.post_step` hands the drafts the
    # runner proposed for the batch it has just submitted to
    # `Scheduler.update_draft_token_ids`, in the same engine step, before that
    # batch completes: the completion's drafts as the scheduler sees them,
    # and, used before it, the environment's `hand_over_drafts`.
    # "placeholders" (0.33 async): `AsyncScheduler._update_after_schedule`
    # gives every entry that is not a prefill chunk k placeholder drafts
    # (`[-1] * num_spec_tokens_to_schedule`), filled in on the worker
    # (`post_step` does nothing under async scheduling; the output's drafts are
    # rewritten by `update_draft_token_ids_in_output` only for structured
    # outputs, not modelled); the completion brings none.
    draft_source: DraftSource = "completion"
    # What a request's held drafts do to its cached blocks (spec/drafts.py
    # reads it; the seam is `drafts_left_uncached` / `drafts_after_preemption`).
    # vLLM 0.8.4 and 0.8.5: `KVCacheManager.allocate_slots` caches
    # `(num_computed_tokens + num_tokens - len(request.spec_token_ids)) //
    # block_size` full blocks: every draft the request holds is left out,
    # scheduled or not; and `Scheduler.schedule`'s preemption branch resets
    # only `status` and `num_computed_tokens`, so a preempted request holds
    # its drafts to its resumption, whose allocation leaves them out too
    # (one block fewer cached where they cross a block boundary). 0.33:
    # `_preempt_request` clears the drafts and `allocate_slots` caches
    # `min(num_computed_tokens + num_new_tokens, request.num_tokens)`: only
    # the scheduled drafts are left out.
    held_drafts_left_uncached: bool = False
    # vLLM 0.8.4 `Scheduler.schedule`, running loop: no `max_model_len -
    # num_computed_tokens` clip (0.8.5 added it, "necessary when using spec
    # decoding"), so `KVCacheManager.allocate_slots` is asked for blocks for
    # every held draft, past max_model_len too, and a request whose blocks
    # cannot be had is preempted like any other. Scheduling those drafts when
    # the blocks can be had is 0.8.4's bug (the ground truth's
    # `beyond_max_model_len`), left out: the entry is then clipped as 0.8.5's.
    demands_blocks_past_max_model_len: bool = False
    # `Scheduler.schedule`, waiting loop (0.33: "Pad new decode requests to
    # uniform spec decoding size"): with k > 0 an admission with exactly one
    # token to compute is scheduled as 1 + k tokens, k placeholder drafts,
    # when the running loop scheduled no request whose previous entry was a
    # prefill chunk (`prefill_scheduled`) and it scheduled some running
    # request or the admission has a prefix hit, if `hit + 1 + k + 1 <=
    # max_model_len`; when 1 + k exceed the budget left, admission stops
    # ("Prefer to not schedule than schedule un-padded"). A long-prefill
    # threshold below 1 + k then clips it (vLLM asserts `num_new_tokens == 1 +
    # num_spec_tokens` there): the entry keeps the drafts the clip leaves.
    # 0.8.x: no padding.
    pads_admitted_decodes: bool = False
    # --- chunked prefill off and admission order (`Config.enable_chunked_prefill`,
    # `Config.cache_aware_admission_window`); each changes nothing at the defaults.
    # `Scheduler.schedule`, waiting loop (0.33, 0.34): with
    # `SchedulerConfig.enable_chunked_prefill` off, a request whose new tokens
    # (past its prefix hit, after the long-prefill threshold's clip) exceed
    # the budget left stops the loop (`break`) instead of being admitted with
    # a chunk of them; the running loop has no such test. 0.8.x: the V1
    # scheduler has no such test (V1 always chunks:
    # `EngineArgs._set_default_args_v1`), so the flag changes nothing there.
    unchunked_prefill_stops_admission: bool = False
    # `Scheduler.schedule` (0.34): the long-prefill threshold is in force only
    # with chunked prefill on (`enable_chunked_prefill and num_eligible_reqs >
    # 1`). 0.33: with chunked prefill off too, so the threshold still cuts a
    # prompt into chunks there.
    threshold_needs_chunked_prefill: bool = False
    # `Scheduler._reorder_waiting_by_cached_prefix` (0.34, opt-in through
    # `cache_aware_admission_window`, only with FCFS and prefix caching), run
    # at the start of the waiting phase of a call that preempted nobody: when
    # `waiting` holds 2 requests or more and `kv_cache_manager.usage` is at
    # least `cache_aware_admission_threshold`, the fresh requests (status
    # WAITING, nothing computed) among the first `window` of `waiting` are
    # sorted by their cached prefix (`get_num_cached_tokens`), deepest first,
    # arrival order breaking ties, in the slots they held; the others keep
    # theirs. 0.33 and 0.8.x: no such knob (FCFS only).
    cache_aware_admission: bool = False
    # `Scheduler.__init__` / `Scheduler.schedule` (0.33, 0.34): the local
    # prefill cadence (`SchedulerConfig.prefill_schedule_interval` > 1 on an
    # engine without data parallelism: `local_prefill_interval`): a call
    # within the interval of the last prefill-carrying step defers every
    # prefill while some running request decodes, unless the last release
    # could not drain the waiting queue (`prefill_capacity_bound`, #44558).
    # spec/cadence.py. 0.8.x: no such knob.
    prefill_cadence: bool = False
    # --- the engine loop around the scheduler (spec/engine.py reads these at
    # one seam, `engine.loop_of`; the trace checker's E-a/E-b are stated for
    # a correct engine whatever these say).
    # `EngineCoreProc.run_busy_loop` / `_process_input_queue` (0.8.4, 0.8.5):
    # the engine blocks on its input queue while `scheduler.has_requests()`
    # is false, whatever is still in its batch queue -- so it waits for input
    # with an aborted request's batch in flight (a vLLM bug: E-a). 0.33 and
    # later: `EngineCoreProc.has_work` counts the batch queue, so it never does.
    waits_with_batch_in_flight: bool = False
    # The inputs an engine takes in the middle of a step, between the step's
    # `schedule()` and the `update_from_output` of the batch it completes:
    # 0.33 `EngineCore.step_with_batch_queue` drains the aborts queue there
    # (`_process_aborts_queue`): "abort"; 0.34 `EngineCoreProc._wait_for_output`
    # also handles ADD while it spins before a deadline: "arrive", "abort"
    # (either side of the wait is legal: past the deadline an input waits for
    # the next `_process_input_queue`). 0.8.x: none, inputs only between steps.
    mid_step_inputs: tuple[str, ...] = ()
    # --- the KV connector (`Config.kv_connector`; docs/kv-connector.md, "What
    # each vLLM version has"): one constant per row of that table, each read
    # only when a connector is configured, so none changes a state without one.
    # `Scheduler.schedule`, waiting loop: a fresh request asks the connector
    # (`get_num_new_matched_tokens`) for tokens beyond its local hit; a
    # synchronous hit counts as computed at once and is loaded by the batch
    # (0.8.5 gets an int; 0.33/0.34 a pair `(n, False)`). 0.8.4: no connector.
    kv_sync_hits: bool = False
    # `Scheduler.schedule` (0.33, 0.34): an asynchronous hit `(n, True)`
    # allocates the request's blocks, sets its `num_computed_tokens` and parks
    # it in `WAITING_FOR_REMOTE_KVS` until `finished_recving`
    # (`_update_from_kv_xfer_finished`, `_handle_blocked_waiting_request`,
    # `_update_waiting_for_remote_kv`). 0.8.5: no async loads.
    kv_async_loads: bool = False
    # `update_from_output` -> `_handle_failed_recving` (request level) and
    # `_handle_invalid_blocks` / `_update_requests_with_invalid_blocks` (block
    # level), with `kv_load_failure_policy` recompute or fail (0.33, 0.34).
    kv_load_failures: bool = False
    # `_free_request` -> `_connector_finished` -> `request_finished` may
    # return `delay_free`: the blocks stay until `finished_sending`
    # (`_update_from_kv_xfer_finished`) (0.33, 0.34). 0.8.5's `_free_request`
    # frees at once.
    kv_send_hold: bool = False
    # `finish_requests`: a request aborted in `WAITING_FOR_REMOTE_KVS` whose
    # load has not reported keeps its blocks until its `finished_recving`
    # (`delay_free_blocks`; `_update_from_kv_xfer_finished` frees them) (0.33, 0.34).
    kv_aborted_load_held: bool = False
    # `Scheduler.__init__` `defer_block_free` (a consumer connector and
    # `max_concurrent_batches > 1`): `_request_blocks_can_be_freed`,
    # `_free_request_blocks` (fenced blocks join `deferred_frees`),
    # `_drain_deferred_frees` in `update_from_output`; the running loop does not
    # preempt a victim whose free would be deferred (0.33, 0.34).
    kv_step_fence: bool = False
    # `Scheduler.kv_holding_waiting`: waiting requests that hold KV blocks
    # (parked and landed loads) are drained before `waiting`
    # (`schedule`'s waiting loop, `skip_request`) (0.33, 0.34).
    kv_holding_first: bool = False
    # `Scheduler.async_kv_waiting`, loads-only mode and
    # `max_num_inflight_kv_loads` (`_enqueue_waiting_request`,
    # `_next_waiting_queue`, `_admits_inflight_kv_load`, with
    # `_aborted_kv_loads` counted against the limit) (0.34 only).
    kv_inflight_load_limit: bool = False
    # `Scheduler.schedule`, running loop: `_preempt_request(drop_stale_output=
    # self.requires_kv_delivery)`: a producer's preempted request drops its
    # in-flight output (0.33, 0.34).
    kv_producer_drops_stale_output: bool = False
    # Under the recompute policy a sync load's invalid blocks stay in the
    # prefix cache (`_handle_invalid_blocks` evicts only under the fail
    # policy) and a later holder in `_update_requests_with_invalid_blocks`'
    # scan keeps a block an earlier one marked ("this request can still
    # consider this block as computed"): KV7 breaks where the marker never
    # recomputes it (docs/vllm-kv-connector-findings.md, finding 7; 0.33,
    # 0.34). True: the fix (no vLLM release): the invalid blocks and each
    # affected running request's blocks after them leave the prefix cache
    # under the recompute policy too (PR #53298 for #49250: "invalid blocks
    # are quarantined from new prefix-cache users"), and every holder is cut
    # at its own first invalid block, none keeping a block another marked
    # (PR #37827's direction; PR #42461 drops the marks altogether). Read at
    # one seam, kv_reports.quarantines_invalid_kv.
    kv_recompute_quarantines_invalid: bool = False
    # `SchedulingPolicy.PRIORITY` (`Config.scheduling_policy`, docs/request-states.md):
    # `waiting` is a `PriorityRequestQueue` (a heap by `Request.__lt__`:
    # priority, then arrival time), and `schedule()`'s running loop preempts
    # `max(running, key=(priority, arrival_time))`, handing back what a victim
    # scheduled earlier in the call got (its tokens, budget, blocks and
    # drafts), moving `req_index` back when the victim sat before it, and going
    # on past a request that preempted itself (0.33, 0.34: the same code in
    # both). 0.8.x's V1 scheduler has no priority policy.
    priority_policy: bool = False
    # Under the priority policy the running loop may preempt a request it
    # scheduled earlier in the same call (`priority_policy`); that request's
    # `allocate_slots` had cached its full blocks through
    # `min(total_computed_tokens + num_new_tokens, request.num_tokens)`
    # and `_preempt_request` frees them with their hashes: a later prefix hit
    # reads KV no batch wrote (KV8; docs/vllm-unwritten-kv-findings.md,
    # finding 1; 0.33, 0.34: False). True: the fix (no vLLM release): the
    # victim's blocks cached past its `num_computed_tokens` are uncached
    # before they are freed (`BlockPool.evict_blocks`; PR #43569, open, rolls
    # back every registration of an uncommitted step, a superset). Read at
    # one seam, kv_unwritten.uncaches_handed_back.
    hand_back_uncaches_unwritten: bool = False
    # Where the priority policy meets the KV connector (docs/request-states.md,
    # "Features together"; read only under `Config.scheduling_policy ==
    # "priority"`, at one seam: spec/priority.py `kv_holding_ranked`,
    # `async_head_first`). `Scheduler.__init__` makes `kv_holding_waiting`
    # with `create_request_queue(self.policy)`: a `PriorityRequestQueue`, so
    # the waiting loop takes parked and landed loads by (priority, arrival),
    # a load started in the call (`step_started_kv_loads`: `add_request`)
    # and a skipped block-holder (`prepend_requests`) are pushed at their
    # rank, not the tail and the head, and `_handle_invalid_blocks` walks the
    # parked loads in that order (`PriorityRequestQueue.__iter__`) (0.33, 0.34).
    priority_orders_kv_holding: bool = False
    # `async_kv_waiting` is a `PriorityRequestQueue` too, and
    # `_next_waiting_queue` takes its head before `waiting`'s when
    # `async_head < head` (`Request.__lt__`: priority, then arrival) instead
    # of comparing arrival times (0.34 only: 0.33 has no such queue).
    priority_orders_async_kv: bool = False
    # --- structured output (spec/grammar.py; read only with
    # `Config.structured_output`, which the 0.8.x profiles do not model).
    # Whether the scheduler checks a structured request's drafts against the
    # grammar: 0.33 does (`update_draft_token_ids` cuts them to their
    # grammar-valid prefix with `validate_tokens`; async,
    # `update_draft_token_ids_in_output` pads each illegal one to -1, a slot
    # the verifier rejects); 0.34 does not (sync `trim_spec_tokens` keeps the
    # first illegal draft, `len_validated + 1`; async preserves every slot,
    # "rejection sampling handles grammar violations"). Where it checks and
    # runs sync, no illegal draft reaches a batch (`grammar.illegal_drafts_scheduled`).
    scheduler_validates_drafts: bool = False
    # A drafter with its own forward pass (spec/lookahead.py): `allocate_slots(
    # num_lookahead_tokens=...)` past each entry but an async load's, and the
    # draft model's input slots (`max_num_new_slots_for_drafting`) charged to
    # the budget (0.33, 0.34 `Scheduler.schedule`; `Config.num_lookahead_tokens`,
    # `draft_input_slots` are refused elsewhere).
    lookahead_slots: bool = False
    # Streaming sessions (resumable requests; spec/sessions.py):
    # `add_request` under a live id queues or applies a streaming update
    # (`_update_request_as_session`), a stop parks the session in
    # WAITING_FOR_STREAMING_REQ (`_handle_stopped_request`, which drops the
    # turn's in-flight output), and a parked session keeps its blocks and
    # its seat in the admission cap (`num_waiting_for_streaming_input`)
    # (0.33, 0.34: the same rules in both).
    streaming_sessions: bool = False
    # A session's next input sets its prefix-cache limit from the input's own
    # sampling parameters: 0.34's `_update_request_as_session` recomputes
    # `prefix_cache_hit_limit = get_prefix_cache_hit_limit()` after taking
    # `update.sampling_params`; 0.33's takes them but leaves
    # `skip_reading_prefix_cache` as `Request.__init__` set it from the
    # session's first input (spec/lora.py `take_input_logprobs`).
    session_input_sets_cache_limit: bool = False
    # `Scheduler.reset_prefix_cache(reset_running_requests=True)`: every
    # running request preempted with `_preempt_request(drop_stale_output=True)`
    # (its in-flight output dropped), then `BlockPool.reset_prefix_cache`
    # (reset_pause.py) (0.33, 0.34).
    reset_drops_running_output: bool = False
    # `PauseState` and `Scheduler.set_pause_state`: PAUSED_ALL schedules
    # nothing, PAUSED_NEW admits only `kv_holding_waiting`
    # (`schedule`, `get_num_unfinished_requests`) (0.33, 0.34).
    pause_states: bool = False
    # The profile of the release this one follows, when this one's spec rules
    # are that one's with some constants changed: verification checks this
    # one with everything it checks the older one with
    # (`verification.models.carry_over`), so a new release is checked as
    # deeply as the one before it from its first day.
    follows: str | None = None

    def release_order(self, prefix_caching: bool) -> ReleaseOrder:
        return (self.release_order_with_prefix_caching if prefix_caching
                else self.release_order_without_prefix_caching)


VLLM_0_8_5 = Profile(name="vllm-0.8.5", policy="continue-prefill",
                     release_order_with_prefix_caching="reverse",
                     release_order_without_prefix_caching="forward",
                     num_preallocate_tokens=0, cache_duplicate_blocks=True,
                     waits_with_batch_in_flight=True, kv_sync_hits=True,
                     held_drafts_left_uncached=True)

VLLM_0_8_4 = Profile(name="vllm-0.8.4", policy="one-batch-per-request",
                     release_order_with_prefix_caching="reverse",
                     release_order_without_prefix_caching="forward",
                     num_preallocate_tokens=64, cache_duplicate_blocks=True,
                     waits_with_batch_in_flight=True, held_drafts_left_uncached=True,
                     demands_blocks_past_max_model_len=True)

# The KV connector rows of 0.33.0 (docs/kv-connector.md): everything but the
# 0.34 load limit, each re-read in `vllm/v1/core/sched/scheduler.py`.
_KV_CONNECTOR_0_33 = {"kv_sync_hits": True, "kv_async_loads": True, "kv_load_failures": True,
                      "kv_send_hold": True, "kv_aborted_load_held": True, "kv_step_fence": True,
                      "kv_holding_first": True, "kv_producer_drops_stale_output": True,
                      "priority_orders_kv_holding": True}

# vLLM 0.33.0 with synchronous scheduling (the V1 model runner under
# pipeline parallelism, deliver mode, no KV connector). `KVCacheManager.free`
# still reverses the table with prefix caching on or off
# (`SingleTypeKVCacheManager.free`), and `BlockPool._insert_block_hash` still
# caches a hash a second time under another block id
# (`BlockHashToBlockMap.insert` turns the entry into a dict of block ids;
# `get_one_block` serves the first). Its stale-output counters, empty
# batches, drop mode (`Config.stale_mode`) and names reused as new
# incarnations (`Config.allow_name_reuse`) are modelled, and, with
# `Config.kv_connector`, its KV connector (`_KV_CONNECTOR_0_33`).
VLLM_0_33 = Profile(name="vllm-0.33", policy="continue-prefill",
                    release_order_with_prefix_caching="reverse",
                    release_order_without_prefix_caching="reverse",
                    num_preallocate_tokens=0, cache_duplicate_blocks=True,
                    unhashed_blocks_to_head=True, threshold_needs_company=True,
                    sampled_token_slot=1, full_sequence_admission=True,
                    defer_resume_while_stale=True, stop_tokens_before_length=True,
                    stale_output_counters=True, empty_batches=True, mid_step_inputs=("abort",),
                    unchunked_prefill_stops_admission=True,
                    cache_settled_blocks_on_output=True, draft_source="submission",
                    pads_admitted_decodes=True, priority_policy=True, streaming_sessions=True,
                    reset_drops_running_output=True, pause_states=True, scheduler_validates_drafts=True,
                    prefill_cadence=True, lookahead_slots=True, **_KV_CONNECTOR_0_33)

# vLLM 0.33.0 with asynchronous scheduling, the default for single-node
# pipeline parallelism (`AsyncScheduler`, the V2 model runner, the mp
# executor): the sync 0.33 profile plus output placeholders, a batch queue of
# K + 1 and decodes of one request at least K `schedule()` calls apart.
# Structured outputs (grammars, `pending_structured_output_tokens` and the
# deferred sampling they cause) are not modelled, nor is the XPU stagger of 1.
VLLM_0_33_ASYNC = replace(VLLM_0_33, name="vllm-0.33-async", output_placeholders=True,
                          extra_queued_batches=1, decode_stagger_is_pipeline_depth=True,
                          draft_source="placeholders")

# vLLM 0.33 with the two cheap guards docs/vllm-0.33-id-reuse.md proposes
# against a reused request id (no vLLM release; a what-if for its
# maintainers): the waiting loop tests the stale count `> 0` instead of its
# truthiness, and the in-flight counter is floored at 0. It does not bind
# outputs by incarnation: with names reused the wrong binding (S7') stays.
# With unique names it behaves exactly as vLLM 0.33.
VLLM_0_33_HARDENED = replace(VLLM_0_33, name="vllm-0.33-hardened", stale_test="positive",
                             in_flight_floor=True)

# vLLM 0.34.0 with synchronous scheduling. 0.34 removed the V1 model runner:
# sync pipeline parallelism is the V2 runner with async scheduling off
# (`VllmConfig.use_v2_model_runner` is gone; `Scheduler.__init__` no longer
# reads it). Every constant above is 0.33.0's, each re-read in 0.34.0's
# source (tests/test_profiles_034.py names the function of each): the
# release order (`SingleTypeKVCacheManager.free`), duplicate hashes
# (`BlockHashToBlockMap.insert`), unhashed blocks to the head
# (`BlockPool.free_blocks`), the threshold's company test and the sampled
# token's slot (`Scheduler.schedule`), full-sequence admission
# (`KVCacheManager.allocate_slots`), the deferred resumption and the stale
# counters (`Scheduler.schedule`, `_preempt_request`, `update_from_output`,
# which still binds an output by id: docs/vllm-0.33-id-reuse.md holds for
# 0.34), the stop order (`check_stop`) and empty batches
# (`EngineCore.step_with_batch_queue`). What 0.34 changes that the spec can
# see is added as constants of its own, each citing 0.34's function.
# Its own: the long-prefill threshold only with chunked prefill
# (`Scheduler.schedule`: `enable_chunked_prefill and num_eligible_reqs > 1`),
# and the opt-in cache-aware admission order
# (`Scheduler._reorder_waiting_by_cached_prefix`); chunked prefill off still
# stops the waiting loop as in 0.33 (`Scheduler.schedule`, waiting loop).
# And the connector's `async_kv_waiting` queue, loads-only mode and
# `max_num_inflight_kv_loads` (`_next_waiting_queue`, `_admits_inflight_kv_load`),
# a priority heap under the priority policy (`priority_orders_async_kv`).
_VLLM_0_34_RULES = {"threshold_needs_chunked_prefill": True, "cache_aware_admission": True,
                    "kv_inflight_load_limit": True, "scheduler_validates_drafts": False,
                    "priority_orders_async_kv": True, "session_input_sets_cache_limit": True}
# 0.34's `EngineCoreProc._wait_for_output` handles ADD and ABORT while it
# spins on a step's output before a deadline (`_INPUTS_HANDLED_DURING_STEP`):
# an arrival, too, may land between a step's `schedule()` and its completion.
VLLM_0_34 = replace(VLLM_0_33, name="vllm-0.34", follows=VLLM_0_33.name, mid_step_inputs=("arrive", "abort"),
                    **_VLLM_0_34_RULES)

# vLLM 0.34 with finding 7's fix (no vLLM release; a what-if, as the
# hardened 0.33 variant): under the recompute policy a failed sync load's
# invalid blocks leave the prefix cache and every holder recomputes from its
# own first invalid block (`Profile.kv_recompute_quarantines_invalid`). KV7
# holds on it (verification/kv_models.py, KV_INVALID_MODELS). It follows
# vLLM 0.34 (`carry_over`): the fix is checked with everything 0.34 is.
VLLM_0_34_INVALID_KV_FIXED = replace(VLLM_0_34, name="vllm-0.34-invalid-kv-fixed", follows=VLLM_0_34.name,
                                     kv_recompute_quarantines_invalid=True)

# vLLM 0.34 with finding 1's fix of the unwritten-KV findings (no vLLM
# release; a what-if): a priority victim handed back in its own call has the
# blocks its allocation cached past its computed tokens uncached before they
# are freed (`Profile.hand_back_uncaches_unwritten`). KV8 holds on it
# (verification/priority_models.py, PRIORITY_UNWRITTEN_MODELS). It follows
# vLLM 0.34 (`carry_over`): the fix is checked with everything 0.34 is.
VLLM_0_34_UNWRITTEN_KV_FIXED = replace(VLLM_0_34, name="vllm-0.34-unwritten-kv-fixed", follows=VLLM_0_34.name,
                                       hand_back_uncaches_unwritten=True)

# vLLM 0.34.0 with asynchronous scheduling: 0.33's async rules unchanged
# (`AsyncScheduler._update_after_schedule`; `next_decode_eligible_step` is
# now set whenever pipeline parallelism runs async, with no V2-runner test;
# `VllmConfig.max_concurrent_batches` still K + 1).
VLLM_0_34_ASYNC = replace(VLLM_0_33_ASYNC, name="vllm-0.34-async", follows=VLLM_0_33_ASYNC.name,
                          mid_step_inputs=VLLM_0_34.mid_step_inputs, **_VLLM_0_34_RULES)

DEFAULT_PROFILE = VLLM_0_8_5.name

PROFILES: dict[str, Profile] = {p.name: p for p in (VLLM_0_8_5, VLLM_0_8_4, VLLM_0_33, VLLM_0_33_ASYNC,
                                                    VLLM_0_33_HARDENED, VLLM_0_34, VLLM_0_34_ASYNC,
                                                    VLLM_0_34_INVALID_KV_FIXED, VLLM_0_34_UNWRITTEN_KV_FIXED)}

# `vllm.__version__` -> the profile that models it.
VERSION_PROFILES: dict[str, str] = {"0.8.5": VLLM_0_8_5.name, "0.8.5.post1": VLLM_0_8_5.name,
                                    "0.8.4": VLLM_0_8_4.name, "0.33.0": VLLM_0_33.name,
                                    "0.34.0": VLLM_0_34.name}


def profile(name: str) -> Profile:
    """The profile called `name`; ValueError naming the known ones otherwise."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; known: {', '.join(PROFILES)}") from None


def profile_for_version(version: str) -> Profile | None:
    """The profile of a `vllm.__version__` string (a local suffix such as
    "+cpu" ignored), or None when no profile covers that version."""
    name = VERSION_PROFILES.get(version.split("+", 1)[0])
    return None if name is None else PROFILES[name]


def num_preallocate_blocks(num_preallocate_tokens: int, block_size: int,
                           num_lookahead_tokens: int = 0) -> int:
    """0.8.4 `KVCacheManager.allocate_slots`: the extra blocks asked for on an
    allocation that needs new blocks, before the caps."""
    return max(0, -(-num_preallocate_tokens // block_size) - num_lookahead_tokens // block_size)
