"""Send times of benchmark_serving's open-loop client.

The classic script (the one the seed PR ran) sends a request, then sleeps
`gamma(shape=burstiness, scale=1/(rate*burstiness))`: burstiness 1 gives
exponential gaps (Poisson arrivals), below 1 burstier, above 1 more regular;
rate `inf` sends everything at once. The first request goes at t = 0.
"""

from __future__ import annotations

import math
import random

from .workload import WorkloadError


def send_times(num_requests: int, request_rate: float, burstiness: float = 1.0,
               seed: int = 0) -> list[float]:
    if not request_rate > 0:
        raise WorkloadError(f"--request-rate must be positive or inf, got {request_rate}")
    if not burstiness > 0 or math.isinf(burstiness):
        raise WorkloadError(f"--burstiness must be a positive number, got {burstiness}")
    if math.isinf(request_rate):
        return [0.0] * num_requests
    # Its own stream, so changing a dataset's draws never moves the arrivals.
    rng = random.Random(f"arrivals-{seed}")
    scale = 1.0 / (request_rate * burstiness)
    times, t = [], 0.0
    for _ in range(num_requests):
        times.append(t)
        t += rng.gammavariate(burstiness, scale)
    return times
