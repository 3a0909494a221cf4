"""The state of the spec: requests, queues, the in-flight batch FIFO, the KV
block pool.

Abstracted away:
* token ids. A request is its prompt length, its output count and, for prefix
  caching, one content label per full prompt block (fixed at arrival; requests
  that share a prefix share labels). Blocks that hold output tokens get a label
  unique to their request and position (`content_label`), since two requests'
  sampled continuations are taken to differ; so do a streaming session's
  prompt blocks past its first prompt (its kept outputs and later inputs).
* request names, mostly. Requests are slots 0..N-1 that arrive at most once,
  so the state is finite, and a slot is an incarnation. A slot's name is its
  own index unless it arrived under a finished slot's name (`Request.name`,
  only with `Config.allow_name_reuse`); an entry records the name its output
  will be looked up by (`Entry.name`), as vLLM's batches record request ids.
* incarnation numbers. A batch entry's `fate` (LIVE, ORPHANED, SUPERSEDED) is
  the finite stand-in for "the incarnation it was scheduled for".
* time. Only the order of events matters.
* the KV connector's worker side (docs/kv-connector.md): a transfer is a
  request's `load` (or its `held` table) until the connector reports it.

Every value is frozen and hashable, so explicit-state search can store states
in a set, and every counter is bounded by the configuration.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from .request_store import replaced


class Status(enum.Enum):
    NEW = "NEW"                          # not yet arrived
    WAITING = "WAITING"
    RUNNING = "RUNNING"
    PREEMPTED = "PREEMPTED"
    FINISHED_STOPPED = "FINISHED_STOPPED"
    FINISHED_LENGTH = "FINISHED_LENGTH"
    FINISHED_ABORTED = "FINISHED_ABORTED"
    # The KV connector (docs/kv-connector.md): an async load in flight, or
    # landed and not yet promoted; a request failed by the "fail" policy.
    WAITING_FOR_REMOTE_KVS = "WAITING_FOR_REMOTE_KVS"
    FINISHED_ERROR = "FINISHED_ERROR"
    # Structured output (grammar.py): waiting for its grammar to compile.
    WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR = "WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR"
    # A streaming session (docs/request-states.md, "Streaming sessions"):
    # stopped at the end of its turn, waiting for the client's next input.
    WAITING_FOR_STREAMING_REQ = "WAITING_FOR_STREAMING_REQ"

    @property
    def is_finished(self) -> bool:
        return self in FINISHED

    @property
    def is_active(self) -> bool:
        """Arrived and not finished."""
        return self in ACTIVE

    @property
    def awaits_client(self) -> bool:
        """Unfinished, but nothing for the engine to do until the client sends
        more (vLLM's `get_num_unfinished_requests` leaves such sessions out)."""
        return self is Status.WAITING_FOR_STREAMING_REQ


FINISHED = frozenset({Status.FINISHED_STOPPED, Status.FINISHED_LENGTH, Status.FINISHED_ABORTED,
                      Status.FINISHED_ERROR})
ACTIVE = frozenset({Status.WAITING, Status.RUNNING, Status.PREEMPTED, Status.WAITING_FOR_REMOTE_KVS,
                    Status.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR, Status.WAITING_FOR_STREAMING_REQ})
# The statuses of a request in a waiting queue (`waiting` or `kv_holding`).
WAITING_STATUSES = frozenset({Status.WAITING, Status.PREEMPTED, Status.WAITING_FOR_REMOTE_KVS,
                              Status.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR, Status.WAITING_FOR_STREAMING_REQ})


class Load(enum.Enum):
    """A request's KV load, as the scheduler knows it (docs/kv-connector.md)."""

    NONE = "none"              # the connector has not been asked (or offered nothing yet)
    IN_FLIGHT = "in_flight"    # an async load started, not reported
    FAILED = "failed"          # its failure reported, its finished_recving not yet
    RECEIVED = "received"      # finished_recving seen, the request not yet running again
    DONE = "done"              # asked and settled: the connector offers 0 from now on (C1)

    @property
    def in_transfer(self) -> bool:
        """The worker may still write the request's blocks."""
        return self in (Load.IN_FLIGHT, Load.FAILED)


class Pause(enum.Enum):
    """vLLM's `PauseState` (reset_pause.py): the scheduler's pause state."""

    UNPAUSED = "none"
    PAUSED_NEW = "new"         # no waiting request admitted; running ones go on
    PAUSED_ALL = "all"         # nothing scheduled


class Grammar(enum.Enum):
    """A request's structured-output grammar (grammar.py)."""

    NONE = "none"              # no structured output
    COMPILING = "compiling"    # compiling in the background
    READY = "ready"            # compiled: the FSM is at `Request.fsm`
    FAILED = "failed"          # compilation failed (the grammar is an Exception)
    REJECTED = "rejected"      # the FSM refused a token ("Failed to advance FSM"): G3 says never


class Fate(enum.Enum):
    LIVE = "live"              # its request is the incarnation it was scheduled for
    ORPHANED = "orphaned"      # request preempted since, not rescheduled: tokens kept
    SUPERSEDED = "superseded"  # rescheduled, aborted or finished since: tokens dropped


@dataclass(frozen=True)
class Request:
    status: Status = Status.NEW
    prompt_len: int = 0
    max_tokens: int = 0
    prompt_labels: tuple[int, ...] = ()  # content label of each full prompt block
    num_output: int = 0
    num_computed: int = 0                # advanced at schedule time
    num_drafts: int = 0                  # draft tokens proposed for the next step
    block_table: tuple[int, ...] = ()
    # vLLM 0.33's own counters (`Profile.stale_output_counters`; 0 under the
    # 0.8.x profiles): tokens of this request's batches in flight, the share
    # of them that was in flight at its last preemption (stale output), and
    # whether that share is discarded (drop mode) rather than delivered.
    num_in_flight: int = 0
    num_stale: int = 0
    drop_stale: bool = False
    name: int | None = None              # None: the slot's own index; else the reused name
    # Asynchronous scheduling (`Profile.output_placeholders`; 0 under every
    # other profile): vLLM 0.33's `num_output_placeholders` (tokens of this
    # request's sampling entries in flight, drafts included, not yet
    # returned), and the schedule() calls left before it may be scheduled
    # again (`next_decode_eligible_step - current_step`, floored at 0).
    placeholders: int = 0
    decode_countdown: int = 0
    # The KV connector (docs/kv-connector.md; all at their defaults without
    # one): what it offers this request (fixed at arrival: tokens beyond the
    # local hit, and whether they load asynchronously), the state of its
    # load, the tokens an async load in flight brings past its local hit,
    # and whether a finished request's table is still held (for a send, or
    # for an aborted load's report).
    external_hit: int = 0
    load_async: bool = False
    load: Load = Load.NONE
    external: int = 0
    held: bool = False
    # A ghost (reset_pause.py): a reset of the connector's cache forgot this
    # request's offer before it was taken (`external_hit` then 0; RP5).
    offer_reset: bool = False
    # The priority policy (`Config.scheduling_policy`, spec/priority.py; 0 under FCFS):
    # vLLM's `Request.priority`, given at arrival (lower runs first).
    priority: int = 0
    # Structured output (grammar.py; NONE and 0 without it): the grammar's
    # state and the tokens its FSM has accepted.
    grammar: Grammar = Grammar.NONE
    fsm: int = 0
    # A streaming session (spec/sessions.py; all at their defaults for any
    # other request): resumable, the inputs its client will still send, in
    # order (each `(new tokens, max_tokens)`, `(0, 0)` the end of the
    # session), the ones sent while it was not waiting for them (vLLM's
    # `streaming_queue`), and its turn: how many times it stopped and went
    # on (the session's re-add is the same request in a new turn, where a
    # reused name is a new request, a new slot).
    resumable: bool = False
    inputs_to_send: tuple[tuple[int, ...], ...] = ()     # sessions.py: (tokens, max_tokens[, prompt logprobs])
    queued_inputs: tuple[tuple[int, ...], ...] = ()
    turn: int = 0
    # vLLM's `Request.is_prefill_chunk` and membership of `deferred_waiting`
    # (cadence.py; the flag also under a profile that pads admissions, with
    # drafts: drafts.py; both False elsewhere).
    is_prefill_chunk: bool = False
    deferred_waiting: bool = False
    # vLLM's `lora_request.lora_int_id` (0: none; kept only with
    # `Config.max_loras`) and whether it asks for prompt logprobs (it then
    # reads nothing from the prefix cache); lora.py.
    lora: int = 0
    prompt_logprobs: bool = False

    @property
    def num_tokens(self) -> int:
        """Known tokens: prompt plus sampled outputs."""
        return self.prompt_len + self.num_output

    @property
    def num_tokens_with_spec(self) -> int:
        return self.num_tokens + self.num_drafts


@dataclass(frozen=True)
class Entry:
    """One request's part of a batch: the snapshot taken when it was scheduled."""

    req: int
    start: int          # num_computed before this batch, prefix-cache hit included
    n: int              # tokens scheduled, drafts included
    samples: bool       # start + n - drafts reaches the known tokens: a token comes back
    drafts: int         # draft tokens scheduled with it
    fate: Fate = Fate.LIVE
    name: int | None = None   # the name its output is looked up by; None: the slot's own index
    # The KV connector: tokens just below `start` a synchronous load brings
    # in with this batch, and (only while the step fence is in force) the
    # request's table when scheduled, the blocks the batch writes.
    external: int = 0
    blocks: tuple[int, ...] = ()
    # Structured output: the FSM position this entry's bitmask was built at
    # (grammar.DEFERRED while it waits for the oldest output; None: no mask).
    mask: int | None = None
    # A streaming session's turn when scheduled (spec/sessions.py): an entry
    # of an earlier turn than its request's is the old input's work.
    turn: int = 0
    # A ghost (reset_pause.py): the entry was in flight when a
    # `reset_prefix_cache(reset_running_requests=True)` preempted its request;
    # its output must be dropped, never applied.
    reset: bool = False

    @property
    def lookup_name(self) -> int:
        return self.req if self.name is None else self.name

    @property
    def end(self) -> int:
        return self.start + self.n


Batch = tuple[Entry, ...]


@dataclass(frozen=True)
class BlockPool:
    """vLLM's BlockPool by identity: reference counts, cached labels and the
    free queue in eviction order (head is evicted first)."""

    ref_counts: tuple[int, ...]
    labels: tuple[int | None, ...]
    free_queue: tuple[int, ...]
    # The blocks whose label another block caches too (vLLM 0.8.x keeps both
    # copies), in the order they were cached, grouped by label (a stable sort
    # by label, so the order between different labels carries no information
    # and a pool without duplicates has ()): a hit is served from the first.
    duplicates: tuple[int, ...] = ()

    @staticmethod
    def empty(num_blocks: int) -> "BlockPool":
        return BlockPool((0,) * num_blocks, (None,) * num_blocks, tuple(range(num_blocks)))

    def __getattr__(self, name: str):
        # A version of a pool store (pool_store.py: large pools, updated in
        # place) gets its tuples when they are first read.
        if name in _POOL_FIELDS and "_store" in self.__dict__:
            from .pool_store import materialize
            materialize(self)
            return self.__dict__[name]
        raise AttributeError(name)


_POOL_FIELDS = ("ref_counts", "labels", "free_queue", "duplicates")
# (so that a store's version, which has no tuples until read, reaches __getattr__;
# the constructor keeps the default)
del BlockPool.duplicates


@dataclass(frozen=True)
class State:
    requests: tuple[Request, ...]
    waiting: tuple[int, ...] = ()
    running: tuple[int, ...] = ()
    in_flight: tuple[Batch, ...] = ()        # FIFO, oldest first, at most K
    pool: BlockPool = field(default_factory=lambda: BlockPool.empty(0))
    scheduled_ids: frozenset[int] = frozenset()  # one-batch-per-request's in-flight set
    # The KV connector (docs/kv-connector.md; empty without one): vLLM's
    # `kv_holding_waiting` (waiting requests that hold blocks: parked and
    # landed loads, drained before `waiting`); `deferred_frees`, oldest
    # first, each (non-empty batches still in flight, blocks freed while they
    # were: `sched_step_seq - processed_step_seq`), drained in order
    # (`_drain_deferred_frees`); and, only under vLLM 0.34's load limit, the
    # order of arrival (`_next_waiting_queue` compares arrival times), and
    # under the priority policy (`Request.__lt__`: arrival breaks a tie).
    kv_holding: tuple[int, ...] = ()
    deferred_frees: tuple[tuple[int, tuple[int, ...]], ...] = ()
    # The fail policy's tables (kv_fence.py, `error_frees`): requests a load
    # failure finished, each (non-empty batches in flight up to the output
    # reporting it, blocks, whether a later batch of the request fences it),
    # freed at the end of that output's update, or fenced from there.
    error_frees: tuple[tuple[int, tuple[int, ...], bool], ...] = ()
    arrivals: tuple[int, ...] = ()
    # vLLM's `PauseState` (reset_pause.py; UNPAUSED without `Config.reset_and_pause`).
    pause: Pause = Pause.UNPAUSED
    # Structured output: vLLM's `grammar_compile_error_reqs` (failed grammars
    # the waiting loop met, finished by the next completion).
    grammar_errors: frozenset[int] = frozenset()
    # vLLM 0.33/0.34's local prefill cadence (cadence.py; 0 and False while
    # `Config.prefill_schedule_interval` is 1): the executed steps the hold
    # still lasts, and `prefill_capacity_bound`.
    prefill_hold: int = 0
    prefill_capacity_bound: bool = False
    # KV7 (kv_invalid.py): blocks a failed sync load left invalid under the
    # recompute policy, until a batch recomputes them or they leave the cache.
    # A history variable: no action of the spec reads it (the trace checker's
    # KV7 does), so it takes no part in a state's identity (the explicit
    # search's states and the Z3 encodings are those without it).
    invalid_kv: frozenset[int] = field(default=frozenset(), compare=False)
    # KV8 (kv_unwritten.py): (block, label) of blocks cached for a chunk a
    # priority preemption took back in its own call, until a batch writes
    # them or they lose that label. A history variable, like `invalid_kv`.
    unwritten_kv: frozenset[tuple[int, int]] = field(default=frozenset(), compare=False)

    def with_request(self, r: int, **changes) -> "State":
        old = self.requests[r]
        if all(getattr(old, name) == value for name, value in changes.items()):
            return self                   # nothing changes (a decode's drafts stay 0, its table as it was)
        # `dataclasses.replace`, without its per-field cost (neither class has __post_init__);
        # a long requests tuple is updated in place (request_store.py)
        request = evolve(old, **changes)
        return evolve(self, requests=replaced(self.requests, r, request))

    def entries_of(self, r: int, fate: Fate | None = Fate.LIVE) -> list[Entry]:
        """r's entries in FIFO order (only those of `fate`, unless None)."""
        return [e for e in self._entries_by_request.get(r, ()) if fate is None or e.fate == fate]

    @cached_property
    def running_set(self) -> frozenset[int]:
        return frozenset(self.running)

    @cached_property
    def waiting_set(self) -> frozenset[int]:
        return frozenset(self.waiting)

    @cached_property
    def kv_holding_set(self) -> frozenset[int]:
        return frozenset(self.kv_holding)

    @cached_property
    def holders(self) -> dict[int, int]:
        """Each name's holder (`holder_of`), found in one pass per state: a
        completion looks up every entry of its batch by name, and a long
        trace's state holds hundreds of requests."""
        found: dict[int, int] = {}
        for r, q in enumerate(self.requests):
            if q.status in ACTIVE:
                found.setdefault(r if q.name is None else q.name, r)
        return found

    @cached_property
    def _entries_by_request(self) -> dict[int, list[Entry]]:
        """Every in-flight entry, grouped by request in FIFO order: built once
        per state, so asking for each request's entries costs what they hold
        rather than the whole FIFO (the trace checker asks for many)."""
        index: dict[int, list[Entry]] = {}
        for batch in self.in_flight:
            for e in batch:
                index.setdefault(e.req, []).append(e)
        return index

    def num_new_tokens(self, r: int) -> int:
        """vLLM's `num_tokens_with_spec + num_output_placeholders -
        num_computed_tokens` (placeholders are 0 outside async scheduling)."""
        req = self.requests[r]
        return req.num_tokens_with_spec + req.placeholders - req.num_computed


def evolve(value: Any, **changes: Any) -> Any:
    """`dataclasses.replace` for the spec's frozen records (none has a
    __post_init__), without its per-field cost; a state's cached properties
    are not carried over."""
    names = value.__dataclass_fields__
    if not changes.keys() <= names.keys():
        raise TypeError(f"unknown fields {sorted(changes.keys() - names.keys())}")
    new = object.__new__(type(value))
    fields = new.__dict__
    fields.update(value.__dict__)
    if len(fields) != len(names):              # a state's cached properties: not carried over
        for name in [name for name in fields if name not in names]:
            del fields[name]
    fields.update(changes)
    return new


def name_of(state: State, r: int) -> int:
    """The name slot r arrived under."""
    name = state.requests[r].name
    return r if name is None else name


def holder_of(state: State, name: int) -> int | None:
    """The slot that holds `name` now: the unfinished request arrived under it
    (vLLM's `self.requests.get(req_id)`; a finished request is gone from
    that dict), or None."""
    requests = state.requests
    if 0 <= name < len(requests):
        own = requests[name]
        if own.name is None and own.status in ACTIVE:
            # the name's first slot, unfinished: no other slot can hold the
            # name (`arrive_as` takes a name only once its holder finished,
            # and a finished slot never runs again)
            return name
    return state.holders.get(name)


def initial_state(num_requests: int, num_blocks: int) -> State:
    return State(requests=(Request(),) * num_requests, pool=BlockPool.empty(num_blocks))


def content_label(state: State, r: int, block_index: int, block_size: int) -> int:
    """The content of r's block `block_index`: its prompt label if the block is
    all of the prompt it arrived with, otherwise a label unique to
    (r, block_index). A streaming session's later prompt blocks (the kept
    outputs and the inputs of its next turns, spec/sessions.py `_take_input`)
    take the unique label too: vLLM's chained hash of such a block runs
    through r's own sampled tokens (or its own inputs), and the block's
    tokens never change once it is full of computed ones, so the label it
    was cached under as an output block is still its hash as a prompt block."""
    req = state.requests[r]
    if block_index < len(req.prompt_labels) and (block_index + 1) * block_size <= req.prompt_len:
        return req.prompt_labels[block_index]
    return -(1 + r + len(state.requests) * block_index)


def retire_entries(state: State, r: int, from_fates: frozenset[Fate], to: Fate) -> State:
    """Every in-flight entry of r whose fate is in `from_fates` becomes `to`."""
    def retire(e: Entry) -> Entry:
        return replace(e, fate=to) if e.req == r and e.fate in from_fates else e
    return replace(state, in_flight=tuple(tuple(retire(e) for e in b) for b in state.in_flight))


def describe_request(q: Request) -> str:
    """A request's status and counters as step tables print them, without its
    label: "RUNN c=4/8+1d o=0 b=[1] ..." (zero counters left out)."""
    status = _SHORT_STATUS.get(q.status, q.status.value[:4])
    return (f"{status} c={q.num_computed}/{q.num_tokens}"
            f"{f'+{q.num_drafts}d' if q.num_drafts else ''} o={q.num_output}"
            f" b={list(q.block_table)}"
            f"{f' if={q.num_in_flight}' if q.num_in_flight else ''}"
            f"{f' stale={q.num_stale}' if q.num_stale else ''}{' drop' if q.drop_stale else ''}"
            f"{f' ph={q.placeholders}' if q.placeholders else ''}"
            f"{f' wait={q.decode_countdown}' if q.decode_countdown else ''}"
            f"{f' load={q.load.value}' if q.load is not Load.NONE else ''}"
            f"{f' ext={q.external}' if q.external else ''}{' held' if q.held else ''}"
            f"{f' turn={q.turn}' if q.turn else ''}{f' queued={list(q.queued_inputs)}' if q.queued_inputs else ''}"
            f"{f' grammar={q.grammar.value} fsm={q.fsm}' if q.grammar is not Grammar.NONE else ''}")


_SHORT_STATUS = {Status.WAITING_FOR_REMOTE_KVS: "RKVS", Status.WAITING_FOR_STREAMING_REQ: "WSTR",
                 Status.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR: "GRMR"}


def describe(state: State) -> str:
    """A compact one-line rendering, for step tables."""
    reqs = []
    for i, q in enumerate(state.requests):
        if q.status is Status.NEW:
            continue
        reqs.append(f"r{i}{f'(as r{q.name})' if q.name is not None else ''}:{describe_request(q)}")
    batches = ["[" + " ".join(f"r{e.req}{'' if e.name is None else f'(as r{e.name})'}"
                              f"@{e.start}+{e.n}{'*' if e.samples else ''}"
                              f"{'' if e.fate is Fate.LIVE else '~' + e.fate.value[0]}{'!' if e.reset else ''}"
                              for e in b) + "]" for b in state.in_flight]
    kv = (f"{f' H={list(state.kv_holding)}' if state.kv_holding else ''}"
          f"{f' deferred={[list(d) for d in state.deferred_frees]}' if state.deferred_frees else ''}"
          f"{f' error_frees={[list(d) for d in state.error_frees]}' if state.error_frees else ''}")
    kv += "" if state.pause is Pause.UNPAUSED else f" paused={state.pause.value}"
    return (f"{'; '.join(reqs) or '-'} | W={list(state.waiting)} R={list(state.running)}{kv}"
            f" | Q={' '.join(batches) or '-'} | free={list(state.pool.free_queue)}")
