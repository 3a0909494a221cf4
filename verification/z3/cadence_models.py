"""The prefill cadence's Z3 models beside cadence-k2
(verification/cadence_models.py, where BMC bounds CAD1-CAD3 and finds both
mutants): a second model for the cross-check, the model of the proof
(z3/cadence_engines.py), and the latter under async scheduling, small
enough to cross-check every one of its states.

cadence-k2 never reaches a request passed over by the waiting loop
(`Request.deferred_waiting`, spec cadence.note_skipped), nor a preemption:
with 5 blocks nobody is preempted, and with K = 2 a preempted request's
stale output (vLLM 0.33/0.34 defers its resumption while it is in flight)
always drains before the next call, since its entry is in the older of the
two batches in flight. CADENCE_K3_TIGHT is cadence-k2 with 3 blocks and 3
stages: preemptions with output in flight, resumptions deferred while the
cadence holds or releases (173 of its 2,109 states have a request passed
over), so the cross-check covers every hook of the encoding.
"""

from __future__ import annotations

from dataclasses import replace

from flightcheck.spec import Config, Prompt
from flightcheck.verification.cadence_models import _SKIPPED, CADENCE_K2
from flightcheck.verification.models import Model

CADENCE_K3_TIGHT = replace(CADENCE_K2, name="cadence-k3-tight",
                           cfg=replace(CADENCE_K2.cfg, num_stages=3, num_blocks=3))

# The model of the proof: k-induction on cadence-k2 (5 blocks, 3 requests)
# did not answer its first schedule query within the session's hour on the
# loaded 2-core machine (docs/proofs.md, "Prefill cadence"), so the proof
# runs on a smaller model: vLLM 0.34 sync, K = 2, interval 2, a one-token
# prompt and a four-token one (two chunks under a budget of 3), 3 blocks.
# 87 states, every one cross-checked: a decode meets a later prefill
# (calls held with a request waiting), the queue backs up while the hold
# lasts, prefill chunks run. BMC, and the mutants, stay on cadence-k2.
CADENCE_Z3 = Model(
    "cadence-z3-k2",
    Config(num_stages=2, max_num_batched_tokens=3, max_num_seqs=2, block_size=2, num_blocks=3,
           max_model_len=5, prefix_caching=True, profile="vllm-0.34", prefill_schedule_interval=2),
    (Prompt(1, 2), Prompt(4, 1, (1, 2))),
    allow_abort=False, allow_stop=False, skip_targets=_SKIPPED,
)

# The same model under vLLM 0.34's async scheduling, for the cross-check of
# every reachable state (tests/test_z3_cadence.py; cadence-k2-async's 2,556
# states are cross-checked on a sample only): 177 states, 63 with a hold
# beside output placeholders, prefill chunks running, calls held with a
# request waiting and the queue backed up while the hold lasts.
CADENCE_Z3_ASYNC = replace(CADENCE_Z3.under_profile("vllm-0.34-async"), name="cadence-z3-k2-async")
