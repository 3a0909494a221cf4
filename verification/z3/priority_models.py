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

from flightcheck.verification.models import Model
from flightcheck.verification.priority_models import PRIO_VICTIM_K2

PRIORITY_Z3_MODEL: Model = PRIO_VICTIM_K2
