"""The properties the spec must satisfy: safety invariants S1-S12 (docs/vllm-semantics.md
§"Properties a correct scheduler keeps", restated for the spec in spec/README.md
§Properties), the liveness properties L1-L3 in a safety form a
solver can prove, deadlock freedom, transition properties, and "sometimes"
targets that make a spec that can do nothing fail loudly.

Each invariant holds of a state, `Invariant.holds(state, cfg)`, and states
itself in one English line; it is the conjunction of parts, one per request,
one per in-flight batch and one for the rest (see below). Transition properties take `(before, after, step)`
where `step` names the action. Liveness proper (every run ends with every
request finished) needs the whole state graph and lives in
`verification/explicit/search.py`; here it appears as the local facts it rests on.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable

from .blocks import cdiv
from .config import Config
from .grammar import g1_no_run_while_compiling, g2_fsm_tracks_output, g3_fsm_never_refuses
from .lora import has_lora_cap, lora1_loras_within_cap
from .kv_invariants import (holds_kv_blocks, kv1_no_reuse_under_transfer, kv2_loading_not_scheduled,
                            kv4_deferred_frees_drain, kv4_finished_holds_nothing, kv5_loaded_not_starved,
                            kv6_load_limit, may_hold_table)
from .pool_store import label_list
from .priority_invariants import kv_holding_in_priority_order, waiting_in_priority_order
from .session_invariants import (sa10_applies, sa10_stale_preemption_leaves_a_seat, ss2_old_turn_given_up,
                                 ss3_waiting_session_holds_blocks, ss4_waiting_session_keeps_seat,
                                 ss5_session_queues_in_priority_order)
from .sessions import has_sessions
from .deadlock import l2_async_no_deadlock, l2_no_deadlock, l3_drain
from .state import WAITING_STATUSES, Batch, BlockPool, Fate, State, Status, content_label


# Each invariant is written in parts, so that a checker that knows what one
# transition touched can check only that (verification/traces/incremental.py):
# * a request part `(state, cfg, r) -> bool`, about request r and its in-flight
#   entries; it reads nothing another request's transition changes;
# * a batch part `(state, cfg, batch) -> bool`, about one in-flight batch's
#   snapshot, which never changes while it is in flight (S4);
# * a state part `(state, cfg) -> bool`: the rest (queues, the pool, the FIFO).
# The invariant itself is their conjunction over every request and every
# batch (`Invariant.holds`): the one definition every checker uses.


def counters_in_bounds(s: State, cfg: Config, r: int) -> bool:
    q = s.requests[r]
    if not q.status.is_active:
        return True
    if not 0 <= q.num_computed <= q.num_tokens + q.num_drafts + q.placeholders:
        return False
    return q.status is Status.RUNNING or q.num_computed == 0 or holds_kv_blocks(q)


def within_length_caps(s: State, cfg: Config, r: int) -> bool:
    q = s.requests[r]
    if q.num_output > max(q.max_tokens, 0) or q.num_tokens > cfg.max_model_len:
        return False
    if q.status.awaits_client:
        return True                       # a session stopped at the end of its turn
    return not (q.status.is_active and (q.num_output >= q.max_tokens or q.num_tokens >= cfg.max_model_len))


def batch_within_max_model_len(s: State, cfg: Config, batch: Batch) -> bool:
    return all(e.end <= cfg.max_model_len for e in batch)


def live_ranges_contiguous(s: State, cfg: Config, r: int) -> bool:
    q = s.requests[r]
    if not q.status.is_active:
        return True
    live = s.entries_of(r)
    if not live:
        return True
    if any(e.n < 1 for e in live) or any(a.end != b.start for a, b in zip(live, live[1:])):
        return False
    return live[-1].end == q.num_computed


def samples_exactly_at_known_tokens(s: State, cfg: Config, r: int) -> bool:
    num_tokens = s.requests[r].num_tokens
    for e in s.entries_of(r):
        reach = e.end - e.drafts
        if reach > num_tokens or e.n <= e.drafts or e.samples != (reach == num_tokens) \
                or (e.drafts > 0 and not e.samples):
            return False
    return True


def one_live_sampling_entry_last(s: State, cfg: Config, r: int) -> bool:
    if not s.requests[r].status.is_active:
        return True
    live = s.entries_of(r)
    return not any(e.samples for e in live[:-1])


def entries_bound_to_their_incarnation(s: State, cfg: Config, r: int) -> bool:
    status = s.requests[r].status
    for e in s.entries_of(r, fate=None):
        if e.fate is Fate.LIVE and status is not Status.RUNNING:
            return False
        if e.fate is Fate.ORPHANED and (status is not Status.PREEMPTED or s.entries_of(r)):
            return False
    return True


def batch_holds_each_request_once(s: State, cfg: Config, batch: Batch) -> bool:
    return len({e.req for e in batch}) == len(batch)


def rejected_drafts_subtracted(s: State, cfg: Config, r: int) -> bool:
    q = s.requests[r]
    if not q.status.is_active:
        return True
    if q.num_drafts > cfg.num_spec_tokens:
        return False
    return not (q.status is Status.RUNNING and not s.entries_of(r) and q.num_computed >= q.num_tokens)


def drafts_within_k(s: State, cfg: Config, batch: Batch) -> bool:
    return all(e.drafts <= cfg.num_spec_tokens for e in batch)


def blocks_held_by_running_and_enough(s: State, cfg: Config, r: int) -> bool:
    q, pool, bs = s.requests[r], s.pool, cfg.block_size
    if q.block_table and not may_hold_table(q):
        return False
    if len(set(q.block_table)) != len(q.block_table):
        return False
    if (q.status is Status.RUNNING or holds_kv_blocks(q)) and len(q.block_table) < cdiv(q.num_computed, bs):
        return False
    labels = label_list(pool)          # (a large pool's store: without building the tuple)
    return all(labels[b] is None or labels[b] == content_label(s, r, i, bs) for i, b in enumerate(q.block_table))


def pool_counts_and_free_queue_agree(s: State, cfg: Config) -> bool:
    """Reference counts equal the tables holding a block, the free queue holds
    exactly the blocks nobody holds, once each, and the cached copies of every
    label are as the profile allows (cached_copies_as_profile_allows)."""
    pool = s.pool
    holders: Counter[int] = Counter()
    for q in s.requests:
        holders.update(q.block_table)
    for _, table, *_ in s.deferred_frees + s.error_frees:   # a KV connector's fenced and failed frees hold theirs
        holders.update(table)
    if any(pool.ref_counts[b] != holders[b] for b in range(len(pool.ref_counts))):
        return False
    free = pool.free_queue
    if len(set(free)) != len(free) or set(free) != {b for b, c in enumerate(pool.ref_counts) if c == 0}:
        return False
    return cached_copies_as_profile_allows(pool, cfg)


def cached_copies_as_profile_allows(pool: BlockPool, cfg: Config) -> bool:
    """S9's caching clause. Without duplicate caching a label is cached once;
    with it (vLLM 0.8.x) a label may be cached by several blocks, and
    `duplicates` lists exactly those blocks, each once, grouped by label, so
    a hit knows which copy to serve."""
    copies = Counter(label for label in pool.labels if label is not None)
    if not cfg.cache_duplicate_blocks:
        return all(c == 1 for c in copies.values()) and not pool.duplicates
    expected = {b for b, label in enumerate(pool.labels) if label is not None and copies[label] >= 2}
    order = [pool.labels[b] for b in pool.duplicates]
    return (len(set(pool.duplicates)) == len(pool.duplicates) == len(expected)
            and set(pool.duplicates) == expected and order == sorted(order))  # type: ignore[type-var]


def status_matches_queue(s: State, cfg: Config, r: int) -> bool:
    status = s.requests[r].status
    waits, holds = r in s.waiting_set, r in s.kv_holding_set
    if holds and (waits or not cfg.rules.kv_holding_first):
        return False
    if status is Status.WAITING_FOR_REMOTE_KVS and cfg.rules.kv_holding_first and not holds:
        return False
    return ((status is Status.RUNNING) == (r in s.running_set)
            and (status in WAITING_STATUSES) == (waits or holds))


def queues_without_repeats_within_max_num_seqs(s: State, cfg: Config) -> bool:
    """The queues hold no repeats and no slot outside the state; max_num_seqs holds."""
    if len(s.running_set) != len(s.running) or len(s.waiting_set) != len(s.waiting):
        return False
    if len(s.kv_holding_set) != len(s.kv_holding):
        return False
    num_requests = len(s.requests)
    if any(not 0 <= r < num_requests for r in s.running_set | s.waiting_set | s.kv_holding_set):
        return False
    return len(s.running) <= cfg.max_num_seqs


def batch_within_budget_and_threshold(s: State, cfg: Config, batch: Batch) -> bool:
    threshold = cfg.long_prefill_token_threshold
    if sum(e.n for e in batch) > cfg.max_num_batched_tokens:
        return False
    return not (threshold > 0 and any(e.n > threshold for e in batch) and _threshold_binds(batch, cfg))


def _threshold_binds(batch: Batch, cfg: Config) -> bool:
    """Whether the long-prefill threshold held when `batch` was scheduled, as
    far as the batch shows: always in 0.8.x; in 0.33 only with more than one
    request eligible (`Profile.threshold_needs_company`), which a batch of two
    entries proves and a batch of one cannot tell (check-trace compares that
    decision with the spec's schedule instead); in 0.34 never with chunked
    prefill off (`Profile.threshold_needs_chunked_prefill`)."""
    if cfg.rules.threshold_needs_chunked_prefill and not cfg.enable_chunked_prefill:
        return False
    return not cfg.rules.threshold_needs_company or len(batch) > 1


def in_flight_within_depth(s: State, cfg: Config) -> bool:
    if len(s.in_flight) > cfg.queue_depth:
        return False
    if cfg.continue_prefill:
        return not s.scheduled_ids
    return s.scheduled_ids == {e.req for b in s.in_flight for e in b if e.fate is Fate.LIVE}


def batch_nonempty_unless_profile_queues_empty(s: State, cfg: Config, batch: Batch) -> bool:
    """S11': under vLLM 0.33 an empty batch takes a queue slot (`Profile.empty_batches`)."""
    return len(batch) > 0 or cfg.rules.empty_batches


def in_flight_counter_nonnegative(s: State, cfg: Config, r: int) -> bool:
    """IF0: an unfinished request's in-flight counter is never negative."""
    q = s.requests[r]
    return not q.status.is_active or q.num_in_flight >= 0


def in_flight_counter_matches_entries(s: State, cfg: Config, r: int) -> bool:
    """IF1: an unfinished request's in-flight counter is the tokens of its own entries in flight."""
    q = s.requests[r]
    if not q.status.is_active:
        return True
    return q.num_in_flight == sum(e.n for e in s.entries_of(r, fate=None))


def stale_counter_matches_entries(s: State, cfg: Config, r: int) -> bool:
    """IF2: 0 <= stale <= in flight, and stale is the tokens of its entries scheduled before its last preemption."""
    q = s.requests[r]
    if not q.status.is_active:
        return True
    if not 0 <= q.num_stale <= q.num_in_flight:
        return False
    # an unfinished request's entries that are not LIVE were in flight at its
    # last preemption (orphaned, or superseded by a drop-mode resumption)
    return q.num_stale == sum(e.n for e in s.entries_of(r, fate=None) if e.fate is not Fate.LIVE)


def running_has_no_stale_output(s: State, cfg: Config, r: int) -> bool:
    """IF3: a RUNNING request has no stale output in flight, unless it is dropped."""
    q = s.requests[r]
    return q.status is not Status.RUNNING or q.num_stale == 0 or q.drop_stale


def running_request_unblocked(s: State, cfg: Config, r: int) -> bool:
    if s.requests[r].status is not Status.RUNNING:
        return True
    live = s.entries_of(r)
    if not cfg.continue_prefill and r in s.scheduled_ids:
        return bool(live)
    return s.num_new_tokens(r) > 0 or bool(live and live[-1].samples)


# --- asynchronous scheduling (`Profile.output_placeholders`, vLLM 0.33's
# AsyncScheduler): what S3, S5, S6 and L2 become, and IA1, IA2.


def live_ranges_contiguous_with_placeholders(s: State, cfg: Config, r: int) -> bool:
    """S3 under async: live entries are non-empty and leave no gap; a prefill chunk's successor starts where it ends, a decode's at or before its end, and the last entry ends at num_computed, or past it after a sampling entry (a rejected draft of an older decode lowers num_computed while younger decodes are in flight); without spec decode the sync S3 holds exactly."""
    if cfg.num_spec_tokens == 0:
        return live_ranges_contiguous(s, cfg, r)
    q = s.requests[r]
    if not q.status.is_active:
        return True
    live = s.entries_of(r)
    if not live:
        return True
    if any(e.n < 1 for e in live):
        return False
    if any(b.start > a.end or (not a.samples and b.start != a.end) for a, b in zip(live, live[1:])):
        return False
    last = live[-1]
    return last.end == q.num_computed or (last.samples and last.end > q.num_computed)


def samples_exactly_at_known_tokens_with_placeholders(s: State, cfg: Config, r: int) -> bool:
    """S5 under async: a live entry holds more tokens than drafts, drafts ride
    only on a sampling entry, and prefill chunks (entries that do not sample)
    come before every sampling entry and stop short of the known tokens.
    Without spec decode: the entry after m live sampling entries of r reaches
    exactly num_tokens + m when it samples, less when not."""
    num_tokens = s.requests[r].num_tokens
    ahead = 0                                   # placeholders of the older live sampling entries
    for e in s.entries_of(r):
        reach = e.end - e.drafts
        if e.n <= e.drafts or (e.drafts > 0 and not e.samples):
            return False
        if not e.samples and (ahead > 0 or reach >= num_tokens):
            return False
        if cfg.num_spec_tokens == 0 and (reach > num_tokens + ahead or e.samples != (reach == num_tokens + ahead)):
            return False
        if e.samples:
            ahead += 1 + e.drafts
    return True


def decode_gated_by_stagger(s: State, cfg: Config, r: int) -> bool:
    """S6' (async decode gating): a request has at most ceil(D / stagger) live
    sampling entries in flight, any two of them at least `stagger` schedule()
    calls (batches) apart, and while its latest sampling entry is in flight
    its countdown is the stagger less the calls since."""
    q = s.requests[r]
    if not q.status.is_active:
        return True
    stagger = cfg.stagger
    positions = [i for i, b in enumerate(s.in_flight) for e in b
                 if e.req == r and e.samples and e.fate is Fate.LIVE]
    if len(positions) > (cdiv(cfg.queue_depth, stagger) if stagger else cfg.queue_depth):
        return False
    if any(j - i < stagger for i, j in zip(positions, positions[1:])):
        return False
    latest = [i for i, b in enumerate(s.in_flight) for e in b if e.req == r and e.samples]
    if not latest or not stagger:
        return True
    return q.decode_countdown == max(0, stagger - (len(s.in_flight) - 1 - latest[-1]))


def placeholders_match_entries(s: State, cfg: Config, r: int) -> bool:
    """IA1: a request's placeholders are 1 + drafts summed over its live sampling entries in flight, 0 unless RUNNING, and num_computed = num_tokens + placeholders - 1 while any are (drafts included)."""
    q = s.requests[r]
    if q.placeholders != sum(1 + e.drafts for e in s.entries_of(r) if e.samples):
        return False
    if q.status is not Status.RUNNING:
        return q.placeholders == 0
    return q.placeholders == 0 or q.num_computed == q.num_tokens + q.placeholders - 1


def placeholders_within_max_tokens(s: State, cfg: Config, r: int) -> bool:
    """IA2: an unfinished request's outputs plus its live sampling entries in flight never exceed max_tokens (num_output + placeholders <= max_tokens without drafts)."""
    q = s.requests[r]
    if not q.status.is_active:
        return True
    return q.num_output + sum(1 for e in s.entries_of(r) if e.samples) <= q.max_tokens


RequestPart = Callable[[State, Config, int], bool]
BatchPart = Callable[[State, Config, Batch], bool]
StatePart = Callable[[State, Config], bool]


@dataclass(frozen=True)
class Invariant:
    name: str
    statement: str                       # its one-line English statement
    of_request: RequestPart | None = None
    of_batch: BatchPart | None = None
    of_state: StatePart | None = None
    kind: str = "invariant"              # invariant | liveness (its safety form) | auxiliary (a proof's helper)

    def holds(self, s: State, cfg: Config) -> bool:
        """The conjunction of its parts: the state part, the request part of
        every request slot, the batch part of every in-flight batch."""
        if self.of_state is not None and not self.of_state(s, cfg):
            return False
        if self.of_request is not None and not all(self.of_request(s, cfg, r) for r in range(len(s.requests))):
            return False
        return self.of_batch is None or all(self.of_batch(s, cfg, b) for b in s.in_flight)


INVARIANTS: tuple[Invariant, ...] = (
    Invariant("S1_counter_bounds", "0 <= num_computed <= known tokens + drafts, and 0 outside RUNNING "
              "(with a KV connector, but for a parked or landed load's request).",
              of_request=counters_in_bounds),
    Invariant("S2_length_cap", "No request exceeds max_tokens or max_model_len; an unfinished one is below "
              "both; no batch reaches past max_model_len.", of_request=within_length_caps, of_batch=batch_within_max_model_len),
    Invariant("S3_contiguous_coverage", "A running request's live in-flight ranges, in FIFO order, are "
              "contiguous, non-empty and end at num_computed.", of_request=live_ranges_contiguous),
    Invariant("S5_one_sample_per_prefill", "A live entry samples exactly when it reaches the request's known "
              "tokens, never past them; it holds more tokens than drafts, and drafts only ride on a "
              "sampling entry.", of_request=samples_exactly_at_known_tokens),
    Invariant("S6_decode_gating", "A request has at most one live sampling entry in flight, and it is its "
              "last live entry.", of_request=one_live_sampling_entry_last),
    Invariant("S7_output_binding", "Live entries belong to RUNNING requests, orphaned ones to PREEMPTED "
              "requests with no live entry; a batch holds a request once.",
              of_request=entries_bound_to_their_incarnation, of_batch=batch_holds_each_request_once),
    Invariant("S8_spec_accounting", "Drafts never exceed k, and once a running request has nothing in "
              "flight its rejected drafts are subtracted (num_computed < known tokens).",
              of_request=rejected_drafts_subtracted, of_batch=drafts_within_k),
    Invariant("S9_kv_ownership", "Reference counts equal the tables holding a block (with a KV connector, "
              "and its deferred frees); free queue and held blocks partition the pool; only RUNNING requests "
              "hold blocks (with a KV connector also parked or landed loads, and finished requests held for a "
              "transfer), enough for num_computed, "
              "with correct cached content; a label is cached once, or (duplicate caching) its copies are "
              "recorded in caching order.", of_request=blocks_held_by_running_and_enough, of_state=pool_counts_and_free_queue_agree),
    Invariant("S10_queues_and_budgets", "running = the RUNNING requests and waiting = the WAITING/PREEMPTED "
              "ones (with a KV connector, waiting and kv_holding together, parked loads in kv_holding), without repeats; max_num_seqs, the token budget and the long-prefill threshold hold "
              "for every batch.", of_request=status_matches_queue, of_batch=batch_within_budget_and_threshold, of_state=queues_without_repeats_within_max_num_seqs),
    Invariant("S11_pipeline_depth", "At most K batches in flight, none empty; the in-flight set (one batch "
              "per request) is exactly the requests with a live entry.", of_batch=batch_nonempty_unless_profile_queues_empty,
              of_state=in_flight_within_depth),
    Invariant("L1_running_request_unblocked", "L1 as safety: a RUNNING request with nothing to schedule has "
              "a live entry in flight whose output unblocks it.", of_request=running_request_unblocked, kind="liveness"),
    Invariant("L2_no_deadlock", (l2_no_deadlock.__doc__ or "").strip(), of_state=l2_no_deadlock,
              kind="liveness"),
    Invariant("L3_drain", (l3_drain.__doc__ or "").strip(), of_state=l3_drain, kind="liveness"),
)


# The invariants of the profiles with stale-output counters (vLLM 0.33): each
# request's counters against the batches in flight (docs/profiles.md §"Invariants per profile").
# IF0 follows from IF1 while names are unique; with names reused (vLLM
# 0.33's id-reuse bug) IF1 breaks on every profile, and IF0 is what the
# hardened variant's floor (`Profile.in_flight_floor`) still keeps.
COUNTER_INVARIANTS: tuple[Invariant, ...] = (
    Invariant("IF1_in_flight_counter", (in_flight_counter_matches_entries.__doc__ or "").strip(), of_request=in_flight_counter_matches_entries),
    Invariant("IF2_stale_counter", (stale_counter_matches_entries.__doc__ or "").strip(), of_request=stale_counter_matches_entries),
    Invariant("IF3_no_stale_resumption", (running_has_no_stale_output.__doc__ or "").strip(), of_request=running_has_no_stale_output),
    # last: an event that breaks IF1 too is still reported as IF1, as before IF0 existed
    Invariant("IF0_in_flight_never_negative", (in_flight_counter_nonnegative.__doc__ or "").strip(), of_request=in_flight_counter_nonnegative),
)


# Under asynchronous scheduling (vLLM 0.33 AsyncScheduler): these replace
# the sync invariants of the same letter (S3, S5, S6, L2), and IA1, IA2 join.
ASYNC_REPLACEMENTS: dict[str, Invariant] = {
    "S3_contiguous_coverage": Invariant("S3a_async_coverage", (live_ranges_contiguous_with_placeholders.__doc__ or "").strip(),
                                        of_request=live_ranges_contiguous_with_placeholders),
    "S5_one_sample_per_prefill": Invariant("S5a_async_sampling", (samples_exactly_at_known_tokens_with_placeholders.__doc__ or "").strip(),
                                           of_request=samples_exactly_at_known_tokens_with_placeholders),
    "S6_decode_gating": Invariant("S6p_async_decode_gating", (decode_gated_by_stagger.__doc__ or "").strip(),
                                  of_request=decode_gated_by_stagger),
    "L2_no_deadlock": Invariant("L2_no_deadlock", (l2_async_no_deadlock.__doc__ or "").strip(),
                                of_state=l2_async_no_deadlock, kind="liveness"),
}
ASYNC_INVARIANTS: tuple[Invariant, ...] = (
    Invariant("IA1_placeholders", (placeholders_match_entries.__doc__ or "").strip(), of_request=placeholders_match_entries),
    Invariant("IA2_placeholders_within_max_tokens", (placeholders_within_max_tokens.__doc__ or "").strip(), of_request=placeholders_within_max_tokens),
)


# With a KV connector (docs/kv-connector.md, "Named properties"; the
# predicates are in kv_invariants.py; KV3 and P_KV are transition properties).
KV_INVARIANTS: tuple[Invariant, ...] = (
    Invariant("KV1_no_reuse_under_transfer", (kv1_no_reuse_under_transfer.__doc__ or "").strip(),
              of_state=kv1_no_reuse_under_transfer),
    Invariant("KV2_loading_not_scheduled", (kv2_loading_not_scheduled.__doc__ or "").strip(),
              of_request=kv2_loading_not_scheduled),
    Invariant("KV4_no_leak", "A finished request holds no block unless held for a transfer still to be "
              "reported, and every deferred free drains once the batches it waits for are done (none is "
              "left when nothing is in flight).", of_request=kv4_finished_holds_nothing,
              of_state=kv4_deferred_frees_drain),
    Invariant("KV5_loaded_not_starved", (kv5_loaded_not_starved.__doc__ or "").strip(),
              of_state=kv5_loaded_not_starved, kind="liveness"),
)
# Under the priority policy (priority_invariants.py).
PRIORITY_ORDER = Invariant("PR1_waiting_in_priority_order", (waiting_in_priority_order.__doc__ or "").strip(),
                           of_state=waiting_in_priority_order)
# Under the priority policy with a KV connector (its queues are heaps too).
PRIORITY_KV_ORDER = Invariant("PR4_kv_holding_in_priority_order",
                              (kv_holding_in_priority_order.__doc__ or "").strip(),
                              of_state=kv_holding_in_priority_order)
# With streaming sessions (docs/request-states.md, "Streaming sessions"; the
# predicates are in session_invariants.py; SS1 is a transition property).
SESSION_INVARIANTS: tuple[Invariant, ...] = (
    Invariant("SS2_old_turn_given_up", (ss2_old_turn_given_up.__doc__ or "").strip(), of_request=ss2_old_turn_given_up),
    Invariant("SS3_waiting_session_holds_blocks", (ss3_waiting_session_holds_blocks.__doc__ or "").strip(),
              of_request=ss3_waiting_session_holds_blocks),
    Invariant("SS4_waiting_session_keeps_seat", (ss4_waiting_session_keeps_seat.__doc__ or "").strip(),
              of_state=ss4_waiting_session_keeps_seat),
)
# ... and under the priority policy (sessions.py: an input taken in place).
SESSION_PRIORITY_ORDER = Invariant("SS5_session_queues_in_priority_order",
                                   (ss5_session_queues_in_priority_order.__doc__ or "").strip(),
                                   of_state=ss5_session_queues_in_priority_order)
# The auxiliary session invariant the k-induction proof of SS4 needs beside a
# second request (docs/proofs.md, "Streaming sessions"): a fact of the
# session models with at most two batches in flight, checked there by the
# explicit search like any invariant.
SESSION_SEAT_AUXILIARY = Invariant("SA10_stale_preemption_leaves_a_seat",
                                   (sa10_stale_preemption_leaves_a_seat.__doc__ or "").strip(),
                                   of_request=sa10_stale_preemption_leaves_a_seat, kind="auxiliary")
KV_LOAD_LIMIT = Invariant("KV6_load_limit", (kv6_load_limit.__doc__ or "").strip(), of_state=kv6_load_limit)

# With structured output (grammar.py).
GRAMMAR_INVARIANTS: tuple[Invariant, ...] = tuple(
    Invariant(name, (predicate.__doc__ or "").strip(), of_state=predicate)
    for name, predicate in (("G1_no_run_while_compiling", g1_no_run_while_compiling),
                            ("G2_fsm_tracks_output", g2_fsm_tracks_output),
                            ("G3_fsm_never_refuses", g3_fsm_never_refuses)))

# With a LoRA cap (`Config.max_loras`; lora.py).
LORA_CAP = Invariant("LORA1_loras_within_cap", (lora1_loras_within_cap.__doc__ or "").strip(),
                     of_state=lora1_loras_within_cap)


def invariants_for(cfg: Config, auxiliary: bool = True) -> tuple[Invariant, ...]:
    """The invariants of cfg's profile: every profile's, IF0-IF3 where vLLM
    keeps stale-output counters, under async scheduling S3, S5, S6 and L2
    restated (`ASYNC_REPLACEMENTS`) with IA1 and IA2, and with a KV
    connector KV1, KV2, KV4, KV5 (and KV6 under vLLM 0.34's load limit);
    PR1 under the priority policy (PR4 too with a KV connector); with
    structured output G1-G3; with streaming sessions SS2-SS4 (SS5 under the
    priority policy, and SA10 with at most two batches in flight); with a
    LoRA cap LORA1. Without `auxiliary`, less the proofs' helpers
    (kind "auxiliary", SA10): facts of the models they are proved on, not
    claims about every run, so a trace of another shape is not held to them."""
    chosen = INVARIANTS + (COUNTER_INVARIANTS if cfg.rules.stale_output_counters else ())
    if cfg.rules.output_placeholders:
        chosen = tuple(ASYNC_REPLACEMENTS.get(i.name, i) for i in chosen) + ASYNC_INVARIANTS
    if cfg.kv_connector is not None:
        chosen += KV_INVARIANTS
        if cfg.rules.kv_inflight_load_limit and cfg.kv_connector.max_inflight_loads is not None:
            chosen += (KV_LOAD_LIMIT,)
    if cfg.scheduling_policy == "priority":
        chosen += (PRIORITY_ORDER,)
        if cfg.kv_connector is not None and cfg.rules.priority_orders_kv_holding:
            chosen += (PRIORITY_KV_ORDER,)
    if cfg.structured_output:
        chosen += GRAMMAR_INVARIANTS
    if has_sessions(cfg):
        chosen += SESSION_INVARIANTS + ((SESSION_PRIORITY_ORDER,) if cfg.scheduling_policy == "priority" else ())
        chosen += (SESSION_SEAT_AUXILIARY,) if sa10_applies(cfg) else ()
    if has_lora_cap(cfg):
        chosen += (LORA_CAP,)
    return chosen if auxiliary else tuple(i for i in chosen if i.kind != "auxiliary")


def violated(s: State, cfg: Config) -> list[Invariant]:
    return [inv for inv in invariants_for(cfg) if not inv.holds(s, cfg)]
