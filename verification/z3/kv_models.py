"""The connector models the Z3 engines check (kv_engines.py): small enough
that the cross-check compares the encoding with the spec on every reachable
state (tests/test_z3_kv.py), large enough that every part of the encoding
acts in them.

KV_ASYNC (vLLM 0.33, consumer, recompute): two requests, K = 2, so the
step fence is in force; request 0 is offered an async load of its first
block, request 1 nothing. Within 1,313 reachable states: loads parked,
landed, failed (from block 0: recomputed) and aborted (the table held until
the load reports), promotions, preemptions, finishes fenced behind one or
two batches (two deferred frees at once), empty batches.

KV_SEND (vLLM 0.33, consumer and producer, fail policy): the same requests;
a finished request's table is held until its send is reported, a failed
load finishes its request with FINISHED_ERROR (its table held for the
load's report), a producer's preemption drops its in-flight output.

KV_INVALID_K1 (vLLM 0.34, KV7's model for k-induction, kv_invalid_engines.py):
verification/kv_models.py's kv-invalid-k2 with one stage (no step fence,
so no deferred frees): r0 sync-loads the block r1 shares, prefix caching,
recompute, failures and aborts. Searched exhaustively too
(tests/test_z3_kv_invalid.py): under 0.34 KV7 breaks in 7 steps (104
states), finding 7's run with the carrier completed before the sharer's
schedule; under vllm-0.34-invalid-kv-fixed every property holds (112 states).

What the encoding leaves out (kv_state.refuse_unencoded_connector) is
listed there; the explicit search checks the spec's models that have it.
"""

from __future__ import annotations

from dataclasses import replace

from flightcheck.spec import Config, KvConnector, Prompt
from flightcheck.verification.kv_models import KV_INVALID_K2
from flightcheck.verification.models import Model


def _config(kv: KvConnector) -> Config:
    return Config(num_stages=2, max_num_batched_tokens=3, max_num_seqs=2, block_size=2, num_blocks=3,
                  max_model_len=5, prefix_caching=False, profile="vllm-0.33", kv_connector=kv)


_PROMPTS = (Prompt(3, 1, external_hit=2, load_async=True), Prompt(2, 2))

KV_ASYNC = Model("kv-async", _config(KvConnector(consumer=True, load_failure_policy="recompute")), _PROMPTS,
                 kv_failures=True)

KV_SEND = Model("kv-send", _config(KvConnector(consumer=True, producer=True, load_failure_policy="fail")),
                _PROMPTS, kv_failures=True)

KV_MODELS: tuple[Model, ...] = (KV_ASYNC, KV_SEND)

KV_INVALID_K1 = replace(KV_INVALID_K2, name="kv-invalid-k1", cfg=replace(KV_INVALID_K2.cfg, num_stages=1))
