"""A second prefill-cadence model for the Z3 cross-check
(tests/test_z3_cadence.py), beside cadence-k2 (verification/cadence_models.py),
on which CAD1-CAD3 are proved (z3/cadence_engines.py).

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

from flightcheck.verification.cadence_models import CADENCE_K2

CADENCE_K3_TIGHT = replace(CADENCE_K2, name="cadence-k3-tight",
                           cfg=replace(CADENCE_K2.cfg, num_stages=3, num_blocks=3))
