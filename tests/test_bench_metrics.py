"""Serving metrics: vLLM benchmark_serving's definitions and report layout."""

from __future__ import annotations

import pytest

from flightcheck.bench.metrics import RequestRecord, compute_metrics, percentile
from flightcheck.bench.report import format_report, parse_report, result_json, side_by_side
from flightcheck.bench.seed_results import V1_MAIN

# The seed's "V1, Ray, main" block, as benchmark_serving printed it.
SEED_BLOCK = """\
============ Serving Benchmark Result ============
Successful requests:                     150
Benchmark duration (s):                  175.30
Total input tokens:                      106025
Total generated tokens:                  41936
Request throughput (req/s):              0.86
Output token throughput (tok/s):         239.23
Total Token throughput (tok/s):          844.05
---------------Time to First Token----------------
Mean TTFT (ms):                          359.48
Median TTFT (ms):                        217.95
P99 TTFT (ms):                           1705.93
-----Time per Output Token (excl. 1st token)------
Mean TPOT (ms):                          110.96
Median TPOT (ms):                        110.21
P99 TPOT (ms):                           155.08
---------------Inter-token Latency----------------
Mean ITL (ms):                           107.03
Median ITL (ms):                         95.87
P99 ITL (ms):                            507.94
=================================================="""


def test_percentile_interpolates_linearly_like_numpy():
    xs = [1.0, 2.0, 3.0, 4.0, 10.0]
    assert percentile(xs, 50) == 3.0
    assert percentile(xs, 99) == pytest.approx(4.0 + 0.96 * 6.0)   # rank 3.96
    assert percentile(xs, 25) == 2.0
    assert percentile([], 99) == 0.0


def test_tpot_excludes_the_first_token_and_itl_pools_all_gaps():
    a = RequestRecord("a", 10, send_time=0.0, chunk_times=[0.5, 0.6, 0.8], output_len=3)
    b = RequestRecord("b", 20, send_time=1.0, chunk_times=[1.2], output_len=1)
    m = compute_metrics([a, b], duration=2.0)
    s = m.summary()
    assert s["mean_ttft_ms"] == pytest.approx((500 + 200) / 2)
    # TPOT: (0.8 - 0.5) / 2 for a; b has one token and no TPOT.
    assert s["mean_tpot_ms"] == pytest.approx(150.0) and m.tpots == pytest.approx((0.15,))
    # ITL pooled over requests: a's gaps only.
    assert s["mean_itl_ms"] == pytest.approx(150.0)
    assert s["median_itl_ms"] == pytest.approx(150.0)
    assert s["mean_e2el_ms"] == pytest.approx((800 + 200) / 2)
    assert s["completed"] == 2 and s["total_input_tokens"] == 30 and s["total_output_tokens"] == 4
    assert s["request_throughput"] == 1.0 and s["output_throughput"] == 2.0
    assert s["total_token_throughput"] == 17.0


def test_report_block_has_the_seed_layout():
    assert format_report(V1_MAIN) == SEED_BLOCK


def test_report_parses_back_to_the_numbers():
    parsed = parse_report(SEED_BLOCK)
    for key, value in V1_MAIN.items():
        assert parsed[key] == pytest.approx(value), key


def test_result_json_uses_vllm_keys():
    rec = RequestRecord("a", 10, 0.0, [0.1, 0.2, 0.35], 3)
    doc = result_json(compute_metrics([rec], 0.35))
    for key in ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms",
                "p99_tpot_ms", "mean_itl_ms", "median_itl_ms", "p99_itl_ms",
                "request_throughput", "output_throughput", "total_token_throughput",
                "completed", "duration", "total_input_tokens", "total_output_tokens",
                "ttfts", "itls", "input_lens", "output_lens"):
        assert key in doc, key
    assert doc["itls"] == [pytest.approx([0.1, 0.15])]


def test_side_by_side_keeps_every_line_of_both_blocks():
    text = side_by_side([SEED_BLOCK, SEED_BLOCK], ["left", "right"])
    assert len(text.splitlines()) == len(SEED_BLOCK.splitlines()) + 1
    assert all(line.count("TTFT") in (0, 2) for line in text.splitlines())
