"""A request and its lifecycle (vLLM's `vllm/v1/request.py`).

Besides vLLM's fields a request carries its *incarnation*: a number, unique
within one scheduler, that changes whenever the request's in-flight work stops
being its own (preemption, abort). Every batch entry records the incarnation
it was scheduled for, so an output is bound to the incarnation it belongs to,
never to a request name alone (a name can be reused after an abort).
"""

from __future__ import annotations

import enum
import functools
from collections import deque
from dataclasses import dataclass


class RequestStatus(enum.IntEnum):
    WAITING = enum.auto()
    # A KV connector's async load is in flight, or landed and not yet
    # promoted (vLLM's `WAITING_FOR_REMOTE_KVS`; connector.py).
    WAITING_FOR_REMOTE_KVS = enum.auto()
    # Structured output: its grammar still compiles, or failed and is not
    # yet finished (vLLM's `WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR`; grammar.py).
    WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR = enum.auto()
    # A streaming session parked between turns, waiting for its client's
    # next input (vLLM's `WAITING_FOR_STREAMING_REQ`; sessions.py).
    WAITING_FOR_STREAMING_REQ = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    # Everything after PREEMPTED is finished (vLLM's ordering trick).
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    # The connector's load failed under `load_failure_policy="fail"`.
    FINISHED_ERROR = enum.auto()

    @staticmethod
    def is_finished(status: "RequestStatus") -> bool:
        return status > RequestStatus.PREEMPTED

    @staticmethod
    def get_finished_reason(status: "RequestStatus") -> str | None:
        return _FINISHED_REASONS.get(status)


# Compared with on every step (the statuses' attributes of RequestStatus go
# through EnumType.__getattr__'s slow path on Python 3.11).
_RUNNING, _PREEMPTED = RequestStatus.RUNNING, RequestStatus.PREEMPTED

_FINISHED_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_ERROR: "error",
}


class KvLoad(enum.Enum):
    """A request's connector load, as the scheduler knows it: none, in
    flight (parked in WAITING_FOR_REMOTE_KVS), landed (`finished_recving`
    seen, not yet promoted) or failed (the failure seen, the landing not
    yet: the spec's `Request.load`)."""
    NONE = "none"
    IN_FLIGHT = "in_flight"
    RECEIVED = "received"
    FAILED = "failed"


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    ignore_eos: bool = False                 # EOS does not stop (stop_token_ids still do, as vLLM)
    stop_token_ids: tuple[int, ...] = ()
    temperature: float = 0.0                 # for the runtime; the scheduler ignores it
    seed: int | None = None                  # for the runtime; the scheduler ignores it


@functools.lru_cache(maxsize=1024)
def _stop_token_set(stop_token_ids: tuple[int, ...], eos_token_id: int | None) -> frozenset[int]:
    """One shared set per distinct stop configuration (most requests share
    one), so the per-token stop check does not touch a set of its own."""
    stops = set(stop_token_ids)
    if eos_token_id is not None:
        stops.add(eos_token_id)
    return frozenset(stops)


class Request:
    # The fields every engine step reads come first, next to the object
    # header, so a step touches as few cache lines per request as it can.
    __slots__ = (
        "status", "num_computed_tokens", "all_token_ids", "spec_token_ids", "incarnation",
        "request_id", "num_prompt_tokens", "max_tokens", "stop_token_set", "stop_reason",
        "orphaned_incarnation",
        "prompt_token_ids", "sampling_params", "eos_token_id", "arrival_time",
        "num_cached_tokens", "block_hashes", "first_incarnation", "arrival_order",
        "num_in_flight_tokens", "num_stale_output_tokens", "drop_stale_output",
        "num_output_placeholders", "next_decode_eligible_step", "is_prefill_chunk",
        "kv_offer", "kv_load", "last_sched_seq", "inflight_prefill", "status_before_load",
        "parked_reservation", "kv_external", "kv_rolled_back", "grammar", "fsm",
        "resumable", "streaming_queue", "priority", "lora_int_id", "prompt_logprobs",
    )

    def __init__(self, request_id: str, prompt_token_ids: list[int],
                 sampling_params: SamplingParams | None = None,
                 eos_token_id: int | None = None, arrival_time: float = 0.0, priority: int = 0) -> None:
        self.request_id = request_id
        self.priority = priority                     # the priority policy's (lower runs first)
        self.prompt_token_ids: list[int] = list(prompt_token_ids)
        self.sampling_params = sampling_params if sampling_params is not None else SamplingParams()
        self.eos_token_id = eos_token_id
        self.arrival_time = arrival_time
        self.status = RequestStatus.WAITING
        self.stop_reason: int | None = None          # the stop token id, if one stopped it
        # Prompt + outputs in one list: appending a token touches one list, and
        # slices across the prompt/output boundary are cheap.
        # A plain attribute, not a property: every step reads it.
        self.all_token_ids: list[int] = list(self.prompt_token_ids)
        self.num_prompt_tokens = len(self.prompt_token_ids)
        self.max_tokens = self.sampling_params.max_tokens
        # Every token that may stop the request (EOS unless ignore_eos), so the
        # per-token check is one set lookup.
        self.stop_token_set = _stop_token_set(
            tuple(self.sampling_params.stop_token_ids),
            None if self.sampling_params.ignore_eos else eos_token_id)
        # Drafts proposed for the next step; a tuple, so "no drafts" is the one
        # shared () and entries can share it without copying.
        self.spec_token_ids: tuple[int, ...] = ()
        # Tokens whose KV is computed or in flight (advanced at schedule time).
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0                   # prefix hit of the last admission
        # Chained hashes of the full blocks of known tokens, filled lazily by the
        # KV cache manager; token ids only grow, so they stay valid across preemption.
        self.block_hashes: list[int] = []
        # Set by Scheduler.add_request (scheduler-wide unique numbers).
        self.incarnation = -1
        self.first_incarnation = -1
        # Where it stands in the order of arrival under FCFS (vLLM's wall-clock
        # `arrival_time`): its add's number, then, in a session, that of the
        # input it took last (`_update_request_as_session` takes the input's).
        self.arrival_order = -1
        # The incarnation a preemption ended, until the request is rescheduled:
        # entries of that incarnation are orphaned, not superseded.
        self.orphaned_incarnation: int | None = None
        # vLLM 0.33's own counters (profiles.py `stale_output_counters`; kept
        # only under that profile): tokens of this request's batches scheduled
        # and not yet processed, the share of them scheduled before its last
        # preemption (stale), and whether that share is discarded (drop mode).
        self.num_in_flight_tokens = 0
        self.num_stale_output_tokens = 0
        self.drop_stale_output = False
        # vLLM 0.33's async scheduling (profiles.py `async_scheduling`; 0
        # otherwise): sampling steps (+ drafts) scheduled whose tokens are not
        # back yet; the first `schedule()` call number at which the next
        # decode may be scheduled (the stagger; never reset, as vLLM's
        # `Request.next_decode_eligible_step`); and whether the last entry
        # scheduled was a non-final prefill chunk (it samples nothing).
        self.num_output_placeholders = 0
        self.next_decode_eligible_step = 0
        self.is_prefill_chunk = False
        self._init_kv_fields()
        self._init_feature_fields()

    def _init_feature_fields(self) -> None:
        """The request-state features' own fields, each off by default."""
        # A streaming session (sessions.py): resumable, and the inputs its
        # client sent while it was not waiting for them (None: the end).
        self.resumable = False
        self.streaming_queue: deque = deque()
        # Its LoRA (vLLM's `lora_request.lora_int_id`; 0: none) and whether it
        # asks for prompt logprobs (it then reads no prefix cache); lora.py.
        self.lora_int_id = 0
        self.prompt_logprobs = False

    def _init_kv_fields(self) -> None:
        """The KV connector's (connector.py, kv_transfer.py; untouched
        without one): what the connector offers this request (`KvOffer`,
        None: no offer), the state of its load (`KvLoad`), the last non-empty
        step that scheduled it (vLLM's `last_sched_seq`, the step fence),
        whether it holds an in-flight prefill's block reservation (vLLM's
        `_inflight_prefills`), and the status a parked load returns to."""
        self.kv_offer = None
        self.kv_load = KvLoad.NONE
        self.last_sched_seq = 0
        self.inflight_prefill = False
        self.parked_reservation = False       # vLLM's `_parked_reservations`
        self.kv_external = 0                  # tokens past its local hit an async load in flight brings
        self.kv_rolled_back = False           # a KV load's rollback: its next entry resets the worker
        # Structured output (grammar.py): None, or "compiling" / "ready" /
        # "failed"; and the tokens its FSM has accepted.
        self.grammar: str | None = None
        self.fsm = 0
        self.status_before_load = RequestStatus.WAITING

    @property
    def output_token_ids(self) -> list[int]:
        return self.all_token_ids[self.num_prompt_tokens:]

    @property
    def num_tokens(self) -> int:
        """Known tokens: prompt plus sampled outputs."""
        return len(self.all_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        return len(self.all_token_ids) + len(self.spec_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.all_token_ids) - self.num_prompt_tokens

    def append_output_token_id(self, token_id: int) -> None:
        self.all_token_ids.append(token_id)

    def is_finished(self) -> bool:
        return self.status > _PREEMPTED

    def get_finished_reason(self) -> str | None:
        return _FINISHED_REASONS.get(self.status)

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, {self.status.name}, computed="
                f"{self.num_computed_tokens}/{self.num_tokens}"
                f"{'+' + str(len(self.spec_token_ids)) + 'd' if self.spec_token_ids else ''},"
                f" outputs={self.num_output_tokens}, inc={self.incarnation})")
