"""The session models under vLLM 0.33 (the same rules as 0.34: its
`_update_request_as_session` and `_handle_stopped_request` read alike),
proved by exhaustive search with the state counts 0.34 has."""

from __future__ import annotations

import pytest

from flightcheck.verification.explicit.search import search
from flightcheck.verification.session_models import SESSION_PROFILE_MODELS
from tests.test_spec_sessions import STATE_COUNTS


@pytest.mark.parametrize("profile", ["vllm-0.33", "vllm-0.33-async"])
def test_every_session_model_is_proved_under_0_33(profile: str):
    for model in SESSION_PROFILE_MODELS[profile]:
        result = search(model)
        key = model.name.split("@")[0] + ("@async" if profile.endswith("async") else "")
        assert result.ok and all(result.liveness.values())
        assert (result.num_states, result.num_edges) == STATE_COUNTS[key]
