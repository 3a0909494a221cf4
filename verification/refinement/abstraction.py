"""The abstraction function: the single bridge from a reference `Scheduler`
and its `Engine`'s batch queue to a spec `State`.

The spec and the reference share no code, so this mapping is the only place
where their vocabularies meet:

* requests are spec slots in arrival order. The scheduler forgets finished
  requests (it deletes them from `scheduler.requests`) and may reuse a name,
  so a `Ledger`, kept by whoever drives the scheduler, remembers every
  `Request` object it added, in order; a finished one still abstracts to its
  final status and output count;
* statuses map one to one (FINISHED_LENGTH_CAPPED is the spec's
  FINISHED_LENGTH); a finished request's counters, drafts and table are the
  spec's normal form (0, 0, empty), since the reference leaves stale values
  on an object nobody reads again;
* under a profile with vLLM 0.33's stale-output counters, an unfinished
  request's `num_in_flight_tokens`, `num_stale_output_tokens` and
  `drop_stale_output` are the spec's `num_in_flight`, `num_stale` and
  `drop_stale` (a finished one has none: it left vLLM's `self.requests`);
* names: the spec names a slot by the slot that first arrived under the same
  request id (`Request.name` is None for that first slot, else its index),
  and each in-flight entry carries the name of the slot it was scheduled
  for (`Entry.name`), as the spec's batches record the id their output is
  looked up by. Only under a profile that looks outputs up by name (vLLM
  0.33): under 0.8.x the spec binds by incarnation and a slot has no name;
* a cached block's hash becomes the spec's content label: a prompt block by a
  chained-hash -> int table shared by all requests (a shared prefix shares
  labels, and the spec's `Prompt.labels` come from the same table; the hash
  takes the request's LoRA, as the reference's and vLLM's do, so requests
  of different LoRAs share no label), a block
  holding output tokens by `content_label`, which the spec makes unique per
  (request, block index). That is sound only if two requests never share an
  output-containing block's content, so a driver must sample tokens unique to
  the request (`output_token`);
* in-flight batches come from `engine.batch_queue`, oldest first, each
  entry's slot found by (request id, incarnation), so an entry of an aborted
  request whose name was reused maps to the old slot, and each entry's fate
  from `scheduler.fate_of` (vLLM 0.33: `incarnation_fate_of`, the
  incarnation alone, as the spec's fates are there). Snapshots are read live, never copied, so a
  scheduler that mutates an in-flight snapshot shows it here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from flightcheck.reference import Engine, Request, RequestStatus, Scheduler
from flightcheck.reference.block_pool import hash_block_tokens
from flightcheck.reference.outputs import SchedulerOutput
from flightcheck.spec import BlockPool, Config, Entry, Fate, KvConnector, Load, Prompt, State, Status
from flightcheck.spec import Request as SpecRequest
from flightcheck.spec.blocks import group_duplicates
from flightcheck.spec.state import content_label
from flightcheck.verification.refinement import kv_abstraction

STATUS: dict[RequestStatus, Status] = {
    RequestStatus.WAITING: Status.WAITING,
    RequestStatus.RUNNING: Status.RUNNING,
    RequestStatus.PREEMPTED: Status.PREEMPTED,
    RequestStatus.FINISHED_STOPPED: Status.FINISHED_STOPPED,
    RequestStatus.FINISHED_LENGTH_CAPPED: Status.FINISHED_LENGTH,
    RequestStatus.FINISHED_ABORTED: Status.FINISHED_ABORTED,
    RequestStatus.WAITING_FOR_REMOTE_KVS: Status.WAITING_FOR_REMOTE_KVS,
    RequestStatus.FINISHED_ERROR: Status.FINISHED_ERROR,
    RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR: Status.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR,
    RequestStatus.WAITING_FOR_STREAMING_REQ: Status.WAITING_FOR_STREAMING_REQ,
}
FATE: dict[str, Fate] = {f.value: f for f in Fate}

# Output tokens live far above any prompt token a driver uses, and each
# request slot has its own range, so output-containing blocks never collide.
OUTPUT_TOKEN_BASE = 1_000_000
OUTPUT_TOKEN_STRIDE = 100_000


def output_token(slot: int, position: int) -> int:
    """A sampled token unique to (request slot, position)."""
    return OUTPUT_TOKEN_BASE + slot * OUTPUT_TOKEN_STRIDE + position


class AbstractionError(AssertionError):
    """The reference's state has no image in the spec (a bug, or a driver
    that broke the abstraction's assumptions)."""


def spec_config(cfg, allow_name_reuse: bool = False) -> Config:
    """The spec's constants for a reference `SchedulerConfig` (always the
    correct spec: a reference mutant is checked against it), under the same
    version profile (the reference and the spec name their profiles alike)
    with the knobs the reference config resolved or overrode; vLLM 0.33's
    drop mode is the spec's `stale_mode`. `allow_name_reuse`: the driver may
    bring a request in under a finished one's name (the spec's environment
    then may too)."""
    return Config(num_stages=cfg.num_pipeline_stages,
                  max_num_batched_tokens=cfg.max_num_batched_tokens,
                  max_num_seqs=cfg.max_num_seqs, block_size=cfg.block_size,
                  num_blocks=cfg.num_blocks, max_model_len=cfg.max_model_len,
                  long_prefill_token_threshold=cfg.long_prefill_token_threshold,
                  num_spec_tokens=cfg.num_spec_tokens,
                  prefix_caching=cfg.enable_prefix_caching, profile=cfg.profile,
                  continue_prefill=cfg.continue_prefill,
                  num_preallocate_tokens=cfg.num_preallocate_tokens,
                  stale_mode="drop" if cfg.drop_stale_output else "deliver",
                  allow_name_reuse=allow_name_reuse, kv_connector=_kv_connector(cfg),
                  scheduling_policy=cfg.scheduling_policy, max_loras=cfg.max_loras,
                  prompt_logprobs=cfg.prompt_logprobs, prefill_schedule_interval=cfg.prefill_schedule_interval)


def _kv_connector(cfg) -> KvConnector | None:
    kv = cfg.kv_connector
    return None if kv is None else KvConnector(consumer=kv.consumer, producer=kv.producer,
                                               load_failure_policy=kv.load_failure_policy,
                                               max_inflight_loads=kv.max_inflight_loads)


class Ledger:
    """What the driver knows and the scheduler forgets: every request it added
    (slot = arrival order), the prompt labels it gave the spec, which slot
    each scheduled incarnation belongs to, and what each cached hash means."""

    def __init__(self, num_slots: int, block_size: int, prefix_caching: bool) -> None:
        self.num_slots = num_slots
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.requests: list[Request] = []
        self._slot_by_object: dict[int, int] = {}
        self.prompt_labels: list[tuple[int, ...]] = []
        self._entry_slot: dict[tuple[str, int], int] = {}
        self._prompt_label: dict[int, int] = {}       # chained hash of a prompt block -> label
        self._output_label: dict[int, int] = {}       # hash of an output-containing block -> label
        self._hashes: list[list[int]] = []            # per slot: chained hashes of its full blocks
        self._hashed: dict[int, list[int]] = {}       # per session slot: the tokens those hashes cover
        self._first_slot: dict[str, int] = {}          # request id -> the first slot that arrived under it

    # -- recording ----------------------------------------------------------

    def arrive(self, request: Request) -> tuple[int, Prompt]:
        """Register a request just added to the scheduler; its slot and the
        spec's prompt (labels from the shared chained-hash table)."""
        slot = len(self.requests)
        if slot >= self.num_slots:
            raise AbstractionError(f"more than {self.num_slots} requests arrived")
        bs = self.block_size
        tokens = request.prompt_token_ids
        labels, parent = [], None
        for i in range(len(tokens) // bs):
            parent = hash_block_tokens(parent, tokens[i * bs:(i + 1) * bs], request.lora_int_id)
            labels.append(self._prompt_label.setdefault(parent, len(self._prompt_label) + 1))
        self.requests.append(request)
        self._slot_by_object[id(request)] = slot
        self._first_slot.setdefault(request.request_id, slot)
        self.prompt_labels.append(tuple(labels))
        self._hashes.append([])
        return slot, Prompt(request.num_prompt_tokens, request.max_tokens, tuple(labels),
                            priority=request.priority, lora=request.lora_int_id,
                            prompt_logprobs=request.prompt_logprobs)

    def record_batch(self, scheduler: Scheduler, output: SchedulerOutput) -> None:
        """Bind each entry's (request id, incarnation) to its slot, right
        after `schedule()`, while the scheduled requests are all known."""
        for entry in output.entries:
            self._entry_slot[(entry.req_id, entry.incarnation)] = \
                self.slot_of(scheduler.requests[entry.req_id])

    # -- lookups ------------------------------------------------------------

    def slot_of(self, request: Request) -> int:
        try:
            return self._slot_by_object[id(request)]
        except KeyError:
            raise AbstractionError(f"{request!r} was not added through the ledger") from None

    def name_of(self, slot: int) -> int | None:
        """The spec's name of a slot: None for the first slot of its request
        id, else that first slot (the name it reuses)."""
        first = self._first_slot[self.requests[slot].request_id]
        return None if first == slot else first

    def active_slot(self, req_id: str) -> int | None:
        """The slot of the unfinished request named `req_id`, if any."""
        for slot in range(len(self.requests) - 1, -1, -1):
            request = self.requests[slot]
            if request.request_id == req_id:
                return None if request.is_finished() else slot
        return None

    def entry_slot(self, req_id: str, incarnation: int) -> int:
        try:
            return self._entry_slot[(req_id, incarnation)]
        except KeyError:
            raise AbstractionError(f"an in-flight entry of {req_id!r} with incarnation "
                                   f"{incarnation} that no recorded batch scheduled") from None

    def label_of_hash(self, block_hash: int) -> int:
        label = self._prompt_label.get(block_hash)
        if label is None:
            label = self._output_label.get(block_hash)
        if label is None:
            raise AbstractionError(f"a block caches hash {block_hash}, which is no known "
                                   "request's content")
        return label

    def refresh_output_labels(self, state: State) -> None:
        """Extend each request's chained hashes to its full blocks and label
        the ones past the prompt it arrived with (incremental: token ids only
        grow, but for a streaming session's next input, which replaces its
        last sampled token: `_rehash_from`)."""
        bs = self.block_size
        for slot, request in enumerate(self.requests):
            hashes = self._hashes[slot]
            tokens = request.all_token_ids
            if request.resumable:
                del hashes[self._rehash_from(slot, tokens):]
            while len(hashes) < len(tokens) // bs:
                i = len(hashes)
                hashes.append(hash_block_tokens(hashes[-1] if hashes else None,
                                                tokens[i * bs:(i + 1) * bs], request.lora_int_id))
                if i >= len(self.prompt_labels[slot]):        # spec content_label: not its first prompt's
                    self._output_label[hashes[-1]] = content_label(state, slot, i, bs)
            if request.resumable:
                self._hashed[slot] = list(tokens[:len(hashes) * bs])

    def _rehash_from(self, slot: int, tokens: list[int]) -> int:
        """The blocks of a session whose hashes still hold: those before the
        first whose tokens changed since they were hashed (a next input
        replaced the last sampled token, `_update_request_as_session`)."""
        hashed, bs = self._hashed.get(slot, []), self.block_size
        same = 0
        while same + bs <= len(hashed) and hashed[same:same + bs] == tokens[same:same + bs]:
            same += bs
        return same // bs


def abstract(scheduler: Scheduler, engine: Engine | Iterable[SchedulerOutput],
             ledger: Ledger) -> State:
    """The spec state the reference is in. `engine` may also be the in-flight
    `SchedulerOutput`s themselves, oldest first (for a harness without an Engine)."""
    named = scheduler.config.version_profile.stale_output_counters
    requests = tuple(_request(scheduler, ledger, slot, r, named) for slot, r in enumerate(ledger.requests))
    requests += (SpecRequest(),) * (ledger.num_slots - len(requests))
    state = State(requests=requests)
    outputs = ([out for out, _ in engine.batch_queue] if isinstance(engine, Engine)
               else list(engine))
    in_flight = tuple(tuple(_entry(scheduler, ledger, e, named) for e in out.entries) for out in outputs)
    scheduled = frozenset(_slot_by_name(scheduler, ledger, rid) for rid in scheduler.scheduled_req_ids)
    return State(requests=requests,
                 waiting=tuple(ledger.slot_of(r) for r in scheduler.waiting),
                 running=tuple(ledger.slot_of(r) for r in scheduler.running),
                 in_flight=in_flight, pool=_pool(scheduler, ledger, state),
                 scheduled_ids=scheduled, **_queues(scheduler, ledger), **_cadence(scheduler))


def _cadence(scheduler: Scheduler) -> dict[str, Any]:
    """The prefill cadence's hold and capacity bound (spec/cadence.py: the
    executed steps the hold still lasts, read off vLLM's two counters)."""
    interval = scheduler.local_prefill_interval
    if interval == 1:
        return {}
    since = scheduler.num_executed_steps - scheduler.last_prefill_step
    return {"prefill_hold": max(0, interval - 1 - since),
            "prefill_capacity_bound": scheduler.prefill_capacity_bound}


def _queues(scheduler: Scheduler, ledger: Ledger) -> dict[str, Any]:
    """The KV connector's queues, and the order of arrival under the priority
    policy (a slot is the order of arrival)."""
    queues = kv_abstraction.queues(scheduler, ledger)
    if scheduler.config.scheduling_policy == "priority":
        queues["arrivals"] = tuple(range(len(ledger.requests)))
    return queues


def _request(scheduler: Scheduler, ledger: Ledger, slot: int, r: Request,
             named: bool) -> SpecRequest:
    status = STATUS[r.status]
    labels = ledger.prompt_labels[slot] if ledger.prefix_caching else ()
    common = dict(status=status, prompt_len=r.num_prompt_tokens, max_tokens=r.max_tokens,
                  prompt_labels=labels, num_output=r.num_output_tokens, priority=r.priority,
                  name=ledger.name_of(slot) if named else None, **_lora_fields(scheduler, r),
                  **_prefill_chunk_flag(scheduler, r))
    if scheduler.connector is not None:       # the KV connector's fields (kv_abstraction.py)
        common.update(kv_abstraction.request_fields(scheduler, r))
    if status.is_finished:
        return SpecRequest(**common)          # the spec's normal form of a finished request
    table = tuple(scheduler.kv_cache_manager.get_block_ids(r.request_id))
    # vLLM 0.33's counters (0 and False under the 0.8.x profiles, which keep none)
    return SpecRequest(**common, num_computed=r.num_computed_tokens,
                       num_drafts=len(r.spec_token_ids), block_table=table,
                       num_in_flight=r.num_in_flight_tokens, num_stale=r.num_stale_output_tokens,
                       drop_stale=r.drop_stale_output, **_async_counters(scheduler, r))


def _prefill_chunk_flag(scheduler: Scheduler, r: Request) -> dict[str, bool]:
    """vLLM's `is_prefill_chunk` as the request's last schedule left it, where
    the spec keeps it: under the prefill cadence (with `deferred_waiting`'s
    membership: spec/cadence.py), or for the padding rule (spec/drafts.py
    `keeps_prefill_chunk_flag`: a profile that pads admissions, with drafts).
    Neither side clears them when the request finishes."""
    cfg = scheduler.config
    if scheduler.local_prefill_interval > 1:        # the prefill cadence's flags (spec/cadence.py)
        return {"is_prefill_chunk": r.is_prefill_chunk, "deferred_waiting": r.request_id in scheduler.deferred_waiting}
    if not (cfg.version_profile.pads_admitted_decodes and cfg.num_spec_tokens > 0):
        return {}
    return {"is_prefill_chunk": r.is_prefill_chunk}


def _lora_fields(scheduler: Scheduler, r: Request) -> dict[str, Any]:
    """A request's LoRA and prompt-logprobs flag, as the spec keeps them
    (spec/lora.py `arrive_with_lora`): the LoRA only with a LoRA config, the
    flag only with prompt logprobs and prefix caching (the one thing it changes)."""
    cfg = scheduler.config
    return {"lora": r.lora_int_id if cfg.max_loras else 0,
            "prompt_logprobs": r.prompt_logprobs and cfg.prompt_logprobs and cfg.enable_prefix_caching}


# -- asynchronous scheduling (vllm-0.33-async) ----------------------------------

def _async_counters(scheduler: Scheduler, r: Request) -> dict[str, int]:
    """The spec's `placeholders` and `decode_countdown` of an unfinished
    request (0 under every profile without async scheduling, which keeps
    neither).

    The placeholders are vLLM's `num_output_placeholders` as they are. The
    countdown is the spec's finite image of vLLM's unbounded counters: the
    reference, as vLLM, keeps `Scheduler.current_step` (+1 at the start of
    every schedule() call, empty ones included) and the request's
    `next_decode_eligible_step` (= current_step + stagger, set when a
    sampling entry is scheduled; never reset). The running loop skips the
    request while `current_step < next_decode_eligible_step` at the start of
    a call, i.e. while `next_decode_eligible_step - current_step > 0` after
    its `+= 1`. Between calls that difference, floored at 0, is exactly the
    spec's countdown: set to the stagger by the sampling entry, decremented
    (floored at 0) at the start of every call, skipping while > 0 after the
    decrement (spec/schedule.py `_count_down`). Every value past the
    stagger's reach maps to 0, which the spec cannot tell apart either."""
    if not scheduler.config.async_scheduling:
        return {}
    return {"placeholders": r.num_output_placeholders,
            "decode_countdown": max(0, r.next_decode_eligible_step - scheduler.current_step)}


def _entry(scheduler: Scheduler, ledger: Ledger, e, named: bool) -> Entry:
    slot = ledger.entry_slot(e.req_id, e.incarnation)
    # The spec's fate is the incarnation an entry was scheduled for; under
    # vLLM 0.33 the counters, not the fate, decide what becomes of its
    # output (a drop-mode orphan is discarded but still ORPHANED).
    fate = scheduler.incarnation_fate_of(e) if named else scheduler.fate_of(e)
    return Entry(slot, start=e.num_computed_tokens, n=e.num_new_tokens, samples=bool(e.samples),
                 drafts=len(e.spec_token_ids), fate=FATE[fate.value],
                 name=ledger.name_of(slot) if named else None,
                 external=e.external, blocks=e.fence_blocks)


def _slot_by_name(scheduler: Scheduler, ledger: Ledger, req_id: str) -> int:
    request = scheduler.requests.get(req_id)
    if request is None:
        raise AbstractionError(f"scheduled_req_ids holds {req_id!r}, which is no known request")
    return ledger.slot_of(request)


def _pool(scheduler: Scheduler, ledger: Ledger, state: State) -> BlockPool:
    pool = scheduler.kv_cache_manager.block_pool
    if any(b.block_hash is not None for b in pool.blocks):
        ledger.refresh_output_labels(state)
    labels: Sequence[int | None] = tuple(
        None if b.block_hash is None else ledger.label_of_hash(b.block_hash) for b in pool.blocks)
    # vLLM's hash -> {block id: block} keeps the caching order of each hash's
    # copies; the spec's `duplicates` is that order, grouped by label.
    caching_order = [block_id for copies in pool.cached_block_hash_to_block.values() for block_id in copies]
    return BlockPool(ref_counts=tuple(b.ref_cnt for b in pool.blocks), labels=labels,
                     free_queue=tuple(pool.free_block_ids()),
                     duplicates=group_duplicates(caching_order, list(labels)))


def describe_difference(expected: State, actual: State) -> str:
    """Where two spec states differ, field by field, for a failure message."""
    diffs: list[str] = []
    for r, (a, b) in enumerate(zip(expected.requests, actual.requests)):
        for name in SpecRequest.__dataclass_fields__:
            x, y = getattr(a, name), getattr(b, name)
            if x != y:
                diffs.append(f"r{r}.{name}: spec {x!r}, reference {y!r}")
    for name in ("waiting", "running", "scheduled_ids", "kv_holding", "arrivals"):
        if getattr(expected, name) != getattr(actual, name):
            diffs.append(f"{name}: spec {getattr(expected, name)}, reference {getattr(actual, name)}")
    if len(expected.in_flight) != len(actual.in_flight):
        diffs.append(f"batches in flight: spec {len(expected.in_flight)}, reference {len(actual.in_flight)}")
    for i, (x, y) in enumerate(zip(expected.in_flight, actual.in_flight)):
        if x != y:
            diffs.append(f"batch {i}: spec {list(x)}, reference {list(y)}")
    for name in ("ref_counts", "labels", "free_queue"):
        if getattr(expected.pool, name) != getattr(actual.pool, name):
            diffs.append(f"pool.{name}: spec {getattr(expected.pool, name)}, "
                         f"reference {getattr(actual.pool, name)}")
    return "; ".join(diffs) or "no difference"
