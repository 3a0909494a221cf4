"""The prefill cadence's model-checking constants (spec/cadence.py): small
models with `prefill_schedule_interval` 2 under vLLM 0.34, sync and async,
where a decode and a later prefill meet, and where the queue backs up; and
one model per feature the cadence meets (docs/request-states.md, "Features
together"): reset and pause, structured output, streaming sessions.
"""

from __future__ import annotations

from dataclasses import replace

from flightcheck.spec import Config, KvConnector, Prompt
from flightcheck.verification.models import Model
from flightcheck.verification.grammar_models import _GRAMMAR_SKIPPED
from flightcheck.verification.reset_pause_models import _SKIPPED as _RESET_PAUSE_SKIPPED
from flightcheck.verification.session_models import _SESSION_SKIPPED, _session

# Targets of every profile these models are too small to reach.
_SKIPPED = ("resumption_deferred", "stale_output_delivered", "stopped_with_output_in_flight",
            "preempted_request_resumes_and_finishes", "decode_behind_decode", "duplicate_cached_block")

# K = 2, interval 2: a one-token prompt that decodes while a four-token
# prompt (two chunks under a budget of 3) and a second copy of the first
# (a full prefix hit once the first caches its block: one token left, the
# gate's edge) arrive; seats for two, so the queue can back up.
CADENCE_K2 = Model(
    "cadence-k2",
    Config(num_stages=2, max_num_batched_tokens=3, max_num_seqs=2, block_size=2, num_blocks=5,
           max_model_len=7, prefix_caching=True, profile="vllm-0.34", prefill_schedule_interval=2),
    (Prompt(1, 3), Prompt(4, 2, (1, 2)), Prompt(3, 1, (1,))),
    allow_abort=False, allow_stop=False, skip_targets=_SKIPPED,
)
CADENCE_K2_ASYNC = replace(CADENCE_K2.under_profile("vllm-0.34-async"), name="cadence-k2-async")

# The cadence beside the priority policy, interval 2: a six-token prompt of
# low priority, cut into chunks (the threshold of 1 binds once it has
# company), and a one-token prompt of high priority that decodes three
# times, 4 blocks of 2. Admitted beside the chunked prompt, the decode holds
# the next call; in the call after it the running loop schedules the
# low-priority chunk, then the decode finds no block and the priority
# preemption takes the chunk back out of the batch (`priority.hand_back`):
# the call still restarts the hold (vLLM 0.33/0.34 `Scheduler.schedule`:
# `prefill_scheduled` stays set; CAD3 reads `Scheduled.taken_back`).
# Sync at K = 2 (196 states); async at K = 1 (137 states; at K = 2 the
# chunk is never taken back). No third request: the queue never backs up.
CADENCE_PRIO_K2 = Model(
    "cadence-prio-k2",
    Config(num_stages=2, max_num_batched_tokens=4, long_prefill_token_threshold=1, max_num_seqs=2, block_size=2,
           num_blocks=4, max_model_len=8, prefix_caching=False, profile="vllm-0.34", prefill_schedule_interval=2,
           scheduling_policy="priority"),
    (Prompt(6, 1, priority=1), Prompt(1, 3, priority=0)),
    allow_abort=False, allow_stop=False, skip_targets=_SKIPPED + ("backed_up_queue_released",),
)
_PRIO_ASYNC = CADENCE_PRIO_K2.under_profile("vllm-0.34-async")
CADENCE_PRIO_K1_ASYNC = replace(_PRIO_ASYNC, name="cadence-prio-k1-async", cfg=replace(_PRIO_ASYNC.cfg, num_stages=1))

CADENCE_MODELS: dict[str, tuple[Model, ...]] = {
    "vllm-0.34": (CADENCE_K2, CADENCE_PRIO_K2),
    "vllm-0.34-async": (CADENCE_K2_ASYNC, CADENCE_PRIO_K1_ASYNC),
    "vllm-0.33": (CADENCE_K2.under_profile("vllm-0.33"), CADENCE_PRIO_K2.under_profile("vllm-0.33")),
    "vllm-0.33-async": (CADENCE_K2.under_profile("vllm-0.33-async"),
                        CADENCE_PRIO_K1_ASYNC.under_profile("vllm-0.33-async")),
}

# The cadence beside reset and pause, interval 2: a one-token prompt that
# decodes while a three-token prompt (two chunks under a budget of 2) waits
# or runs; the environment resets (a prefill chunk preempted mid-prompt)
# and pauses between any two steps (a PAUSED_NEW call's untouched waiting
# queue counts as backed up; a PAUSED_ALL call moves neither hold nor bound).
CADENCE_RESET_PAUSE_K2 = Model(
    "cadence-reset-pause-k2",
    Config(num_stages=2, max_num_batched_tokens=2, max_num_seqs=2, block_size=2, num_blocks=3,
           max_model_len=4, prefix_caching=True, profile="vllm-0.34", prefill_schedule_interval=2,
           reset_and_pause=True),
    (Prompt(1, 1), Prompt(3, 1, (5,))),
    allow_abort=False, allow_stop=False, skip_targets=tuple(sorted(set(_SKIPPED) | set(_RESET_PAUSE_SKIPPED))),
)

# The cadence beside structured output, interval 2: a one-token prompt that
# decodes twice, and two structured prompts (three tokens, two chunks under
# a budget of 2; two tokens) whose grammars compile or fail at any time:
# a request waiting for its grammar is deferred from its arrival
# (`_enqueue_waiting_request`) until admitted, held calls skip it, and a
# queue of such requests is not backed up.
CADENCE_GRAMMAR_K2 = Model(
    "cadence-grammar-k2",
    Config(num_stages=2, max_num_batched_tokens=2, max_num_seqs=2, block_size=2, num_blocks=4,
           max_model_len=5, prefix_caching=False, profile="vllm-0.34", prefill_schedule_interval=2,
           structured_output=True),
    (Prompt(1, 2), Prompt(3, 1, structured=True), Prompt(2, 1, structured=True)),
    allow_abort=False, allow_stop=False, skip_targets=tuple(sorted(set(_SKIPPED) | set(_GRAMMAR_SKIPPED))),
)

# The cadence beside streaming sessions, interval 2 (no prefix caching, to
# keep the model small): a session of two turns (a prompt of
# 2 and one output, then 2 new tokens: a next turn with more than one
# token left, which a held call stops at) beside a one-token prompt that
# decodes twice and a two-token prompt whose prefill restarts the hold; two
# seats. A parked session is deferred (`_enqueue_waiting_request`), and
# stays so once its input is taken, until admitted.
CADENCE_SESSIONS_K2 = Model(
    "cadence-sessions-k2",
    Config(num_stages=2, max_num_batched_tokens=2, max_num_seqs=2, block_size=2, num_blocks=4,
           max_model_len=8, prefix_caching=False, profile="vllm-0.34", prefill_schedule_interval=2,
           streaming_sessions=True),
    (_session(2, 1, (2, 1)), Prompt(1, 2), Prompt(2, 1)),
    allow_abort=False, allow_stop=False,
    skip_targets=tuple(sorted(set(_SKIPPED) | set(_SESSION_SKIPPED) | {
        "session_holds_seat_for_input", "session_waits_with_old_output_in_flight",
        "session_runs_beside_old_output"})),       # session-k2 reaches them
)

# The cadence beside a KV connector, interval 2 (vLLM 0.34, sync; the
# profile variants are the same model): a two-token prompt (its prefill
# restarts the hold) that decodes once, a four-token prompt offered an async
# load of two (it may start in a held call, and once landed it has two
# tokens left: a held call stops at it) and a three-token prompt offered a
# sync load of two (one token left: admitted in a held call, restarting
# nothing). `cadence-kv-fail-k2`: the same with loads that fail (a
# rollback in place keeps the `is_prefill_chunk` its last schedule left).
CADENCE_KV_K2 = Model(
    "cadence-kv-k2",
    Config(num_stages=2, max_num_batched_tokens=3, max_num_seqs=2, block_size=2, num_blocks=6,
           max_model_len=6, prefix_caching=False, profile="vllm-0.34", prefill_schedule_interval=2,
           kv_connector=KvConnector()),
    (Prompt(2, 2), Prompt(4, 1, external_hit=2, load_async=True), Prompt(3, 1, external_hit=2)),
    allow_abort=False, allow_stop=False,
    skip_targets=tuple(sorted(set(_SKIPPED) | {"blocks_freed_behind_fence"})),
)
CADENCE_KV_FAIL_K2 = replace(CADENCE_KV_K2, name="cadence-kv-fail-k2", kv_failures=True)

# Each cadence mutant's model (verification/mutants/cadence.py): cadence-k2,
# but cadence-prio-k2 for the one whose bug needs a priority preemption.
CADENCE_MUTANT_MODELS: dict[str, Model] = {"cadence_stamp_undone_by_hand_back": CADENCE_PRIO_K2}


def cadence_mutant_model(name: str) -> Model:
    """The model the cadence mutant `name` is hunted on (without it in force)."""
    return CADENCE_MUTANT_MODELS.get(name, CADENCE_K2)
