"""A replay workload: vLLM's configuration and the requests, as JSON.

    {"name": "two-prompts", "seed": 0,
     "config": {"num_stages": 2, "max_num_batched_tokens": 10, "max_num_seqs": 2,
                "block_size": 16, "num_blocks": 1000, "max_model_len": 2048,
                "long_prefill_token_threshold": 0, "prefix_caching": false},
     "prefixes": {"system": 32},
     "requests": [
        {"id": "0", "prompt_token_ids": [1, 15043, ...], "max_tokens": 5},
        {"id": "1", "prompt_len": 40, "prefix": "system", "max_tokens": 8,
         "arrival_step": 3, "abort_step": 9, "eos_probability": 0.1}]}

* `config.num_blocks` is vLLM's `KVCacheConfig.num_blocks`: the pool,
  including the null block vLLM keeps back (usable blocks: num_blocks - 1).
* `config.num_spec_tokens` (default 0): k, speculative decoding with up to k
  drafts per request per step. The replay configures vLLM's scheduler for
  it (an n-gram `SpeculativeConfig`: drafts are not look-ahead slots) and
  the fabricated model plays the proposer and the rejection sampler:
  `draft_outcome` below decides, per request and position, how many of the
  scheduled drafts are accepted (each in turn with probability
  `draft_acceptance`, a top-level key, default 0.5) and how many drafts it
  proposes for the request's next step (k, or with probability 1/4 fewer).
  Drafts are the request's own future tokens, so an accepted draft is the
  token the model would have sampled there: the output does not depend on
  the acceptance, only the timing does.
* `config.num_lookahead_tokens` (default 0; vLLM 0.33 and 0.34): 0, or k
  (`num_spec_tokens`): a drafter with its own forward pass, whose KV slots
  past the scheduled tokens the scheduler reserves (`VllmConfig.
  num_lookahead_tokens`: k for a draft model or EAGLE, 0 for n-gram) and
  which skips drafting in a step no request can use drafts from
  (`SchedulerOutput.skip_drafts`). The replay configures a draft-model
  `SpeculativeConfig` for it (replay_worker.py).
* `config.enable_chunked_prefill` (default true): vLLM's
  `SchedulerConfig.enable_chunked_prefill`. Off, vLLM 0.33 and 0.34 admit a
  prompt whole or not at all (0.8.x's V1 scheduler ignores it), and vLLM
  requires `max_num_batched_tokens >= max_model_len`.
* `config.cache_aware_admission_window` (default 0 = off) and
  `config.cache_aware_admission_threshold` (default 0.5): vLLM 0.34's
  cache-aware admission order; passed only to a vLLM that has the knobs.
* `config.prefill_schedule_interval` (default 1 = off): vLLM 0.33/0.34's
  `SchedulerConfig.prefill_schedule_interval`, the local prefill cadence
  (spec/cadence.py); passed only to a vLLM that has it.
* `config.async_scheduling` (vLLM 0.33 and 0.34, default false): build the engine
  with async scheduling; the synchronous recorder refuses to stand in for
  its `AsyncScheduler`, so such a replay stops with that error.
* A prompt is given by its token ids, or by `prompt_len` with an optional
  named shared `prefix` (`prefixes` gives each name a length): the prefix's
  tokens are the same for every request naming it, the rest is drawn from
  the workload's seed and the request id, so prefix-cache hits follow from
  the workload.
* `arrival_step` / `abort_step`: the engine step at which the request is
  added / aborted (input arrives between engine steps, as in vLLM's busy
  loop). `eos_probability`: the chance that each token the fabricated model
  samples for this request is the EOS token.
* `abort_via` (0.33 and 0.34): `"input"` (the default) delivers the abort
  through the input queue, before the engine step `abort_step`;
  `"aborts_queue"` makes it arrive while step `abort_step` runs the model:
  0.33's engine then applies it right before that step's
  `update_from_output` (`EngineCore._process_aborts_queue`), or, if the step
  completes no batch, from the input queue before the next step (vLLM puts
  every client abort in both queues; aborting twice is a no-op).
  `"wait"` (vLLM 0.34's `EngineCoreProc._wait_for_output`): the abort
  arrives while step `abort_step` waits for its oldest batch's output, and
  is handled there, in order with the other inputs that arrive during that
  wait, after the step's `schedule()` and before that batch's
  `update_from_output`; if the step waits for no output (it only schedules),
  or on an engine that handles no input while it waits (0.8.x, 0.33.0), it
  is handled from the input queue before the next step, as an input that
  arrives after `_wait_for_output`'s spin deadline is.
* `arrival_via` (`"input"`, the default, or `"wait"`): the same for the
  request's arrival (0.34 handles `ADD` during the wait too).
* `reuse_id`: send this request to vLLM under the id of an earlier request
  (its `id`), as a front end does with request-id randomization off
  (`VLLM_DISABLE_REQUEST_ID_RANDOMIZATION=1`, or a caller of `EngineCore`
  directly). `id` stays the workload's own unique name for the request (its
  prompt and sampled tokens are drawn from it); the earlier request should
  have finished or been aborted by `arrival_step` (vLLM's `add_request`
  asserts on a live duplicate: the run then ends `exception`). At one step,
  a reusing arrival comes after that step's aborts (an abort followed by a
  new request under the same id); other arrivals come before them, as
  always.
* `config.kv_connector` (or `kv_connector` at the top level; vLLM 0.33 and
  0.34) and each request's `kv`: a fabricated KV connector, what it offers
  each request and when its transfers end: `{"consumer": bool, "producer":
  bool, "load_failure_policy": "recompute"|"fail", "max_inflight_loads":
  int|null}` and `{"hit": tokens, "async": bool, "load_steps": n,
  "fail_from_block": int|null, "fail_whole": bool, "send_steps": n}`;
  kv_workload.py documents every key and the timing rule. Without
  `kv_connector`, vLLM runs without a connector and `kv` is refused.
* `config.policy` (`"fcfs"`, the default, or `"priority"`; vLLM 0.33 and
  0.34) and each request's `priority` (an integer, lower runs first, 0 by
  default): vLLM's priority scheduling (priority_workload.py).
* `config.max_loras` (0, the default: no LoRA config), each request's `lora`
  (its adapter's id, 0 = none) and `prompt_logprobs` (true: it reads no
  prefix cache): lora_workload.py.
* a request's `grammar` (vLLM 0.33 and 0.34): it asks for structured
  output, with a fabricated grammar backend: `{"compile_steps": n,
  "fails": bool}`, the grammar settling once n `schedule()` calls have begun
  since its arrival (grammar_workload.py).
* A request's `session` (vLLM 0.33 and 0.34): a streaming session, the
  request resumable, its later inputs sent at engine steps
  (`{"inputs": [{"step", "tokens", "max_tokens"}], "end_step"}`, or
  `"client_ends": false` in place of `end_step`: the end never sent);
  session_workload.py documents it. The replay and the reference take the
  same decisions on such workloads; check-trace does not read them yet.
* `events` (vLLM 0.33 and 0.34): resets and pauses handed to the scheduler
  before given engine steps, after that step's arrivals and aborts:
  `[{"step": 7, "reset": {"running": true}}, {"step": 9, "pause": "all"}]`;
  a reset's `"connector": true` resets the KV connector's cache too
  (reset_pause_workload.py).

Every key is checked with its type and range before a token is drawn
(WorkloadError, one line naming the key path: `requests[3].prompt_len: must
be at most 1048576 ...`); the ranges (prompt_len, max_model_len and
block_size at most 2**20, num_blocks at most 2**20, 4 Mi prompt tokens per
workload, max_steps at most 10**6, ...) are workload_limits.py's, stated
with their reasons in docs/limits.md. The file itself is read with bounds
(a regular file of at most 64 MiB: flightcheck/input_files.py).

Standard library only; both the CLI (to refuse bad input with exit 2) and
the replay worker (inside the vLLM venv) read workloads with it.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .grammar_workload import GrammarSpec, grammar_from_json
from .session_workload import SessionInput, session_from_json
from .reset_pause_workload import WorkloadEvent, events_from_json
from .kv_workload import NO_KV, KVConnectorConfig, KVRequestSpec, kv_connector_from_json, \
    kv_request_from_json
from .lora_workload import MAX_LORAS, check_loras, lora_from_json, prompt_logprobs_from_json
from .priority_workload import policy_from_json, priority_from_json
from .workload_limits import MAX_COUNT, MAX_NUM_BLOCKS, MAX_PROMPT_LEN, MAX_REQUESTS, MAX_SEED, MAX_SPEC_TOKENS, \
    MAX_STAGES, MAX_STEPS, MAX_WORKLOAD_FILE_BYTES, MAX_WORKLOAD_TOKENS, LimitError, flag, key, name, share, \
    show, unknown_keys, whole

EOS_TOKEN_ID = 2
VOCAB_SIZE = 32000
FIRST_ORDINARY_TOKEN = 3          # 0..2 are special in Llama's vocabulary


class WorkloadError(LimitError):
    """The workload file is not a workload (exit code 2)."""


@dataclass(frozen=True)
class ReplayConfig:
    num_stages: int
    max_num_batched_tokens: int
    max_num_seqs: int
    block_size: int
    num_blocks: int
    max_model_len: int
    long_prefill_token_threshold: int
    prefix_caching: bool
    # vLLM 0.33: build the engine with async scheduling; the sync recorder
    # refuses to stand in for AsyncScheduler, so a replay then stops there.
    async_scheduling: bool = False
    # k: drafts per request per step at most (0: no speculative decoding).
    num_spec_tokens: int = 0
    # KV slots reserved past the scheduled tokens for a drafter with its own
    # forward pass (vLLM 0.33/0.34 `VllmConfig.num_lookahead_tokens`): 0 or k.
    num_lookahead_tokens: int = 0
    # vLLM's chunked prefill switch, and 0.34's cache-aware admission knobs.
    enable_chunked_prefill: bool = True
    cache_aware_admission_window: int = 0
    cache_aware_admission_threshold: float = 0.5
    # vLLM 0.33/0.34's local prefill cadence (1 = off; spec/cadence.py).
    prefill_schedule_interval: int = 1
    # A fabricated KV connector (kv_workload.py); None: none.
    kv_connector: KVConnectorConfig | None = None
    # vLLM's scheduling policy, "fcfs" or "priority" (priority_workload.py).
    policy: str = "fcfs"
    # vLLM's `LoRAConfig.max_loras` (0: no LoRA config; lora_workload.py).
    max_loras: int = 0


@dataclass(frozen=True)
class RequestSpec:
    req_id: str                       # the id vLLM sees (reuse_id's, when it reuses one)
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    arrival_step: int
    abort_step: int | None
    eos_probability: float
    ignore_eos: bool
    name: str = ""                    # the workload's unique name for it ("" = req_id)
    abort_via_aborts_queue: bool = False
    # vLLM 0.34: the input arrives while step arrival_step / abort_step
    # waits for a batch's output (`EngineCoreProc._wait_for_output`).
    arrival_during_wait: bool = False
    abort_during_wait: bool = False
    # What the KV connector offers it and when its transfers end (kv_workload.py).
    kv: KVRequestSpec = NO_KV
    # Its priority under the priority policy (priority_workload.py; lower first).
    priority: int = 0
    # Structured output: its fabricated grammar's timing (grammar_workload.py); None: none.
    grammar: GrammarSpec | None = None
    # A streaming session (session_workload.py): the inputs its client sends,
    # the end last; and whether vLLM gets it resumable (the session's first
    # request and each input but the end).
    session: tuple[SessionInput, ...] = ()
    resumable: bool = False
    # Its LoRA (0: none) and whether it asks for prompt logprobs (lora_workload.py).
    lora: int = 0
    prompt_logprobs: bool = False

    @property
    def key(self) -> str:
        """The request's unique name in the workload: its id, unless it
        reuses another's (then its own `id`)."""
        return self.name or self.req_id

    @property
    def reuses_id(self) -> bool:
        return bool(self.name) and self.name != self.req_id


@dataclass(frozen=True)
class Workload:
    name: str
    seed: int
    config: ReplayConfig
    requests: tuple[RequestSpec, ...]
    eos_token_id: int
    max_steps: int
    # The chance that each scheduled draft is accepted (after the one before it).
    draft_acceptance: float = 0.5
    # Reset and pause events at given engine steps (reset_pause_workload.py).
    events: tuple[WorkloadEvent, ...] = ()


CONFIG_DEFAULTS: dict[str, Any] = {"max_num_seqs": 256, "block_size": 16, "max_model_len": 2048,
                                   "long_prefill_token_threshold": 0, "prefix_caching": True,
                                   "async_scheduling": False, "num_spec_tokens": 0, "num_lookahead_tokens": 0,
                                   "enable_chunked_prefill": True, "cache_aware_admission_window": 0,
                                   "cache_aware_admission_threshold": 0.5, "policy": "fcfs",
                                   "prefill_schedule_interval": 1, "max_loras": 0}


# Each integer of the configuration: (least, most[, why]); workload_limits.py says why.
CONFIG_RANGES: dict[str, tuple[Any, ...]] = {
    "num_stages": (1, MAX_STAGES), "max_num_batched_tokens": (1, MAX_COUNT), "max_num_seqs": (1, MAX_COUNT),
    "block_size": (1, MAX_PROMPT_LEN), "num_blocks": (2, MAX_NUM_BLOCKS, "vLLM keeps an object per block"),
    "max_model_len": (1, MAX_PROMPT_LEN), "long_prefill_token_threshold": (0, MAX_COUNT),
    "num_spec_tokens": (0, MAX_SPEC_TOKENS), "num_lookahead_tokens": (0, MAX_SPEC_TOKENS), "cache_aware_admission_window": (0, MAX_COUNT),
    "prefill_schedule_interval": (1, MAX_COUNT),
    "max_loras": (0, MAX_LORAS, "a LoRA slot per adapter")}


def _int(where: str, value: Any, minimum: int = 0, maximum: int = MAX_COUNT, why: str = "") -> int:
    return whole(where, value, minimum, maximum, why)


def _config(raw: Any) -> ReplayConfig:
    if not isinstance(raw, dict):
        raise WorkloadError("'config' must be an object")
    merged = {**CONFIG_DEFAULTS, **raw}
    connector = kv_connector_from_json(merged.pop("kv_connector", None))    # each feature's reader: LimitError
    unknown = set(merged) - set(ReplayConfig.__dataclass_fields__)
    if unknown:
        raise WorkloadError(unknown_keys("config", unknown))
    missing = set(ReplayConfig.__dataclass_fields__) - set(merged) - {"kv_connector"}
    if missing:
        raise WorkloadError(f"config lacks {sorted(missing)}")
    for switch in ("prefix_caching", "async_scheduling", "enable_chunked_prefill"):
        flag(f"config.{switch}", merged[switch])
    values = {name: _int(f"config.{name}", merged[name], *bounds) for name, bounds in CONFIG_RANGES.items()}
    _check_admission(merged, values)
    return ReplayConfig(policy=policy_from_json(merged["policy"]), prefix_caching=merged["prefix_caching"], async_scheduling=merged["async_scheduling"],
                        enable_chunked_prefill=merged["enable_chunked_prefill"],
                        cache_aware_admission_threshold=float(merged["cache_aware_admission_threshold"]),
                        kv_connector=connector, **values)


def _check_admission(merged: dict[str, Any], values: dict[str, int]) -> None:
    """What vLLM's `SchedulerConfig` refuses: with chunked prefill off, a
    budget below max_model_len; a usage threshold outside [0, 1]."""
    if not merged["enable_chunked_prefill"] and values["max_num_batched_tokens"] < values["max_model_len"]:
        raise WorkloadError("config.max_num_batched_tokens must be at least config.max_model_len "
                            "with enable_chunked_prefill false")
    share("config.cache_aware_admission_threshold", merged["cache_aware_admission_threshold"])
    _check_lookahead(values)


def _check_lookahead(values: dict[str, int]) -> None:
    """Lookahead slots are what a drafter with its own forward pass gives:
    k for vLLM's draft model and EAGLE (`SpeculatorConfig.num_lookahead_tokens`,
    0.34 `v1/worker/gpu/spec_decode`), none for n-gram; and `VllmConfig.
    _set_max_num_scheduled_tokens` refuses a budget not above them."""
    lookahead = values["num_lookahead_tokens"]
    if lookahead not in (0, values["num_spec_tokens"]):
        raise WorkloadError("config.num_lookahead_tokens: must be 0 or config.num_spec_tokens "
                            f"({values['num_spec_tokens']}), the slots a drafter gives, got {lookahead}")
    if lookahead and values["max_num_batched_tokens"] <= lookahead:
        raise WorkloadError("config.max_num_batched_tokens must be above config.num_lookahead_tokens "
                            "(vLLM's VllmConfig refuses it)")


def _seeded_tokens(seed: int, label: str, count: int) -> list[int]:
    rng = random.Random(f"{seed}/{label}")
    return [rng.randrange(FIRST_ORDINARY_TOKEN, VOCAB_SIZE) for _ in range(count)]


def _prompt(raw: dict[str, Any], where: str, seed: int, prefixes: dict[str, int], req_id: str,
            tokens_left: int) -> list[int]:
    """The request's prompt: its token ids, or `prompt_len` tokens drawn from
    the seed (a named prefix's first); refused before any is drawn when the
    workload's prompts would pass MAX_WORKLOAD_TOKENS."""
    if "prompt_token_ids" in raw:
        tokens = raw["prompt_token_ids"]
        if not isinstance(tokens, list) or not tokens or not all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t < VOCAB_SIZE for t in tokens):
            raise WorkloadError(f"{where}.prompt_token_ids: must be a non-empty list of token ids "
                                f"(0 to {VOCAB_SIZE - 1})")
        length = _int(f"{where}.prompt_token_ids", len(tokens), 1, MAX_PROMPT_LEN)
    else:
        length = _int(f"{where}.prompt_len", raw.get("prompt_len"), 1, MAX_PROMPT_LEN,
                      "the replay draws every prompt token")
    if length > tokens_left:
        raise WorkloadError(f"{where}: the workload's prompts hold more than {MAX_WORKLOAD_TOKENS} tokens "
                            f"in all, the most a replay draws")
    if "prompt_token_ids" in raw:
        return list(raw["prompt_token_ids"])
    prefix = raw.get("prefix")
    shared: list[int] = []
    if prefix is not None:
        if not isinstance(prefix, str) or prefix not in prefixes:
            raise WorkloadError(f"{where}.prefix: names prefix {show(prefix)}, not in 'prefixes'")
        shared = _seeded_tokens(seed, f"prefix/{prefix}", min(prefixes[prefix], length))
    return shared + _seeded_tokens(seed, f"request/{req_id}", length - len(shared))


def _request(raw: Any, index: int, seed: int, prefixes: dict[str, int], tokens_left: int) -> RequestSpec:
    where = f"requests[{index}]"
    if not isinstance(raw, dict):
        raise WorkloadError(f"{where}: must be an object, got {show(raw)}")
    req_id = name(f"{where}.id", raw.get("id", index))
    reuse = raw.get("reuse_id")
    if reuse is not None and not isinstance(reuse, str):
        raise WorkloadError(f"{where}.reuse_id: must be the id of an earlier request, got {show(reuse)}")
    abort_via = raw.get("abort_via", "input")
    if abort_via not in ("input", "aborts_queue", "wait"):
        raise WorkloadError(f"{where}.abort_via: must be 'input', 'aborts_queue' or 'wait', got {show(abort_via)}")
    arrival_via = raw.get("arrival_via", "input")
    if arrival_via not in ("input", "wait"):
        raise WorkloadError(f"{where}.arrival_via: must be 'input' or 'wait', got {show(arrival_via)}")
    abort = raw.get("abort_step")
    kv = kv_request_from_json(raw.get("kv"), f"{where}.kv")              # LimitErrors, naming the key path
    priority = priority_from_json(raw.get("priority", 0), where)
    grammar = grammar_from_json(raw.get("grammar"), f"{where}.grammar")
    session = session_from_json(raw.get("session"), f"{where}.session", seed, req_id,
                                (FIRST_ORDINARY_TOKEN, VOCAB_SIZE))
    return RequestSpec(session=session, resumable=bool(session),
        req_id=req_id if reuse is None else reuse, name="" if reuse is None else req_id,
        abort_via_aborts_queue=abort_via == "aborts_queue", abort_during_wait=abort_via == "wait",
        arrival_during_wait=arrival_via == "wait",
        max_tokens=_int(f"{where}.max_tokens", raw.get("max_tokens", 16), 1),
        arrival_step=_int(f"{where}.arrival_step", raw.get("arrival_step", 0)),
        abort_step=None if abort is None else _int(f"{where}.abort_step", abort),
        eos_probability=share(f"{where}.eos_probability", raw.get("eos_probability", 0.0)),
        ignore_eos=flag(f"{where}.ignore_eos", raw.get("ignore_eos", False)), kv=kv, priority=priority,
        grammar=grammar, lora=lora_from_json(raw.get("lora", 0), where),
        prompt_logprobs=prompt_logprobs_from_json(raw.get("prompt_logprobs", False), where),
        prompt_token_ids=tuple(_prompt(raw, where, seed, prefixes, req_id, tokens_left)))


def workload_from_json(raw: Any, default_name: str = "workload") -> Workload:
    """The workload a raw one (parsed JSON) describes; WorkloadError, naming
    the key path, for any value out of its type or range (workload_limits.py)."""
    try:
        return _workload_from_json(raw, default_name)
    except WorkloadError:
        raise
    except LimitError as err:
        raise WorkloadError(str(err)) from None


def _workload_from_json(raw: Any, default_name: str) -> Workload:
    if not isinstance(raw, dict):
        raise WorkloadError(f"a workload is a JSON object, got {show(raw)}")
    seed = _int("seed", raw.get("seed", 0), 0, MAX_SEED)
    config = _config(_with_top_level_connector(raw))
    prefixes = raw.get("prefixes", {})
    if not isinstance(prefixes, dict):
        raise WorkloadError(f"prefixes: must map names to lengths, got {show(prefixes)}")
    prefixes = {str(k): _int(f"prefixes.{key(k)}", v, 1, MAX_PROMPT_LEN) for k, v in prefixes.items()}
    requests = raw.get("requests")
    if not isinstance(requests, list) or not requests:
        raise WorkloadError(f"requests: must be a non-empty list, got {show(requests)}")
    _int("requests", len(requests), 1, MAX_REQUESTS, "requests in one workload")
    specs: list[RequestSpec] = []
    tokens_left = MAX_WORKLOAD_TOKENS
    for i, r in enumerate(requests):
        specs.append(_request(r, i, seed, prefixes, tokens_left))
        tokens_left -= len(specs[-1].prompt_token_ids)
    _check_ids(specs)
    acceptance = share("draft_acceptance", raw.get("draft_acceptance", 0.5))
    check_loras(config.max_loras, [spec.lora for spec in specs])
    if config.kv_connector is None and any(spec.kv != NO_KV for spec in specs):
        raise WorkloadError("a request has 'kv' but the workload has no kv_connector")
    return Workload(name=name("name", raw.get("name", default_name)), seed=seed, config=config,
                    requests=tuple(specs),
                    eos_token_id=_int("eos_token_id", raw.get("eos_token_id", EOS_TOKEN_ID)),
                    max_steps=_int("max_steps", raw.get("max_steps", 100_000), 1, MAX_STEPS,
                                   "every step is a call into vLLM's scheduler"),
                    draft_acceptance=acceptance, events=events_from_json(raw.get("events", [])))


def _check_ids(specs: list[RequestSpec]) -> None:
    """Every request's own name once; a reused id an earlier request's, reused after it arrives."""
    arrivals: dict[str, int] = {}
    for index, spec in enumerate(specs):
        if spec.key in arrivals:
            raise WorkloadError(f"requests[{index}].id: request id {show(spec.key)} appears twice")
        if spec.reuses_id:
            if spec.req_id not in arrivals:
                raise WorkloadError(f"requests[{index}].reuse_id names {show(spec.req_id)}, not an earlier "
                                    f"request's id")
            if arrivals[spec.req_id] > spec.arrival_step:
                raise WorkloadError(f"requests[{index}] reuses {show(spec.req_id)} before that request arrives")
        arrivals[spec.key] = spec.arrival_step


def _with_top_level_connector(raw: dict[str, Any]) -> Any:
    """The workload's `config`, with a top-level `kv_connector` moved into it."""
    config = raw.get("config", {})
    if "kv_connector" not in raw:
        return config
    if not isinstance(config, dict):
        raise WorkloadError("'config' must be an object")
    if "kv_connector" in config:
        raise WorkloadError("kv_connector is given both at the top level and in config")
    return {**config, "kv_connector": raw["kv_connector"]}


def read_workloads(path: str | Path, prepare: Callable[[Any], Any] | None = None) -> list[Any]:
    """The raw workloads in a file: one JSON object, a JSON list of them, or
    JSON Lines. The file is read with bounds (a regular file of at most
    MAX_WORKLOAD_FILE_BYTES, UTF-8, JSON Python can read: input_files.py);
    each workload is validated (WorkloadError, one line naming the key path)
    and returned as parsed JSON; `prepare` (e.g.
    kv_workload.with_default_connector) changes each first."""
    from flightcheck.input_files import InputFileError, read_text

    try:
        text = read_text(path, MAX_WORKLOAD_FILE_BYTES, "workload file")
        raws = _parse_workloads(text, str(path))
    except InputFileError as err:
        raise WorkloadError(str(err)) from None
    if not raws:
        raise WorkloadError(f"{path}: no workload in the file")
    if prepare is not None:
        raws = [prepare(raw) if isinstance(raw, dict) else raw for raw in raws]
    several = len(raws) > 1
    for i, raw in enumerate(raws):
        try:
            workload_from_json(raw, f"{Path(path).stem}-{i}")
        except WorkloadError as err:
            raise WorkloadError(f"{path}: workload {i}: {err}" if several else f"{path}: {err}") from None
    return raws


def _parse_workloads(text: str, path: str) -> list[Any]:
    """One JSON value (a list: its items), else JSON Lines, each line named on error."""
    from flightcheck.input_files import json_lines, parse_json

    try:
        parsed = parse_json(text, path)
        return parsed if isinstance(parsed, list) else [parsed]
    except json.JSONDecodeError:
        pass
    return json_lines(text, path)


def sampled_token(workload: Workload, spec: RequestSpec, position: int) -> int:
    """The token the fabricated model samples for a request at a position:
    a function of the seed, the request and the position only, so a
    recomputation after preemption samples the same token."""
    rng = random.Random(f"{workload.seed}/sample/{spec.key}/{position}")
    if rng.random() < spec.eos_probability:
        return workload.eos_token_id
    token = rng.randrange(FIRST_ORDINARY_TOKEN, VOCAB_SIZE)
    return token if token != workload.eos_token_id else token + 1


# The chance that the proposer offers all k drafts for a request's next step
# (otherwise fewer, 0 included: an n-gram proposer often finds no match).
FULL_PROPOSAL_PROBABILITY = 0.75


def draft_outcome(workload: Workload, spec: RequestSpec, position: int, num_drafts: int) -> tuple[int, int]:
    """What the fabricated model's rejection sampler and proposer decide for
    an entry of `spec` that samples with `num_drafts` drafts scheduled, the
    first of them at token index `position`: (drafts accepted, drafts
    proposed for the request's next step). A function of the seed, the
    request and the position only, like `sampled_token`, so vLLM and the
    reference, scheduling the same entry, get the same outcome."""
    rng = random.Random(f"{workload.seed}/drafts/{spec.key}/{position}/{num_drafts}")
    accepted = 0
    while accepted < num_drafts and rng.random() < workload.draft_acceptance:
        accepted += 1
    k = workload.config.num_spec_tokens
    proposed = k if k == 0 or rng.random() < FULL_PROPOSAL_PROBABILITY else rng.randrange(k)
    return accepted, proposed
