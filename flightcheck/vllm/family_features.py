"""The campaign's older knobs as `--all-features` features (features.py):
chunked prefill off and vLLM 0.34's cache-aware admission order (the
families of generate.py), and speculative decoding (the campaign's
`--spec-tokens`). They come first in `FEATURE_MODULES`: each reshapes the
plain workload (its config, prompts and arrivals), and the features after
them (a KV connector, request states) are drawn on the reshaped one.

Standard library only.
"""

from __future__ import annotations

from typing import Any

from .features import Feature, Picker


def _unchunked(pick: Picker, workload: dict[str, Any]) -> None:
    from .generate import FAMILIES           # generate.py imports features.py
    FAMILIES["unchunked"](pick, workload)


def _cache_aware(pick: Picker, workload: dict[str, Any]) -> None:
    from .generate import FAMILIES
    FAMILIES["cache-aware"](pick, workload)


def _spec_decoding(pick: Picker, workload: dict[str, Any]) -> None:
    """k = 1 or 2 drafts per step, as `--spec-tokens k` sets them (generate.py)."""
    workload["config"]["num_spec_tokens"] = pick.choice([1, 2])
    workload["draft_acceptance"] = pick.choice([0.5, 0.0, 0.8, 1.0])


# vLLM 0.33 and 0.34 stop admission at a prompt that would need a chunk
# (`Scheduler.schedule`, waiting loop); 0.8.x's V1 scheduler ignores the
# switch. The reorder is 0.34's `_reorder_waiting_by_cached_prefix`.
FEATURES = (
    Feature("unchunked", ("0.33.0", "0.34.0"), 0.2, _unchunked),
    # Beside a KV connector the reorder reads vLLM's `waiting` proper, not
    # its `async_kv_waiting` (spec/admission_order.py `reorderable`; found on
    # campaign --all-features --versions 0.34.0,0.33.0 seed 22 index 35).
    Feature("cache-aware", ("0.34.0",), 0.2, _cache_aware),
    Feature("spec-decoding", ("0.8.5", "0.8.4", "0.33.0", "0.34.0"), 0.25, _spec_decoding),
)
