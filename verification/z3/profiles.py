"""The Z3 engines' models under each vLLM version profile (issue 19).

A profile changes the configuration only (spec/profiles.py: the policy, the
release order, preallocation, duplicate cached blocks); the Z3 encoding reads
those constants from `Model.cfg`, so a profile's model is a model with its
configuration resolved under that profile.
"""

from __future__ import annotations

from dataclasses import replace

from flightcheck.spec import Config
from flightcheck.spec.profiles import DEFAULT_PROFILE, PROFILES, profile as profile_named
from flightcheck.verification.models import Model

__all__ = ["DEFAULT_PROFILE", "ENCODED_PROFILES", "PROFILES", "profile_config", "profile_model"]

# The profiles whose constants the encoding reads. vLLM 0.33's rules
# (`Config.rules`: free-queue head, threshold with company, sampled-token
# slot, full-sequence admission, deferred resumption, stop order) are not
# encoded yet: a Z3 model under it would prove 0.8.5's rules instead.
ENCODED_PROFILES: tuple[str, ...] = ("vllm-0.8.5", "vllm-0.8.4")


def profile_config(cfg: Config, profile: str) -> Config:
    """`cfg` under `profile`: every profile constant re-derived from it."""
    profile_named(profile)                  # ValueError naming the known profiles
    if profile not in ENCODED_PROFILES:
        raise ValueError(f"the Z3 encoding does not model profile {profile!r} "
                         f"(encoded: {', '.join(ENCODED_PROFILES)})")
    return replace(cfg, profile=profile, continue_prefill=None, release_order=None,
                   num_preallocate_tokens=None, cache_duplicate_blocks=None)


def profile_model(model: Model, profile: str) -> Model:
    """`model` with its configuration under `profile`, named after it."""
    return replace(model, name=f"{model.name}@{profile}", cfg=profile_config(model.cfg, profile))
