"""Version profiles: where vLLM versions differ in what the scheduler and its
KV cache manager do, each difference a named constant read from that
version's source (the function named beside it). `SchedulerConfig.profile`
selects one; the policy steps read the constants, never the version string.

The spec keeps its own copy of these names and values (spec/profiles.py;
the reference shares no code with spec/). A profile models a version's
intended behaviour: its bugs stay mutants (verification/mutants/reference.py).
Where the reference carries a later fix that a release lacks (its named
deviations, reference/README.md), the difference is a constant too, off in every
profile; `RELEASED` holds each version as vLLM released it, with those
constants on (`SchedulerConfig(as_released=True)`: the vLLM differential's
conforming run, flightcheck/vllm/reference_run.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

DEFAULT_PROFILE = "vllm-0.8.5"


@dataclass(frozen=True)
class Profile:
    name: str
    # `KVCacheManager.allocate_slots` (0.8.4): on an allocation that needs new
    # blocks, `ceil(num_preallocate_tokens / block_size)` more are taken
    # (capped by the free blocks and by max_model_len's blocks per request)
    # and join the request's table. 0.8.5 removed it.
    num_preallocate_tokens: int
    # `KVCacheManager.free` (0.8.4 and 0.8.5): a request's blocks join the
    # free queue's tail in reverse table order when prefix caching is on
    # (its tail is evicted first), in table order when it is off.
    release_reversed_with_caching: bool
    release_reversed_without_caching: bool
    # `BlockPool.cache_full_blocks` / `get_cached_block` (0.8.x):
    # `cached_block_hash_to_block[hash][block_id]` keeps every full block of a
    # hash; a hit is served from the first of them still cached, and evicting
    # one copy removes only that block id.
    cache_duplicate_blocks: bool
    # 0.8.5 "[V1][PP] Continue scheduling prefill chunks": a request may have
    # several batches in flight. 0.8.4: one batch per request
    # (`scheduled_req_ids`), with the engine's `get_num_unscheduled_requests`
    # gate (drive.py `VLLM_0_8_4_LOOP`).
    continue_prefill: bool
    # vLLM 0.33.0's rules (all off in 0.8.x), each read from 0.33.0's source:
    # `BlockPool.free_blocks`: of the blocks a freed table brings to reference
    # count 0, those with no hash (all of them with prefix caching off) go to
    # the HEAD of the free queue in the order given (`prepend_n`: reused
    # first), hashed ones to the tail (`append_n`: LRU). 0.8.x: all to the tail.
    unhashed_blocks_to_head: bool = False
    # `Scheduler.schedule`: `long_prefill_token_threshold` is in force only when
    # `get_request_counts()` gives more than one request (running + waiting),
    # counted once at the start of the call. 0.8.x: always.
    threshold_needs_company: bool = False
    # `Scheduler.schedule`, running loop: a request's tokens are clipped to
    # `max_model_len - num_computed_tokens - num_sampled_tokens_per_step` (1
    # for generation). 0.8.x: `max_model_len - num_computed_tokens`.
    sampled_token_slot: int = 0
    # `KVCacheManager.allocate_slots(full_sequence_must_fit=
    # scheduler_reserve_full_isl)` (on by default): a waiting or preempted
    # request is admitted only if blocks for its whole current sequence
    # (`min(num_tokens, max_model_len)`, less its prefix hit) fit among the
    # free blocks. 0.8.x: only the first chunk's blocks.
    full_sequence_admission: bool = False
    # `check_stop` (v1/core/sched/utils.py): EOS, then `stop_token_ids`, then
    # the length cap. 0.8.x: the length cap first.
    stop_tokens_before_length: bool = False
    # vLLM's own per-request counters (`Request.num_in_flight_tokens`,
    # `num_stale_output_tokens`, `drop_stale_output`): `+= n` in
    # `Scheduler._update_after_schedule`; `_preempt_request` sets the stale
    # share to the in-flight count; `update_from_output` looks the request up
    # by id, takes `n` off both (the stale share only while it is > 0) and
    # decides from them: a stale output is delivered to the PREEMPTED request
    # (deliver mode) or discarded (drop mode). The waiting loop skips a
    # request whose deliver-mode stale share is non-zero (`skip_request`: it
    # keeps its place, requests behind it may be admitted). 0.8.x: no
    # counters (outputs bound by incarnation, resumption at once).
    stale_output_counters: bool = False
    # `Scheduler._update_after_schedule` resets `finished_req_ids` on every
    # `schedule()` call, and 0.33's engine queues every output, empty ones
    # too (`EngineCore.step_with_batch_queue`), so finished ids reach the
    # workers with the next batch, empty or not. 0.8.x: the engine submits
    # only batches with tokens (the reference keeps finished ids for those).
    flush_finished_every_schedule: bool = False
    # Chunked prefill off (`SchedulerConfig.enable_chunked_prefill`) and the
    # admission order; none changes anything at the configuration's defaults.
    # `Scheduler.schedule`, waiting loop (0.33, 0.34): with chunked prefill
    # off, a request whose new tokens (past its hit, after the threshold's
    # clip) exceed the budget left stops the loop; 0.8.x's V1 scheduler has
    # no such test (V1 always chunks, `EngineArgs._set_default_args_v1`).
    unchunked_prefill_stops_admission: bool = False
    # `Scheduler.schedule` (0.34): the long-prefill threshold only with
    # chunked prefill on (`enable_chunked_prefill and num_eligible_reqs > 1`);
    # 0.33 keeps it with chunked prefill off.
    threshold_needs_chunked_prefill: bool = False
    # `Scheduler._reorder_waiting_by_cached_prefix` (0.34, opt-in through
    # `cache_aware_admission_window`, FCFS with prefix caching): before the
    # waiting loop of a call that preempted nobody, with 2+ waiting and
    # `kv_cache_manager.usage >= cache_aware_admission_threshold`, the fresh
    # requests among the first `window` waiting are sorted by their cached
    # prefix (`get_num_cached_tokens`), deepest first, ties in arrival order,
    # into the slots they held (admission_order.py). 0.8.x, 0.33: no knob.
    cache_aware_admission: bool = False
    # vLLM 0.33.0's asynchronous scheduling (`AsyncScheduler`, v1/core/sched/
    # async_scheduler.py, with the V2 model runner under pipeline parallelism K):
    # * output placeholders: `AsyncScheduler._update_after_schedule` adds
    #   `1 + #drafts scheduled` to `num_output_placeholders` for every entry
    #   that is not a prefill chunk (`is_prefill_chunk`, set by
    #   `Scheduler._update_after_schedule`: `num_computed_tokens < num_tokens +
    #   num_output_placeholders` after the advance); `update_from_output` /
    #   `_update_request_with_output` take the returned tokens (and rejected
    #   drafts) off again unless the output is stale; `_preempt_request` resets
    #   them to 0;
    # * `Scheduler.schedule`'s running loop counts them in `num_new_tokens =
    #   num_tokens_with_spec + num_output_placeholders - num_computed_tokens`,
    #   so a decode is scheduled before its previous token exists; it skips a
    #   request when `num_output_placeholders > 0 and num_computed_tokens + 2 -
    #   num_output_placeholders >= num_prompt_tokens + max_tokens` (the
    #   max_tokens guard) and when `current_step < next_decode_eligible_step`
    #   (the decode stagger: a sampling entry sets it to `current_step +
    #   decode_stagger`, `decode_stagger = pipeline_parallel_size`);
    # * `update_from_output` caches the request's blocks up to its settled
    #   tokens (`cache_blocks(request, num_computed_tokens -
    #   num_in_flight_tokens)`) after a live output of a RUNNING request
    #   that had placeholders;
    # * the engine's batch queue is K + 1 deep (`VllmConfig.
    #   max_concurrent_batches` with async scheduling and the V2 runner).
    # No structured outputs (grammars, the deferred sampling of
    # `pending_structured_output_tokens`) are modelled.
    async_scheduling: bool = False
    # `AsyncScheduler._update_after_schedule` (0.33 async): every entry that
    # is not a prefill chunk leaves its request `[-1] * num_spec_tokens_to_schedule`
    # (k) placeholder drafts, filled in on the worker; `schedule()` empties
    # `spec_token_ids` of every running request it schedules (`request.
    # spec_token_ids = []`), and the model's output brings no drafts (the
    # engine's `post_step` does nothing under async scheduling; the output's
    # drafts are rewritten by `update_draft_token_ids_in_output` only for
    # structured outputs, not modelled). 0.8.x and 0.33 sync: the drafts come
    # with the output of the request's sampling entry (update.py).
    placeholder_drafts: bool = False
    # 0.33 `Scheduler.update_from_output`: with drafts configured
    # (`self.num_spec_tokens > 0`) a live output of a RUNNING request caches
    # the blocks of its settled tokens (`cache_blocks(request,
    # num_computed_tokens - num_in_flight_tokens)`), after
    # `_update_request_with_output` trimmed `num_computed_tokens` to the
    # tokens kept at a stop, as under async scheduling (whose placeholders
    # make it do so without drafts too). 0.8.x: neither.
    settles_blocks_with_drafts: bool = False
    # 0.33 `Scheduler.schedule`, waiting loop ("Pad new decode requests to
    # uniform spec decoding size"): with k drafts configured, a request
    # admitted with exactly one token to compute, when the running loop
    # scheduled no request whose last entry was a prefill chunk and either
    # it scheduled some running request or the admission has a prefix hit,
    # is scheduled as `1 + k` tokens, the k placeholder drafts (`[-1] * k`)
    # included, if `num_computed_tokens + 1 + k + 1 <= max_model_len`; if
    # those do not fit the token budget, admission stops there ("Prefer to not
    # schedule than schedule un-padded"). A long-prefill threshold below 1 + k
    # then clips it, where vLLM asserts `num_new_tokens == 1 +
    # num_spec_tokens`: the reference schedules the drafts the clip leaves, as
    # the spec does. 0.8.x: no padding.
    pads_admitted_decodes: bool = False
    # The engine-core loop the version ships (drive.py `EngineLoop` by name).
    engine_loop: str = "vllm-0.8.5"
    # --- The KV connector (docs/kv-connector.md, "What each vLLM version
    # has"; connector.py, kv_transfer.py, kv_waiting.py). A sync external hit
    # (counted as computed at schedule time, loaded by the batch) exists in
    # every version and needs no constant. Each row below is read from
    # 0.33.0's and 0.34.0's `v1/core/sched/scheduler.py`; 0.8.x has none.
    # `Scheduler.schedule`, waiting loop: `get_num_new_matched_tokens` ->
    # `(n, True)` allocates, parks the request in WAITING_FOR_REMOTE_KVS and
    # skips it; `_handle_blocked_waiting_request` / `_update_waiting_for_remote_kv`
    # promote it once `finished_recving` came. 0.8.x: an async offer is taken
    # as a sync one (its connector API returns a count only).
    kv_async_loads: bool = False
    # `update_from_output`: `_handle_failed_recving` (request level) and
    # `_handle_invalid_blocks` (block level), `kv_load_failure_policy`.
    kv_load_failures: bool = False
    # `_free_request` / `_connector_finished`: `request_finished` may return
    # `delay_free`, and the blocks stay held until `finished_sending`
    # (`_update_from_kv_xfer_finished`). 0.8.5's `_free_request` frees at once.
    kv_send_after_finish: bool = False
    # `finish_requests`: an aborted load's blocks are held until its
    # `finished_recving` (`delay_free_blocks`).
    kv_aborted_load_held: bool = False
    # `defer_block_free` (consumer role and `max_concurrent_batches > 1`):
    # `_request_blocks_can_be_freed`, `_free_request_blocks`,
    # `deferred_frees`, `_drain_deferred_frees`, and the running loop's
    # "a deferred free will not help" stop.
    kv_step_fence: bool = False
    # `kv_holding_waiting`: waiting requests holding blocks (loads) are
    # drained before `waiting` (`_holds_kv_blocks`, `skip_request`).
    kv_holding_first: bool = False
    # `_inflight_prefill_reserved_blocks`: an async load is admitted only if
    # it fits in the free blocks less what in-flight prefills and parked
    # loads still need (`reserved_blocks`, `_request_remaining_blocks`).
    kv_load_reservation: bool = False
    # `_preempt_request(drop_stale_output=self.requires_kv_delivery)`: a
    # producer's preemption drops the victim's in-flight output.
    kv_producer_drops_stale: bool = False
    # `SchedulingPolicy.PRIORITY` (`SchedulerConfig.scheduling_policy`, priority.py):
    # `waiting` in (priority, arrival time) order (`PriorityRequestQueue`),
    # the running loop's victim `max(running, key=(priority, arrival_time))`
    # with the hand-back of what it got in the same call and
    # `victim_index < req_index` (0.33, 0.34: the same code). 0.8.x: none.
    priority_policy: bool = False
    # `Scheduler.__init__` / `schedule` (0.33, 0.34): the local prefill cadence
    # (`SchedulerConfig.prefill_schedule_interval` > 1 without data
    # parallelism; cadence.py). 0.8.x: none.
    prefill_cadence: bool = False
    # A drafter with its own forward pass (0.33, 0.34 `Scheduler.schedule`):
    # `allocate_slots(num_lookahead_tokens=...)` past every entry but an async
    # KV load's (`limit_lookahead_tokens`), and the draft model's
    # `max_num_new_slots_for_drafting` charged to `input_budget` per entry
    # (batch.py). `SchedulerConfig.num_lookahead_tokens` and
    # `draft_input_slots` are refused under a profile without it. 0.8.x: none.
    lookahead_slots: bool = False
    # `Scheduler.can_skip_drafts` (lookahead slots on): `skip_drafts` when no
    # entry can use the drafts proposed after the batch (batch.py
    # `drafts_unused`). 0.34: always; 0.33: only with the V2 model runner
    # (`vllm_config.use_v2_model_runner`), which the bridge runs async.
    skips_unused_drafts: bool = False
    # 0.34 only: `async_kv_waiting` (`_enqueue_waiting_request`,
    # `_next_waiting_queue`), loads-only mode when no running slot or budget
    # is left, `max_num_inflight_kv_loads` (`_admits_inflight_kv_load`, the
    # aborted loads `_aborted_kv_loads` counted against it).
    kv_async_waiting_queue: bool = False
    # 0.34 only: a session's next input sets its prefix-cache limit from the
    # input's sampling parameters (`_update_request_as_session` recomputes
    # `prefix_cache_hit_limit`); 0.33 keeps `skip_reading_prefix_cache` as
    # the first input set it (sessions.py `_take_input`).
    session_input_sets_cache_limit: bool = False
    # `reset_prefix_cache(reset_running_requests=True)`: every running
    # request preempted with `_preempt_request(drop_stale_output=True)`, then
    # `BlockPool.reset_prefix_cache` (reset_pause.py) (0.33, 0.34).
    reset_drops_running_output: bool = False
    # `PauseState` / `set_pause_state`: PAUSED_ALL schedules nothing,
    # PAUSED_NEW admits only `kv_holding_waiting` (`schedule`,
    # `get_num_unfinished_requests`) (0.33, 0.34).
    pause_states: bool = False
    # --- vLLM as released, where the reference carries a later fix (its
    # named deviations, reference/README.md). Off in every profile; a
    # released variant (`released_profile`, `SchedulerConfig(as_released=True)`)
    # switches on those of its version, and the differential's conforming run
    # (flightcheck/vllm/differential.py) must then equal vLLM event for event.
    # 0.8.x `Scheduler.update_from_output` walks `self.running`: an output goes
    # to the RUNNING request of its id, whatever its incarnation, and is
    # dropped otherwise (`orphaned_token_kept`, `stale_token_dropped`). The
    # reference binds it to the incarnation it was scheduled for (#20739).
    outputs_to_running_by_id: bool = False
    # 0.8.x `Scheduler.update_from_output` takes `sampled_token_ids[req_index]`
    # as the model runner returned them; the reference takes a token only
    # where the batch's snapshot says the entry samples
    # (`partial_chunk_token_dropped`).
    worker_decides_sampling: bool = False
    # 0.8.x `Scheduler.update_from_output`: `request.spec_token_ids =
    # spec_token_ids[req_index]` for every RUNNING request the batch
    # scheduled, one that sampled nothing (a partial chunk) included; the
    # reference sets the drafts only where it appends tokens
    # (`unscheduled_drafts_dropped`).
    drafts_from_every_output: bool = False
    # 0.8.x `Scheduler.schedule`, running loop: `spec_token_ids` is trimmed
    # to the drafts scheduled only when `num_scheduled_spec_tokens > 0`; the
    # reference (as 0.33's `schedule()`) drops the unscheduled ones always
    # (`unscheduled_drafts_dropped`).
    unscheduled_drafts_kept: bool = False
    # 0.8.x `Scheduler.schedule`, preemption: only the status and
    # `num_computed_tokens` are reset, so the request holds its drafts to its
    # resumption (0.33's `_preempt_request` clears them). On in the 0.8.x
    # profiles, as in the spec's (`Profile.held_drafts_left_uncached`): the
    # resumption's allocation leaves them uncached; the admission then drops
    # them unless `unscheduled_drafts_kept` (`_admit`).
    drafts_kept_through_preemption: bool = False
    # 0.8.x `KVCacheManager.allocate_slots` caches `num_computed_tokens +
    # num_tokens - len(request.spec_token_ids)` tokens: every draft the
    # request holds is left out, scheduled or not (0.33 leaves out the
    # drafts scheduled). On in the 0.8.x profiles, as in the spec's.
    held_drafts_left_uncached: bool = False
    # 0.8.x `KVCacheManager.allocate_slots` / `BlockPool.cache_full_blocks`
    # (0.8.4 and 0.8.5 alike): that count can be negative (a request resumed
    # holding more drafts than the tokens it is given), and the slice
    # `blocks[num_cached_blocks:num_full_blocks]` then runs to that many
    # blocks before the table's end, caching them; the count is recorded.
    # The reference caches nothing for a count below the cached one. On in
    # the released 0.8.x profiles (a vLLM bug: the blocks past the tokens
    # scheduled can be cached before their KV is written).
    caches_through_a_negative_count: bool = False
    # The same missing clip seen from the blocks (on in the 0.8.4 profile, as
    # in the spec's): `allocate_slots` is asked for blocks for every held
    # draft, past max_model_len too, and a request that cannot have them is
    # preempted; when it can, the entry is still clipped (drafts.py
    # `_unclipped_demand_fits`).
    demands_blocks_past_max_model_len: bool = False
    # 0.8.4 `Scheduler.schedule`, running loop: no `max_model_len -
    # num_computed_tokens` clip (0.8.5 added it, "necessary when using spec
    # decoding"), so drafts are scheduled past max_model_len
    # (`drafts_clipped_to_max_model_len`).
    no_max_model_len_clip: bool = False
    # 0.8.4 drops a request's `scheduled_req_ids` mark only in
    # `update_from_output` and in `finish_requests` of a RUNNING request: a
    # preempted request, or an aborted waiting one, keeps it (the counter
    # drift; `inflight_mark_cleared_on_preemption`).
    in_flight_mark_kept_off_running: bool = False
    # 0.33 `Scheduler.update_from_output` looks the output up by id alone
    # (`self.requests.get(req_id)`), so a batch of an older request whose id
    # was reused while it was in flight settles the new request's counters
    # and gives it its token (`reused_id_output_dropped`; the reference drops
    # it). Read where the output is bound (`_fate_by_counters`) and where the
    # trace reads the fate beforehand (`_predicted_fate`: the counters alone).
    outputs_by_id_alone: bool = False
    # 0.33 with synchronous scheduling: `EngineCore.post_step`, in the engine
    # step that submitted a batch, hands the drafts proposed for it
    # (`take_draft_token_ids`) to `Scheduler.update_draft_token_ids` before
    # that batch completes (a request whose entry was a prefill chunk,
    # `is_prefill_chunk`, drops its drafts), `schedule()` empties the drafts
    # of every running request it schedules, and the output brings none; with
    # pipeline parallelism the next `schedule()` then schedules a request's
    # proposed drafts beyond those in flight at once, on top of its sampling
    # entry in flight (the ground truth's double sample). The reference takes
    # the drafts with the output (`drafts_handed_over_at_submission`).
    drafts_handed_over_at_submission: bool = False
    # 0.33/0.34 `update_from_output`: a load failed under
    # `kv_load_failure_policy="fail"` finishes its request (`finish_requests`
    # with FINISHED_ERROR) after the batch's outputs, its entries skipped
    # meanwhile; the reference finishes it when the failure is seen, as an
    # abort (`kv_error_finished_after_outputs`: the blocks go in another order).
    kv_errors_after_outputs: bool = False
    # 0.33/0.34 `_update_requests_with_invalid_blocks` (recompute policy): a
    # running request whose sync load failed gets `num_computed_tokens` set
    # back and nothing else: the failing batch's output is skipped, its other
    # batches in flight are applied, its output placeholders kept (#49250),
    # and the valid prefix is taken from `num_computed_tokens` less the
    # failing batch's tokens alone (one batch in flight). The reference drops
    # all its work in flight and resets the placeholders
    # (`kv_rollback_keeps_placeholders_pr49250`, `kv_rollback_base_assumes_one_batch`).
    kv_rollback_in_place: bool = False
    # 0.33/0.34 `Scheduler.schedule`, waiting loop: an admission padded to
    # 1 + k tokens is cut by `long_prefill_token_threshold` afterwards, and
    # the loop then asserts `num_new_tokens == 1 + self.num_spec_tokens`
    # (0.34.0 scheduler.py:1643, 0.33.0 :1579): schedule() raises and the
    # engine dies. The reference schedules the cut admission with the drafts
    # that fit (`padded_admission_cut_by_threshold`; waiting.py `_pad_drafts`).
    padding_asserted_whole: bool = False

    def release_order(self, enable_prefix_caching: bool) -> str:
        """"reverse" or "forward": the order a released table joins the free queue."""
        reversed_ = (self.release_reversed_with_caching if enable_prefix_caching
                     else self.release_reversed_without_caching)
        return "reverse" if reversed_ else "forward"


PROFILES: dict[str, Profile] = {
    "vllm-0.8.5": Profile("vllm-0.8.5", num_preallocate_tokens=0,
                          release_reversed_with_caching=True,
                          release_reversed_without_caching=False,
                          cache_duplicate_blocks=True, continue_prefill=True,
                          drafts_kept_through_preemption=True, held_drafts_left_uncached=True),
    "vllm-0.8.4": Profile("vllm-0.8.4", num_preallocate_tokens=64,
                          release_reversed_with_caching=True,
                          release_reversed_without_caching=False,
                          cache_duplicate_blocks=True, continue_prefill=False,
                          engine_loop="vllm-0.8.4", demands_blocks_past_max_model_len=True,
                          drafts_kept_through_preemption=True, held_drafts_left_uncached=True),
    # vLLM 0.33.0, synchronous scheduling (the V1 model runner under pipeline
    # parallelism; deliver mode unless `SchedulerConfig.drop_stale_output`).
    # `SingleTypeKVCacheManager.free` reverses the table with prefix caching
    # on or off; `BlockHashToBlockMap.insert` still keeps a second block of
    # one hash (`get_one_block` serves the first).
    "vllm-0.33": Profile("vllm-0.33", num_preallocate_tokens=0,
                         release_reversed_with_caching=True,
                         release_reversed_without_caching=True,
                         cache_duplicate_blocks=True, continue_prefill=True,
                         unhashed_blocks_to_head=True, threshold_needs_company=True,
                         sampled_token_slot=1, full_sequence_admission=True,
                         stop_tokens_before_length=True, stale_output_counters=True,
                         flush_finished_every_schedule=True,
                         settles_blocks_with_drafts=True, pads_admitted_decodes=True,
                         engine_loop="vllm-0.33", unchunked_prefill_stops_admission=True),
}
# vLLM 0.33.0 with asynchronous scheduling: `AsyncScheduler` and the V2
# model runner, the default for single-node pipeline parallelism
# (`VllmConfig.__post_init__` turns `async_scheduling=None` on when the
# runner supports it; `max_concurrent_batches` is then K + 1). Everything
# of `vllm-0.33` plus the async rules above; the engine loop is 0.33's
# `EngineCore.step_with_batch_queue` at depth K + 1 (drive.py).
# vLLM 0.33.0's KV connector rules (both schedulers; the constants above).
KV_CONNECTOR_0_33: dict[str, bool] = {
    "kv_async_loads": True, "kv_load_failures": True, "kv_send_after_finish": True,
    "kv_aborted_load_held": True, "kv_step_fence": True, "kv_holding_first": True,
    "kv_load_reservation": True, "kv_producer_drops_stale": True, "priority_policy": True}
PROFILES["vllm-0.33"] = replace(PROFILES["vllm-0.33"], **KV_CONNECTOR_0_33,
                               reset_drops_running_output=True, pause_states=True, prefill_cadence=True,
                               lookahead_slots=True)
PROFILES["vllm-0.33-async"] = replace(PROFILES["vllm-0.33"], name="vllm-0.33-async",
                                      async_scheduling=True, placeholder_drafts=True,
                                      engine_loop="vllm-0.33-async", skips_unused_drafts=True)
# vLLM 0.34.0, sync and async: 0.33.0's rules, each re-read in 0.34.0's source
# (the spec's profiles.py VLLM_0_34 lists where); the engine loop is 0.33's
# `step_with_batch_queue`, which 0.34 keeps but for how it waits for a
# batch's output (`EngineCoreProc._wait_for_output`). What 0.34 changes is
# added as constants of its own.
# 0.34's own (`Scheduler.schedule`, `_reorder_waiting_by_cached_prefix`):
# the threshold only with chunked prefill, and the cache-aware admission order.
VLLM_0_34_RULES: dict[str, bool] = {"threshold_needs_chunked_prefill": True, "cache_aware_admission": True,
                                    "kv_async_waiting_queue": True, "session_input_sets_cache_limit": True}
# 0.34 removed the V1 model runner, so its sync scheduler skips unused drafts
# too (`can_skip_drafts = num_lookahead_tokens > 0`; 0.33's also asks for
# `use_v2_model_runner`, which only its async runs use): the one rule the
# sync pair changes beyond VLLM_0_34_RULES (0.33-async has it already).
VLLM_0_34_SYNC_RULES: dict[str, bool] = {"skips_unused_drafts": True}
PROFILES["vllm-0.34"] = replace(PROFILES["vllm-0.33"], name="vllm-0.34", **VLLM_0_34_RULES, **VLLM_0_34_SYNC_RULES)
PROFILES["vllm-0.34-async"] = replace(PROFILES["vllm-0.33-async"], name="vllm-0.34-async", **VLLM_0_34_RULES)


# vLLM 0.8.x as released: the reference's later fixes switched off (the
# deviations above), and finished ids cleared by every `schedule()` call
# (0.8.x `Scheduler.schedule`: `self.finished_req_ids = set()` after building
# the output; its engine submits only outputs with tokens, so those of an
# empty one are lost: `engine_blocked_in_flight`).
RELEASED_0_8_X: dict[str, bool] = {
    "outputs_to_running_by_id": True, "worker_decides_sampling": True,
    "drafts_from_every_output": True, "unscheduled_drafts_kept": True,
    "flush_finished_every_schedule": True, "caches_through_a_negative_count": True}
# vLLM 0.33.0 as released: outputs bound by id alone, and the model runner
# decides what sampled (after a wrong binding the request holds a token its
# snapshot did not count).
RELEASED_0_33: dict[str, bool] = {"outputs_by_id_alone": True, "worker_decides_sampling": True,
                                  "kv_errors_after_outputs": True, "kv_rollback_in_place": True,
                                  "padding_asserted_whole": True}
# ... and with synchronous scheduling, drafts handed over at submission.
RELEASED_0_33_SYNC: dict[str, bool] = {**RELEASED_0_33, "drafts_handed_over_at_submission": True}
RELEASED: dict[str, Profile] = {
    "vllm-0.8.5": replace(PROFILES["vllm-0.8.5"], **RELEASED_0_8_X),
    "vllm-0.8.4": replace(PROFILES["vllm-0.8.4"], **RELEASED_0_8_X, no_max_model_len_clip=True,
                          in_flight_mark_kept_off_running=True),
    "vllm-0.33": replace(PROFILES["vllm-0.33"], **RELEASED_0_33_SYNC),
    "vllm-0.33-async": replace(PROFILES["vllm-0.33-async"], **RELEASED_0_33),
    # 0.34.0's `update_from_output` still binds an output by id alone.
    "vllm-0.34": replace(PROFILES["vllm-0.34"], **RELEASED_0_33_SYNC),
    "vllm-0.34-async": replace(PROFILES["vllm-0.34-async"], **RELEASED_0_33),
}


def released_profile(name: str) -> Profile:
    """The profile `name` as vLLM released it (`RELEASED`)."""
    try:
        return RELEASED[name]
    except KeyError:
        raise ValueError(f"profile {name!r} has no released variant; known: {sorted(RELEASED)}") from None


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; known: {sorted(PROFILES)}") from None
