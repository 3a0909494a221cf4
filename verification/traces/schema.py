"""The trace format as data: every event kind, every field, its type and range.

check-trace validates a whole trace against this schema before the spec sees
any of it, so a malformed file is reported as malformed (exit 2) with the line,
the field and what was expected, and never reaches the spec as a value of the
wrong type (where it would surface as a traceback or, worse, be coerced and
accepted). docs/trace-format.md is the same schema written for users; keep the
two in step.

Ranges are the format's, not the spec's: a prompt longer than `max_model_len`
is well formed and an illegal arrival (a violation, exit 1); a prompt length of
10**30 or -1 is malformed. The bounds keep every value the checker builds from
a trace (label tuples, block pools) of a size it can afford.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from typing import Any, Mapping

MAX_COUNT = 2**31 - 1          # token counts, ids and budgets: vLLM holds them in int32
MAX_STAGES = 1024              # pipeline stages
MAX_MODEL_LEN = 2**24          # tokens per request (16 Mi): bounds the labels built per prompt
MAX_POOL_BLOCKS = 2**20        # blocks the checker models (vLLM's pools are under 1 Mi): O(pool) to build, O(blocks taken) per event
MAX_LABEL = 2**63 - 1          # prompt block labels (stand-ins for block hashes)


class SchemaError(ValueError):
    """A value that does not fit the schema, at `path` inside the event."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(message)
        self.path, self.message = path, message


def show(value: Any) -> str:
    """A short, ASCII-only rendering of a JSON value for one-line messages
    (ASCII so that a lone surrogate or a control character cannot break the
    printing of the message itself)."""
    if isinstance(value, dict):
        return f"an object with {len(value)} keys"
    if isinstance(value, list):
        return f"a list of {len(value)} items"
    if isinstance(value, str):
        text = json.dumps(value[:40], ensure_ascii=True)
        return text if len(value) <= 40 else text[:-1] + '..."'
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)            # nan, inf, -inf: as JSON parsers spell them, near enough
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**15:
        return f"an integer of {len(str(abs(value)))} digits"
    return json.dumps(value)


MESSAGE_LIMIT = 2000          # characters of one message line, whatever the trace holds


def one_line(message: str, limit: int = MESSAGE_LIMIT) -> str:
    """`message` as one printable ASCII line of at most about `limit`
    characters: control characters and anything beyond ASCII escaped (as
    Python writes them), the excess cut with a count. The last guard of
    every message check-trace prints: whatever a request id holds, it can
    neither start a line of its own nor move the terminal's cursor."""
    text = message.encode("ascii", "backslashreplace").decode("ascii")
    text = "".join(c if " " <= c <= "~" else repr(c)[1:-1] for c in text)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit} more characters)"


class Kind:
    """What a field may hold; `check` raises SchemaError naming `path`."""

    expected: str = "a value"

    def check(self, value: Any, path: str) -> None:
        if not self.accepts(value):
            raise SchemaError(path, f"{path}: expected {self.expected}, got {show(value)}")

    def accepts(self, value: Any) -> bool:
        raise NotImplementedError


@dataclass(frozen=True)
class Integer(Kind):
    low: int
    high: int
    what: str = "an integer"

    @property
    def expected(self) -> str:  # type: ignore[override]
        return f"{self.what} from {self.low} to {self.high}"

    def accepts(self, value: Any) -> bool:
        # bool is an int in Python but `true` is not a count in the format
        return isinstance(value, int) and not isinstance(value, bool) and self.low <= value <= self.high


@dataclass(frozen=True)
class Number(Kind):
    expected: str = "a finite number"

    def check(self, value: Any, path: str) -> None:
        # an integer token past the largest float (1 followed by 309 zeros) is
        # valid JSON, but no time or share can be computed from it
        if isinstance(value, int) and not isinstance(value, bool) and not fits_a_float(value):
            raise SchemaError(path, f"{path}: expected {self.expected}, got a number beyond float range "
                              f"({show(value)})")
        super().check(value, path)

    def accepts(self, value: Any) -> bool:
        return (isinstance(value, (int, float)) and not isinstance(value, bool)
                and fits_a_float(value) and math.isfinite(value))


def fits_a_float(value: int | float) -> bool:
    """Whether `value` converts to a float without overflow (every float does;
    an integer up to about 1.8e308 does)."""
    return isinstance(value, float) or abs(value) <= _LARGEST_FLOAT_INT


_LARGEST_FLOAT_INT = int(sys.float_info.max)


@dataclass(frozen=True)
class Share(Number):
    expected: str = "a number from 0 to 1"

    def accepts(self, value: Any) -> bool:
        return super().accepts(value) and 0 <= value <= 1


@dataclass(frozen=True)
class Text(Kind):
    expected: str = "a string of valid Unicode"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, str) and is_valid_unicode(value)


@dataclass(frozen=True)
class Flag(Kind):
    expected: str = "true or false"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, bool)


@dataclass(frozen=True)
class Choice(Kind):
    values: tuple[str, ...]

    @property
    def expected(self) -> str:  # type: ignore[override]
        return "one of " + ", ".join(json.dumps(v) for v in self.values)

    def accepts(self, value: Any) -> bool:
        return isinstance(value, str) and value in self.values


@dataclass(frozen=True)
class Nullable(Kind):
    inner: Kind

    @property
    def expected(self) -> str:  # type: ignore[override]
        return f"{self.inner.expected} or null"

    def check(self, value: Any, path: str) -> None:
        if value is None:
            return
        try:
            self.inner.check(value, path)
        except SchemaError as err:
            if err.path != path:            # deeper inside: that message is the precise one
                raise
            raise SchemaError(path, f"{path}: expected {self.expected}, got {show(value)}") from None


@dataclass(frozen=True)
class ListOf(Kind):
    item: Kind

    @property
    def expected(self) -> str:  # type: ignore[override]
        return f"a list of {self.item.expected}"

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, list):
            raise SchemaError(path, f"{path}: expected {self.expected}, got {show(value)}")
        for i, item in enumerate(value):
            self.item.check(item, f"{path}[{i}]")


@dataclass(frozen=True)
class MapOf(Kind):
    """A JSON object from request ids to `value`s."""

    value: Kind

    @property
    def expected(self) -> str:  # type: ignore[override]
        return f"an object from request ids to {self.value.expected}"

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, dict):
            raise SchemaError(path, f"{path}: expected {self.expected}, got {show(value)}")
        for key, item in value.items():
            where = f"{path}[{show(key)}]"
            if not is_valid_unicode(key):
                raise SchemaError(where, f"{where}: expected a request id of valid Unicode")
            self.value.check(item, where)


@dataclass(frozen=True)
class Record(Kind):
    """A JSON object with named fields: (kind, required). Unknown keys are
    ignored, as the format says, so writers may add their own."""

    fields: Mapping[str, tuple[Kind, bool]]
    expected: str = "an object"

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, dict):
            raise SchemaError(path, f"{path}: expected {self.expected}, got {show(value)}")
        for name, (kind, required) in self.fields.items():
            where = f"{path}.{name}" if path else name
            if name in value:
                kind.check(value[name], where)
            elif required:
                raise SchemaError(where, f"{where}: missing (expected {kind.expected})")


def is_valid_unicode(text: str) -> bool:
    """False for a string holding a lone surrogate (JSON's "\\ud800" escape
    decodes to one): it is not text and cannot be printed."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# -- the fields ------------------------------------------------------------------

COUNT = Integer(0, MAX_COUNT)
POSITIVE = Integer(1, MAX_COUNT)
SCHEDULED_TOKENS = Integer(-MAX_COUNT, MAX_COUNT, "an integer (tokens scheduled)")
TOKEN_ID = Integer(0, MAX_COUNT, "a token id: an integer")
TOKEN_IDS = ListOf(TOKEN_ID)
REQUEST_ID = Text(expected="a request id: a string of valid Unicode")
BATCH_ID = Nullable(Integer(0, MAX_COUNT, "a batch id: an integer"))
TIME = Number(expected="a finite number of seconds")

# Fields every event may carry.
COMMON: dict[str, tuple[Kind, bool]] = {"t": (TIME, False), "step": (COUNT, False),
                                        "engine_step": (COUNT, False)}

# The KV connector's configuration (docs/kv-connector.md, "The model").
KV_CONNECTOR = Record({
    "consumer": (Flag(), True),
    "producer": (Flag(), True),
    "load_failure_policy": (Choice(("recompute", "fail")), False),
    "max_inflight_loads": (Nullable(POSITIVE), False),
}, expected="an object (the KV connector)")

CONFIG = Record({
    **COMMON,
    "num_stages": (Integer(1, MAX_STAGES), True),
    "max_num_batched_tokens": (POSITIVE, True),
    "max_num_seqs": (POSITIVE, False),
    "block_size": (Integer(1, MAX_MODEL_LEN), True),
    "num_blocks": (POSITIVE, True),
    "usable_blocks": (POSITIVE, False),
    "max_model_len": (Integer(1, MAX_MODEL_LEN), True),
    "long_prefill_token_threshold": (COUNT, False),
    "num_spec_tokens": (COUNT, False),
    "num_lookahead_tokens": (COUNT, False),    # a drafter's KV slots past the scheduled tokens (vLLM 0.33+)
    "draft_input_slots": (COUNT, False),       # the budget's input slots per entry for a draft model (0.33+)
    "prefix_caching": (Flag(), False),
    # vLLM's chunked prefill switch (default on) and 0.34's cache-aware
    # admission order (window 0 = off; the KV cache usage it waits for)
    "enable_chunked_prefill": (Flag(), False),
    "cache_aware_admission_window": (COUNT, False),
    "cache_aware_admission_threshold": (Share(), False),
    # vLLM 0.33/0.34's local prefill cadence (1 = off; spec/cadence.py)
    "prefill_schedule_interval": (POSITIVE, False),
    "policy": (Choice(("continue-prefill", "one-batch-per-request")), False),
    "num_preallocate_tokens": (COUNT, False),
    "release_order": (Choice(("reverse", "forward")), False),
    "cache_duplicate_blocks": (Flag(), False),
    "eos_token_id": (Nullable(TOKEN_ID), False),
    "vllm_version": (Text(), False),
    "profile": (Text(), False),            # a spec profile's name (flightcheck's writers)
    # asynchronous scheduling (vLLM 0.33 AsyncScheduler): profile vllm-0.33-async
    "async_scheduling": (Flag(), False),
    "batch_queue_depth": (Integer(1, MAX_STAGES + 1), False),
    "decode_stagger": (Integer(0, MAX_STAGES), False),
    # the writer notes every empty batch (`empty_batches_before`, `empty_batch`)
    "notes_empty_batches": (Flag(), False),
    # the KV connector (docs/kv-connector.md); absent or null: none
    "kv_connector": (Nullable(KV_CONNECTOR), False),
    # streaming sessions (docs/request-states.md): `resumable` arrivals and `input` events
    "streaming_sessions": (Flag(), False),
    # vLLM's scheduling policy (docs/request-states.md, "Priority scheduling")
    "scheduling_policy": (Choice(("fcfs", "priority")), False),
    # structured output (spec/grammar.py): requests may wait for a grammar
    "structured_output": (Flag(), False),
    # vLLM's `LoRAConfig.max_loras` (absent or 0: no LoRA config; spec/lora.py)
    "max_loras": (COUNT, False),
    # requests may ask for prompt logprobs (`prompt_logprobs` arrivals; spec/lora.py)
    "prompt_logprobs": (Flag(), False),
})

ARRIVE = Record({
    **COMMON,
    "req": (REQUEST_ID, True),
    "prompt_len": (Integer(0, MAX_MODEL_LEN), True),
    "max_tokens": (COUNT, True),
    "prompt_token_ids": (TOKEN_IDS, False),
    "prompt_block_labels": (ListOf(Integer(0, MAX_LABEL, "a block label: an integer")), False),
    "eos_token_id": (Nullable(TOKEN_ID), False),
    "ignore_eos": (Flag(), False),
    "stop_token_ids": (Nullable(TOKEN_IDS), False),
    # what the KV connector offers this request (kv_connector only)
    "external_hit": (COUNT, False),
    "load_async": (Flag(), False),
    # a streaming session's first input (streaming_sessions only)
    "resumable": (Flag(), False),
    # vLLM's `Request.priority` (read under scheduling_policy "priority")
    "priority": (Integer(-(2**31), 2**31 - 1), False),
    # it asks for structured output (structured_output only)
    "structured": (Flag(), False),
    # its LoRA (`lora_request.lora_int_id`; absent or 0: none) and whether it
    # asks for prompt logprobs (spec/lora.py)
    "lora": (COUNT, False),
    "prompt_logprobs": (Flag(), False),
})

ENTRY = Record({
    "req": (REQUEST_ID, True),
    "start": (COUNT, True),
    # An integer, not a count: vLLM 0.8.x with speculative decoding can
    # schedule fewer than 0 tokens (its recorder writes what vLLM did); such
    # an entry is read, and rejected as a decision, not refused as malformed.
    "n": (SCHEDULED_TOKENS, True),
    "cached": (COUNT, False),
    "drafts": (COUNT, False),
    "samples": (Nullable(Flag()), False),
    "block_ids": (ListOf(Integer(0, MAX_COUNT, "a block id: an integer")), False),
    "placeholders": (COUNT, False),     # async: the request's output placeholders after this batch
    "external": (COUNT, False),         # tokens of `start` a sync KV load brings (kv_connector only)
}, expected="an object (a schedule entry)")

# A request parked in WAITING_FOR_REMOTE_KVS for an async KV load.
KV_LOAD = Record({
    "req": (REQUEST_ID, True),
    "start": (COUNT, True),
    "block_ids": (ListOf(Integer(0, MAX_COUNT, "a block id: an integer")), False),   # its table
}, expected="an object (a parked KV load)")

SCHEDULE = Record({
    **COMMON,
    "batch": (BATCH_ID, False),
    "entries": (ListOf(ENTRY), True),
    "preempted": (ListOf(REQUEST_ID), False),
    "kv_loads": (ListOf(KV_LOAD), False),   # requests parked for an async KV load in this call
    "skip_drafts": (Flag(), False),         # the model runner proposes no drafts after this batch (vLLM 0.33+)
})

STAGE = Record({
    **COMMON,
    "batch": (BATCH_ID, True),
    "stage": (Integer(0, MAX_STAGES - 1), True),
    "t0": (TIME, True),
    "t1": (TIME, True),
    "recv": (TIME, False),
})

COMPLETE = Record({
    **COMMON,
    "batch": (BATCH_ID, False),
    "tokens": (MapOf(TOKEN_IDS), False),
    "dropped": (ListOf(REQUEST_ID), False),
    "next_drafts": (MapOf(COUNT), False),
})

FINISH = Record({
    **COMMON,
    "req": (REQUEST_ID, True),
    "reason": (Choice(("stop", "length", "abort", "error")), True),
    "held": (Flag(), False),               # blocks held for a KV send (kv_connector only)
})

ABORT = Record({**COMMON, "req": (REQUEST_ID, True)})

# A streaming session's later input (streaming_sessions only): vLLM's
# `add_request` under the session's live id. Its new prompt tokens and the
# next turn's max_tokens, or the end of the session (`end_of_session`).
INPUT = Record({
    **COMMON,
    "req": (REQUEST_ID, True),
    "num_tokens": (Integer(0, MAX_MODEL_LEN), False),
    "max_tokens": (COUNT, False),
    "end_of_session": (Flag(), False),
    # its sampling parameters ask for prompt logprobs (spec/lora.py `take_input_logprobs`)
    "prompt_logprobs": (Flag(), False),
})
END = Record(dict(COMMON))

# The KV connector's reports, where the scheduler processed them.
KV_RECEIVED = Record({**COMMON, "req": (REQUEST_ID, True)})
# A request an output's failures rolled back besides the failing ones (it shares their blocks).
KV_HOLDER = Record({
    "req": (REQUEST_ID, True),
    "computed": (COUNT, True),             # its computed tokens once the failures were processed
    "placeholders": (COUNT, False),        # async: its output placeholders then
}, expected="an object (a request rolled back with a failed load)")
KV_FAILED = Record({
    **COMMON,
    "req": (REQUEST_ID, True),
    "from_block": (COUNT, True),           # the first invalid block's index in req's table; 0: the whole load
    "computed": (COUNT, False),            # req's computed tokens once the failure was processed
    "placeholders": (COUNT, False),        # async: its output placeholders then
    "of": (COUNT, False),                  # the kv_failed events its output writes (all judged together)
    "holders": (ListOf(KV_HOLDER), False), # (on the output's last) the other requests it rolled back
})
KV_SENT = Record({**COMMON, "req": (REQUEST_ID, True)})

# Reset and pause (vLLM 0.33 on, spec/reset_pause.py): `reset_prefix_cache`
# (the running requests it preempted, tail first; whether the connector's
# cache was reset too; whether the cache was reset) and `set_pause_state`, called between engine steps.
RESET = Record({
    **COMMON,
    "running": (Flag(), True),             # reset_running_requests
    "connector": (Flag(), False),          # reset_connector (missing: false)
    "preempted": (ListOf(REQUEST_ID), False),
    "ok": (Flag(), False),                 # its return value
})
PAUSE = Record({**COMMON, "state": (Choice(("none", "new", "all")), True)})
# A structured request's grammar compiled, or failed to compile (structured_output only).
GRAMMAR_COMPILED = Record({**COMMON, "req": (REQUEST_ID, True)})
GRAMMAR_FAILED = Record({**COMMON, "req": (REQUEST_ID, True)})

# vLLM raised inside one of the scheduler calls its engine makes (the
# recorder's last event; the trace ends there, without `end`): which call,
# the exception ("<type>: <first line of its message>"), where it was raised.
RAISED_IN = ("schedule", "update_from_output", "finish_requests")
RAISED = Record({
    **COMMON,
    "in": (Choice(RAISED_IN), True),
    "error": (Text(expected="the exception: a string of valid Unicode"), True),
    "at": (Text(expected="where it was raised: a string of valid Unicode"), False),
})

# A streaming recorder's marker: `count` events were lost here (its buffer
# was full, or its sink refused them); nothing after it can be judged.
DROPPED = Record({**COMMON, "count": (POSITIVE, True)})

EVENTS: dict[str, Record] = {"config": CONFIG, "arrive": ARRIVE, "schedule": SCHEDULE, "stage": STAGE,
                             "complete": COMPLETE, "finish": FINISH, "abort": ABORT, "end": END,
                             "kv_received": KV_RECEIVED, "kv_failed": KV_FAILED, "kv_sent": KV_SENT,
                             "reset": RESET, "pause": PAUSE, "dropped": DROPPED,
                             "grammar_compiled": GRAMMAR_COMPILED, "grammar_failed": GRAMMAR_FAILED,
                             "input": INPUT, "raised": RAISED}
GRAMMAR_EVENTS = frozenset({"grammar_compiled", "grammar_failed"})
KV_EVENTS = frozenset({"kv_received", "kv_failed", "kv_sent"})
EVENT_KIND = Choice(tuple(EVENTS))


def validate_event(event: Any, config: dict[str, Any] | None) -> None:
    """Raise SchemaError unless `event` is a well-formed event. `config` is the
    trace's config event (None while validating the config itself), for the
    checks that relate fields across events."""
    if not isinstance(event, dict):
        raise SchemaError("", f"expected an event (a JSON object), got {show(event)}")
    if "ev" not in event:
        raise SchemaError("ev", f"ev: missing (expected {EVENT_KIND.expected})")
    EVENT_KIND.check(event["ev"], "ev")
    kind = event["ev"]
    EVENTS[kind].check(event, "")
    if kind == "config":
        if config is not None:
            raise SchemaError("ev", "ev: a second config event (expected one, on the first line)")
        if "usable_blocks" in event and event["usable_blocks"] > event["num_blocks"]:
            raise SchemaError("usable_blocks", f"usable_blocks: expected at most num_blocks "
                              f"({event['num_blocks']}), got {show(event['usable_blocks'])}")
    elif config is None:
        raise SchemaError("ev", f"ev: expected \"config\" on the first line, got {show(kind)}")
    else:
        if config.get("kv_connector") is None:
            _refuse_kv_without_connector(event, bool(config.get("structured_output")))
        if not config.get("structured_output"):
            _refuse_grammar_without_structured_output(event)
        _check_session_fields(event, bool(config.get("streaming_sessions", False)))
        if kind == "arrive" and "prompt_token_ids" in event:
            if len(event["prompt_token_ids"]) != event["prompt_len"]:
                raise SchemaError("prompt_token_ids", f"prompt_token_ids: expected prompt_len "
                                  f"({event['prompt_len']}) token ids, got {len(event['prompt_token_ids'])}")


def _check_session_fields(event: dict[str, Any], sessions: bool) -> None:
    """A session's `input` or `resumable` arrival needs `streaming_sessions`
    in the config (the checker picks its model by it); an input that does
    not end the session gives its tokens and max_tokens."""
    kind = event["ev"]
    found = "ev" if kind == "input" else "resumable" if kind == "arrive" and event.get("resumable") else None
    if found is not None and not sessions:
        raise SchemaError(found, f"{found}: expected no streaming session's input or resumable arrival in a "
                          f"trace whose config has no streaming_sessions, got {show(kind)}")
    if kind == "input" and not event.get("end_of_session", False):
        missing = next((k for k in ("num_tokens", "max_tokens") if k not in event), None)
        if missing is not None:
            raise SchemaError(missing, f"{missing}: missing (an input that does not end the session gives it)")


def _refuse_grammar_without_structured_output(event: dict[str, Any]) -> None:
    """A grammar event or a structured arrival in a trace whose config does
    not say `structured_output`: the checker would not model its grammar."""
    found = "ev" if event["ev"] in GRAMMAR_EVENTS else "structured" if event.get("structured") else None
    if found is not None:
        raise SchemaError(found, f"{found}: expected no grammar event or structured request in a trace whose "
                          f"config does not say structured_output, got {show(event['ev'])}")


def _refuse_kv_without_connector(event: dict[str, Any], errors_allowed: bool = False) -> None:
    """A KV connector's event or field in a trace whose config names no
    connector: the checker could not give it a meaning (malformed)."""
    kind = event["ev"]
    if kind in KV_EVENTS:
        found = "ev"
    elif kind == "arrive":
        found = next((k for k in ("external_hit", "load_async") if k in event), None)
    elif kind == "schedule":
        found = "kv_loads" if "kv_loads" in event else next(
            (f"entries[{i}].external" for i, x in enumerate(event["entries"]) if "external" in x), None)
    elif kind == "finish":
        found = "held" if "held" in event else \
            "reason" if event["reason"] == "error" and not errors_allowed else None
    else:
        found = None
    if found is None:
        return
    what = show(kind) if found == "ev" else show(event["reason"]) if found == "reason" else "a KV connector field"
    raise SchemaError(found, f"{found}: expected no KV connector event or field in a trace whose config has "
                      f"no kv_connector, got {what}")
