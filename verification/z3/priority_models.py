"""The priority policy's Z3 model: the explicit search's `prio-victim-k2`
(verification/priority_models.py) under vLLM 0.34, synchronous scheduling:
a low-priority request admitted first and a high-priority one behind it, a
pool of 3 blocks, K = 2, drafts on, so the victim is the low-priority
request, often one the running loop scheduled earlier in the same call
(its tokens and drafts handed back: vLLM #23347, #28558). 3,162 reachable
states, each cross-checked against the spec (tests/test_z3_priority.py).

BMC finds the mutants of #23347 and #28558 on it at depth 7, the explicit
search's shortest (`PRIORITY_MUTANT_MODELS` (verification/priority_models.py)
names it for both). `prio-skip-k2` (three requests, #49097's scenario at
13 steps) is left to the explicit search: BMC to that depth is out of
reach on this machine.
"""

from __future__ import annotations

from dataclasses import replace

from flightcheck.spec import Config, KvConnector, Prompt
from flightcheck.verification.models import Model
from flightcheck.verification.mutants.priority_kv import PRIORITY_KV_PROFILE
from flightcheck.verification.priority_models import PRIO_VICTIM_K2

PRIORITY_Z3_MODEL: Model = PRIO_VICTIM_K2

# The priority policy beside the KV connector (PR4): `prio-kv-z3`, the
# explicit search's `prio-kv-k2` (verification/priority_kv_models.py)
# without vLLM 0.34's load limit (which the connector's encoding refuses),
# failed loads or aborts, and with one batch in flight (K = 1; its proof
# of PR4 offers every conjunct of the KV proof: minutes; the K = 2 twin
# below has a proof of its own): two async loads of two
# priorities, the later arrival of the better rank, parked in `kv_holding`
# at their rank, landed, promoted and admitted by rank. 117 reachable
# states, 24 of them with both loads in `kv_holding`; each cross-checked
# (tests/test_z3_priority_pairs.py).
PRIORITY_KV_Z3_MODEL: Model = Model(
    "prio-kv-z3",
    Config(num_stages=1, max_num_batched_tokens=3, max_num_seqs=2, block_size=2, num_blocks=4,
           max_model_len=6, prefix_caching=False, profile=PRIORITY_KV_PROFILE, scheduling_policy="priority",
           kv_connector=KvConnector()),
    (Prompt(2, 1, external_hit=2, load_async=True, priority=1),
     Prompt(3, 1, external_hit=2, load_async=True, priority=0)),
    allow_stop=False, allow_abort=False,
)

# The same with two batches in flight (K = 2, the step fence in force): 241
# reachable states, each cross-checked (tests/test_z3_priority_pairs.py).
# PR4 is proved on it with the queues' conjuncts only
# (priority_engines.priority_kv_queue_induction): the proof offering every
# conjunct of the KV proof gave no answer in 33 minutes (docs/proofs.md).
PRIORITY_KV_Z3_K2_MODEL: Model = replace(PRIORITY_KV_Z3_MODEL, name="prio-kv-z3-k2",
                                         cfg=replace(PRIORITY_KV_Z3_MODEL.cfg, num_stages=2))
