"""Regenerate every figure and table of docs/simulator.md.

    python benchmarks/make_figures.py            # ~1 min on 2 cores

Writes docs/figures/*.png, docs/figures/{long-prompt,decodes}-*.perfetto.json and (via
benchmarks/seed_comparison.py) docs/results/*.json and the comparison table
on stdout. Traces go to a temporary folder (the 150-prompt ones are ~5 MB).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from flightcheck.cli import main as flightcheck

FIG = Path("docs/figures")
SEED_RUN = ["--model", "llama-3.1-8b", "--gpu", "L4", "--pp", "2",
            "--max-num-batched-tokens", "2048", "--max-model-len", "16384",
            "--dataset", "burstgpt", "--request-rate", "2", "--num-prompts", "150"]
LONG_PROMPT = ["--dataset", "random", "--random-input-len", "6000", "--random-output-len", "3",
               "--num-prompts", "1", "--request-rate", "inf"]
SHORT = {"continue-prefill": "continue-prefill", "one-batch-per-request": "one-batch"}


def run(*args: str) -> None:
    if flightcheck(list(args)) != 0:
        raise SystemExit(f"failed: flightcheck {' '.join(args)}")


def main() -> int:
    FIG.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "benchmarks/seed_comparison.py"], check=True)
    # Issue 22's decode timelines (the sync/async table itself takes ~4 min:
    # benchmarks/async_comparison.py, run separately).
    subprocess.run([sys.executable, "benchmarks/async_timelines.py"], check=True)
    with tempfile.TemporaryDirectory() as tmp:
        for policy, short in SHORT.items():
            trace = f"{tmp}/burstgpt-{short}.jsonl"
            run("simulate", *SEED_RUN, "--policy", policy, "--trace", trace)
            run("plot", trace, "--out", str(FIG / f"timeline-burstgpt-{short}.png"),
                "--perfetto", f"{tmp}/unused.json",
                "--title", f"{policy}, seed 0 of the seed PR's run: the request with the most prefill chunks")
            trace = f"{tmp}/long-{short}.jsonl"
            run("simulate", *LONG_PROMPT, "--policy", policy, "--trace", trace)
            run("plot", trace, "--out", str(FIG / f"timeline-long-prompt-{short}.png"),
                "--perfetto", str(FIG / f"long-prompt-{short}.perfetto.json"),
                "--title", f"{policy}: one 6000-token prompt alone, PP = 2, budget 2048")
    run("plot", "docs/results/sim-one-batch-per-request-20seeds.json",
        "docs/results/sim-continue-prefill-20seeds.json", "--out", str(FIG / "cdf-ttft-tpot.png"),
        "--title", "Simulated seed PR run (2x L4, Llama-3.1-8B), 20 seeds pooled")
    return 0


if __name__ == "__main__":
    sys.exit(main())
