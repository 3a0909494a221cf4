"""SS5 in Z3: the priority policy beside streaming sessions (docs/proofs.md,
"Streaming sessions", "SS5 under the priority policy"), on the engines of
kv_engines.py and the model `session_models.PRIO_SESSIONS`:

* by k-induction (k = 1, `ss5_induction`): WF, the profile's feature
  invariants (PR1, SS2-SS5), the session proof's auxiliary invariants and
  candidates (session_engines.session_auxiliary), PA1 (a place iff arrived)
  and PS1 (a session's stamps are its queued inputs), one Houdini loop;
* by BMC to a depth (`ss5_bmc`), each violation replayed on the spec.

The encoding takes the policy beside sessions only where every session's
priority is its own (encoding/priority_state.py `sessions_keys_distinct`):
there an input taken in place never reorders a queue. Where two sessions
share a priority (`session_models.PRIO_SESSIONS_BREAK`) vLLM's heap break
is reachable and stays the explicit search's (SS5 broken in 5 steps).
"""

from __future__ import annotations

from flightcheck.verification.models import Model
from flightcheck.verification.z3.kv_engines import kv_bmc, kv_induction, kv_properties
from flightcheck.verification.z3.results import EngineResult
from flightcheck.verification.z3.session_engines import session_auxiliary

SS5 = "SS5_session_queues_in_priority_order"
PRIORITY_SESSION_AUXILIARY_NAMES = ("PA1_arrived_iff_placed", "PS1_stamps_are_queued_inputs")

# How deep BMC of the model goes beside the proof (the explicit search's
# break on the equal-priority model is 5 steps deep).
SS5_BMC_DEPTH = 5

# The profiles the Z3 rows of SS5 cover (synchronous ones: the priority encoding refuses async).
SS5_Z3_PROFILES: tuple[str, ...] = ("vllm-0.33", "vllm-0.34")


def ss5_auxiliary(model: Model) -> list[str]:
    return [*session_auxiliary(model.cfg), *PRIORITY_SESSION_AUXILIARY_NAMES]


def ss5_induction(model: Model, time_budget: float | None = None) -> EngineResult:
    """PR1 and SS2-SS5 by 1-induction with the session and stamp auxiliaries."""
    return kv_induction(model, 1, kv_properties(model), ss5_auxiliary(model), time_budget)


def ss5_bmc(model: Model, depth: int = SS5_BMC_DEPTH, time_budget: float | None = None) -> EngineResult:
    """PR1 and SS2-SS5 (and WF) bounded to `depth` steps, or violated at the least depth."""
    return kv_bmc(model, depth, kv_properties(model), time_budget)


def ss5_rows(profile: str, depth: int = SS5_BMC_DEPTH, time_budget: float | None = None) -> list:
    """SS5 by 1-induction and by BMC to `depth` on PRIO_SESSIONS under
    `profile` (one of SS5_Z3_PROFILES; else no rows); the method names the
    model. (PR1 and SS2-SS4, proved alongside, have their own models' rows.)"""
    from flightcheck.verification.results import PropertyResult
    from flightcheck.verification.z3.session_models import prio_sessions
    if profile not in SS5_Z3_PROFILES:
        return []
    model = prio_sessions(profile)
    where = f" [{model.name}]"
    verdicts = [*ss5_induction(model, time_budget).properties, *ss5_bmc(model, depth, time_budget).properties]
    return [PropertyResult(p.name, p.kind, p.status, p.method + where, p.depth, p.seconds)
            for p in verdicts if p.name == SS5]


__all__ = ["SS5", "SS5_BMC_DEPTH", "SS5_Z3_PROFILES", "ss5_auxiliary", "ss5_bmc", "ss5_induction", "ss5_rows"]
