"""The GPU check script, on a machine with CUDA (marker `gpu`, off by default)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


@pytest.mark.gpu
def test_gpu_pipeline_outputs_equal_pp1_on_the_gpu():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from flightcheck.runtime.gpu_check import main
    assert main(["--pp", "2"]) == 0
