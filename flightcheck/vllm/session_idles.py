"""Whether an idle of vLLM's scheduler beside a streaming session parked for
input is that session's client's to end, read on vLLM's own state (the
ground truth of run_endings.py `stalled_until_input`; check-trace's L2 reads
the same rule in the spec: spec/deadlock.py). Standard library only.

What a parked session holds, in vLLM 0.33.0 and 0.34.0
(`vllm/v1/core/sched/scheduler.py`): its KV blocks (`_handle_stopped_request`
frees none; it waits in `kv_holding_waiting` while it has computed tokens)
and a seat (the waiting loop admits nobody while `len(self.running) +
self.num_waiting_for_streaming_input >= self.max_num_active_reqs`, "Paused
streaming sessions ... still hold a model-runner request slot"). No LoRA
slot: `scheduled_loras` is read from `self.running` alone. The end of the
session (`add_request` with no update: `finish_requests(FINISHED_ABORTED)`)
gives both back; a next turn runs and parks again, holding them anew.

So with nothing running (every unfinished request waits for the waiting
loop, which never preempts) the parked sessions hold the way when the head
of the waiting loop's queues could be admitted with their seats and blocks
given back, and they fill the seats, or the head cannot get the blocks it
needs from the free pool alone (`allocate_slots` returns None and the loop
breaks). A request that runs
is not stopped by either (the running loop counts no seat, and preempts
when blocks are short): such an idle is a stall whatever is parked.

Read approximately: the head's need is its whole sequence's blocks where
`scheduler_reserve_full_isl` holds (the admission gate), else its next
chunk's, past its local prefix-cache hit (a fresh admission's lookup), its
remaining tokens cut at the token budget and the static long-prefill
threshold where chunked prefill is on, or padded to 1 + k with drafts
(vLLM's adaptive threshold and a sync load's external hit are not
replayed here); an async load's need is its loaded tokens' blocks beside
the blocks `allocate_slots(reserved_blocks=...)` keeps free (`_async_load`);
the blocks the end would free are those only parked sessions reference (a
KV connector that delays a finished request's free is not asked).
check-trace's L2 is the exact rule; a difference would show in a campaign
as a disagreement.
"""

from __future__ import annotations

from typing import Any

from .compat import queued_requests

PARKED = "WAITING_FOR_STREAMING_REQ"


def parked_sessions_hold_the_way(scheduler: Any) -> bool:
    """Nothing runs, a session is parked, and its seat or blocks are what
    keeps the waiting loop from admitting (module docstring). False where
    vLLM's state cannot be read so (the reference's scheduler)."""
    if not all(hasattr(scheduler, name) for name in ("num_waiting_for_streaming_input", "block_size",
                                                     "kv_cache_manager")):
        return False                           # not vLLM's scheduler (the reference's keeps other names)
    parked = [r for r in scheduler.requests.values() if getattr(r.status, "name", "") == PARKED]
    if not parked or scheduler.running:
        return False
    manager, head = scheduler.kv_cache_manager, admission_head(scheduler)
    if head is None:
        return False
    free, need = int(manager.block_pool.get_num_free_blocks()), blocks_to_admit(scheduler, head)
    if need > free + blocks_only_parked_hold(manager, parked):
        return False                           # their end would not admit the head either
    seats = getattr(scheduler, "max_num_active_reqs", None) or getattr(scheduler, "max_num_running_reqs", None)
    need_now = need - sum(1 for block in _prefix_hit(manager, head) if getattr(block, "ref_cnt", 0) > 0)
    return (seats is not None and len(parked) >= seats) or free < need_now    # their seats, or their blocks


def admission_head(scheduler: Any) -> Any | None:
    """The first request the waiting loop would try to admit: the queues in
    the loop's order (`kv_holding_waiting` drained first), passing over what
    `_handle_blocked_waiting_request` holds back (a parked session, a
    grammar still compiling or a remote KV load still to come) and a resumption deferred
    behind deliver-mode stale output (`num_stale_output_tokens and not
    drop_stale_output`)."""
    for name in ("kv_holding_waiting", "waiting", "async_kv_waiting"):
        queue = getattr(scheduler, name, None)
        for request in queued_requests(queue) if queue is not None else ():
            if _held_back(scheduler, request):
                continue
            if getattr(request, "num_stale_output_tokens", 0) and not getattr(request, "drop_stale_output", False):
                continue
            return request
    return None


def _held_back(scheduler: Any, request: Any) -> bool:
    """Whether `_handle_blocked_waiting_request` (0.33.0/0.34.0) skips the
    request: parked for input, its grammar still compiling, its remote KV
    not received. A status is not enough: vLLM promotes a settled grammar
    or a received load to WAITING only when the loop reaches the request,
    so one the parked sessions' seats keep the loop from reaching still
    reads WAITING_FOR_... (campaign --versions 0.34.0,0.33.0 --all-features
    --reuse-ids seed 309 index 78: r2's grammar compiled at engine step 5,
    r1 parked holding the one seat from step 8). A failed grammar is no
    hold either: the loop that reaches it records the error, which the next
    update finishes (`_grammar_failed`), so a seat kept from it holds the
    way (seeds 331 index 12, 332 index 69: r1's failed grammar behind the
    one seat a parked session held, a stall to the ground truth until the
    session's end, which the failed request's finish followed)."""
    status = getattr(request.status, "name", "")
    if status == "WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR":
        structured = getattr(request, "structured_output_request", None)
        return structured is None or structured.grammar is None    # .grammar settles a done Future, as vLLM's read
    if status == "WAITING_FOR_REMOTE_KVS":
        return request.request_id not in getattr(scheduler, "finished_recving_kv_req_ids", ())
    return status.startswith("WAITING_FOR_")


def _grammar_failed(request: Any) -> bool:
    """Whether the request's grammar failed to compile: the waiting loop
    that reaches it records the error (`_handle_blocked_waiting_request`:
    `grammar_compile_error_reqs`) and the next `update_from_output`
    finishes it, so it moves on with a seat and no blocks."""
    structured = getattr(request, "structured_output_request", None)
    return (getattr(request.status, "name", "") == "WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR"
            and structured is not None and isinstance(structured.grammar, Exception))


def blocks_to_admit(scheduler: Any, request: Any) -> int:
    """Free blocks `allocate_slots` asks for to admit the request (nothing
    running: no watermark): its next chunk's past its prefix-cache hit
    (`_prefix_hit`; remaining tokens cut at the token budget and the static
    long-prefill threshold, or padded, `_padded_chunk`, plus the lookahead
    slots; the threshold only with `enable_chunked_prefill`, as `schedule()`
    reads it) and, with `scheduler_reserve_full_isl`, its whole sequence's
    (`full_sequence_must_fit`), less the blocks it holds; the hit's blocks
    counted as once the parked sessions' end frees them (a hit block another
    request holds is not asked of the free pool: `get_num_blocks_to_allocate`
    counts only an evictable one). 0 for a request whose grammar failed: the
    loop finishes it without allocating."""
    if _grammar_failed(request):
        return 0
    config = getattr(scheduler, "scheduler_config", None)
    budget = getattr(scheduler, "max_num_scheduled_tokens", None) or getattr(config, "max_num_batched_tokens", 0)
    chunked = getattr(config, "enable_chunked_prefill", True)     # unchunked, schedule() reads the threshold as 0
    threshold = int(getattr(config, "long_prefill_token_threshold", 0) or 0) if chunked else 0
    max_len = int(getattr(scheduler, "max_model_len", 0) or getattr(scheduler.kv_cache_manager, "max_model_len", 0))
    hit_blocks = _prefix_hit(scheduler.kv_cache_manager, request)
    computed = int(request.num_computed_tokens) or len(hit_blocks) * int(scheduler.block_size)
    total = int(request.num_tokens)
    remaining = total - computed
    chunk = min(x for x in (remaining, budget or remaining, threshold or remaining) if x > 0) if remaining > 0 else 0
    chunk = _padded_chunk(scheduler, computed, remaining, max_len) or chunk
    end = computed + chunk + int(getattr(scheduler, "num_lookahead_tokens", 0) or 0)
    loaded, reserved = _async_load(scheduler, request, computed)
    if loaded:
        end = computed + loaded                # no token scheduled, no lookahead slot during the load
    if getattr(scheduler, "scheduler_reserve_full_isl", False):
        end = max(end, total)
    end = min(end, max_len) if max_len else end
    held = _real_blocks(scheduler.kv_cache_manager, request.request_id)
    return max(0, -(-end // int(scheduler.block_size)) - len(held)) + reserved


def _async_load(scheduler: Any, request: Any, local: int) -> tuple[int, int]:
    """(tokens, reserved blocks) of the async load the connector would start
    for a fresh admission past `local` computed tokens; (0, 0) where it
    starts none. The waiting loop (0.33.0/0.34.0 `Scheduler.schedule`,
    `load_kv_async`) schedules no token and no lookahead slot then, and
    `allocate_slots(reserved_blocks=...)` admits the load only into the free
    blocks less the other loads' and prefills' reservation
    (`_inflight_prefill_reserved_blocks`) and one spec-decode step's
    blocks (`_spec_decode_step_blocks`, cdiv(1 + k + lookahead, block
    size)). Read from the workload's connector (`flightcheck_offer`, what
    it offers; `may_load_async`, whether it still would). (Seed 390 index
    161, `--versions 0.34.0 --all-features --spec-tokens 1 --lookahead
    --stages 1`: r3's 2-token load, 1 block, beside 1 free and the 1 block
    of the margin, waited for a parked session's end, a stall to the ground
    truth that check-trace's L2 rightly accepted.)"""
    connector = getattr(scheduler, "connector", None)
    if int(request.num_computed_tokens) or not all(hasattr(connector, name) for name in ("flightcheck_offer",
                                                                                          "may_load_async")):
        return 0, 0
    hit, load_async = connector.flightcheck_offer(request)
    if not (load_async and connector.may_load_async(request)):
        return 0, 0
    loaded = min(int(hit), int(request.num_tokens) - local)   # `local`: whole blocks, as the connector is shown
    if loaded <= 0:
        return 0, 0
    in_flight = getattr(scheduler, "_inflight_prefill_reserved_blocks", None)
    return loaded, (int(in_flight()) if in_flight is not None else 0) + int(
        getattr(scheduler, "_spec_decode_step_blocks", 0) or 0)


def _prefix_hit(manager: Any, request: Any) -> list[Any]:
    """The blocks of the local prefix-cache hit the waiting loop would adopt:
    looked up only for a request with nothing computed (`schedule()`'s
    `get_computed_blocks`, the last token always recomputed), read with
    the coordinator's `find_longest_cache_hit`, which takes no reference
    (0.33.0/0.34.0 `KVCacheManager.get_computed_blocks`). Empty where the
    lookup is off (prefix caching, a request that skips the cache) or the
    manager cannot be read so."""
    if int(request.num_computed_tokens) or not getattr(manager, "coordinator", None):
        return []
    enabled = getattr(manager, "prefix_cache_lookup_enabled", None)
    if not (enabled(request) if enabled is not None else getattr(manager, "enable_caching", False)):
        return []
    groups, _, _ = manager.coordinator.find_longest_cache_hit(request.block_hashes, int(request.num_tokens) - 1)
    return [block for block in (groups[0] if groups else ()) if not getattr(block, "is_null", False)]


def _padded_chunk(scheduler: Any, computed: int, remaining: int, max_len: int) -> int:
    """1 + k where the waiting loop pads an admission to a uniform spec
    decode (0.33.0/0.34.0 `Scheduler.schedule`, "Pad new decode requests"):
    drafts on (no dynamic schedule), one token left past something computed
    (the hit, a landed load, a session's turn) and room for the sampled
    token; nothing running or scheduled before it, as an idle is. Else 0.
    (Seed 372 index 85, `--all-features --spec-tokens 3 --lookahead
    --stages 1`, 0.34.0 sync: preempted r4's 12-token hit left 1 token,
    padded to 4, with 3 lookahead slots 10 blocks where the 8 free and the
    parked session's 8 were read as 8, a stall to the ground truth.)"""
    k = int(getattr(scheduler, "num_spec_tokens", 0) or 0)
    if k <= 0 or getattr(scheduler, "dynamic_sd_lookup", None) is not None or remaining != 1 or computed <= 0:
        return 0
    sampled = int(getattr(scheduler, "num_sampled_tokens_per_step", 1))
    return 1 + k if sampled > 0 and (not max_len or computed + 1 + k + sampled <= max_len) else 0


def blocks_only_parked_hold(manager: Any, parked: list[Any]) -> int:
    """The blocks the end of every parked session would return to the free
    pool: those no one but parked sessions references."""
    holders: dict[int, int] = {}
    blocks: dict[int, Any] = {}
    for session in parked:
        for block in _real_blocks(manager, session.request_id):
            holders[block.block_id] = holders.get(block.block_id, 0) + 1
            blocks[block.block_id] = block
    return sum(1 for block_id, count in holders.items() if blocks[block_id].ref_cnt <= count)


def _real_blocks(manager: Any, req_id: str) -> list[Any]:
    """The request's blocks of the first KV cache group, the null block left out."""
    groups = manager.get_blocks(req_id).blocks
    return [block for block in (groups[0] if groups else ()) if not getattr(block, "is_null", False)]
