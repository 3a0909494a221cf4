"""The reset-and-pause model the Z3 engines check (reset_pause_engines.py):
small enough that the cross-check compares the encoding with the spec on
every reachable state (tests/test_z3_reset_pause.py), large enough that
every part of the feature acts in it.

RP_Z3 (vLLM 0.34, sync, K = 2): two requests in a pool of 2 blocks with
prefix caching, so the running loop preempts request 1 for request 0's
last decode (its output in flight then stale in deliver mode) beside the
reset's drop mode; request 1's prompt fills a block, so a reset has a
label to clear. The environment may reset (with or without the running
requests) and set any pause state between any two steps. 2,124 reachable
states: resets with one or two batches in flight, a reset request resumed
while its old output is still in flight, a reset refused while a block is
held, the empty batch under PAUSED_NEW and none under PAUSED_ALL.

It is the explicit model reset-pause-k2 (verification/reset_pause_models.py,
9,279 states) shrunk: 2 blocks, max_model_len 4 and shorter requests, so
every reachable state fits the cross-check's time.
"""

from __future__ import annotations

from dataclasses import replace

from flightcheck.spec import Config, KvConnector, Prompt
from flightcheck.verification.models import Model
from flightcheck.verification.reset_pause_models import _SKIPPED

RP_Z3 = Model(
    "reset-pause-z3-k2",
    Config(num_stages=2, max_num_batched_tokens=3, max_num_seqs=2, block_size=2, num_blocks=2,
           max_model_len=4, prefix_caching=True, profile="vllm-0.34", reset_and_pause=True),
    (Prompt(1, 3), Prompt(2, 1, (7,))),
    allow_abort=False, allow_stop=False, skip_targets=_SKIPPED,
)

RP_Z3_MODELS: tuple[Model, ...] = (RP_Z3,)

# The same model under vLLM 0.34 with async scheduling (5,799 states), where
# vLLM #38624 (placeholders kept on the running loop's preemption) breaks
# IA1 in 8 steps, as on the explicit model.
RP_Z3_ASYNC = replace(RP_Z3.under_profile("vllm-0.34-async"), name=RP_Z3.name + "-async")

# Beside a KV connector (vLLM 0.34, sync, K = 1: no step fence), the
# smallest model where a reset of the connector's cache meets an offer not
# yet taken: request 0 is offered an async load of its whole prompt,
# request 1 nothing, in a pool of 2 blocks. Within 408 reachable states:
# a reset of the connector's cache before request 0's first schedule (its
# offer forgotten, RP5: admitted with no load) and after it (its load
# parked or landed, kept), a reset of the running requests beside a parked
# load (vLLM raises: the blocks stay held, the connector's cache is not
# reset, RP4 broken as on the explicit reset-kv-async-k2), PAUSED_NEW
# promoting and admitting a landed load from `kv_holding` and nothing from
# `waiting`.
RP_KV_Z3 = Model(
    "reset-kv-z3-k1",
    Config(num_stages=1, max_num_batched_tokens=3, max_num_seqs=2, block_size=2, num_blocks=2,
           max_model_len=4, prefix_caching=False, profile="vllm-0.34", reset_and_pause=True,
           kv_connector=KvConnector()),
    (Prompt(2, 1, external_hit=2, load_async=True), Prompt(1, 1)),
    allow_abort=False, allow_stop=False, skip_targets=_SKIPPED,
)
