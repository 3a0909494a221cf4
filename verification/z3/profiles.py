"""The Z3 engines' models under each vLLM version profile (issue 19).

A profile changes the configuration only (spec/config.py's profile constants:
release order, preallocation, duplicate cached blocks, the policy); the Z3
encoding reads those constants from `Model.cfg`, so a profile's model is the
verify model with its configuration switched to the profile.

PLACEHOLDER until the spec's profiles land (spec/profiles.py, helper A1):
`PROFILE_SETTINGS` repeats the constants PROFILES.md names; once the spec
derives them from `Config.profile`, `profile_model` only sets the profile.
"""

from __future__ import annotations

from dataclasses import replace

from flightcheck.spec import Config
from flightcheck.verification.models import Model

DEFAULT_PROFILE = "vllm-0.8.5"

# Per profile: (continue_prefill, num_preallocate_tokens). The release order
# follows prefix caching in both (KVCacheManager.free: reverse table order
# with prefix caching, forward without).
PROFILE_SETTINGS: dict[str, tuple[bool, int]] = {
    "vllm-0.8.5": (True, 0),        # the PR: continue-prefill, no preallocation
    "vllm-0.8.4": (False, 64),      # one batch per request, 64 tokens preallocated
}


def profile_config(cfg: Config, profile: str) -> Config:
    """`cfg` under `profile`: that version's policy, preallocation and release order."""
    if profile not in PROFILE_SETTINGS:
        raise ValueError(f"no profile {profile!r}; known: {', '.join(PROFILE_SETTINGS)}")
    continue_prefill, preallocate = PROFILE_SETTINGS[profile]
    return replace(cfg, profile=profile, continue_prefill=continue_prefill,
                   num_preallocate_tokens=preallocate,
                   release_order="reverse" if cfg.prefix_caching else "forward")


def profile_model(model: Model, profile: str) -> Model:
    """`model` with its configuration under `profile`, named after it."""
    return replace(model, name=f"{model.name}@{profile}", cfg=profile_config(model.cfg, profile))
