"""The campaign's command line: `python -m flightcheck.vllm.campaign` and
`flightcheck vllm campaign` take these options (campaign.py runs them).
What each option draws is generate.py's; a seed's workloads without an
option are what they were before it existed (`--reuse-ids`, `--stages`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from flightcheck.verification import executors

from .generate import FAMILIES


def add_options(parser: argparse.ArgumentParser) -> None:
    """The campaign's options: `python -m flightcheck.vllm.campaign` and
    `flightcheck vllm campaign` take the same."""
    from flightcheck.commands.common import int_in, seed_int

    from .workload_limits import MAX_SPEC_TOKENS, MAX_STAGES, MAX_WORKLOADS   # bounded: every workload is built first

    parser.add_argument("--workloads", type=int_in(1, MAX_WORKLOADS), default=100, help="workloads per version")
    parser.add_argument("--seed", type=seed_int, default=0)
    parser.add_argument("--versions", default=None,
                        help="comma-separated releases (default 0.8.5,0.8.4; with --kv-connector 0.33.0,0.34.0)")
    parser.add_argument("--vllm-python", metavar="PATH",
                        help="any Python where vLLM imports (a venv of any release, an editable checkout): "
                             "its vllm.__version__ replaces --versions; a version with no tables of its own "
                             "runs as the nearest known release (said on stderr)")
    parser.add_argument("--no-mutants", action="store_true")
    parser.add_argument("--reuse-ids", action="store_true",
                        help="one workload in two also sends a request under an aborted request's id "
                             "(for vLLM 0.33: the id-reuse bug; off, a seed's workloads are unchanged)")
    parser.add_argument("--async", dest="async_scheduling", action="store_true",
                        help="vLLM 0.33.0 or 0.34.0 with async scheduling (AsyncScheduler, V2 runner settings) "
                             "against the reference's vllm-0.33-async (vllm-0.34-async) profile")
    parser.add_argument("--spec-tokens", type=int_in(0, MAX_SPEC_TOKENS), default=0, metavar="K",
                        help="speculative decoding with K drafts per step: the fabricated model proposes "
                             "drafts and accepts some of each (seeded), vLLM's scheduler is configured for K")
    parser.add_argument("--lookahead", action="store_true",
                        help="with drafts, a drafter with its own forward pass (vLLM 0.33/0.34's draft model: "
                             "K lookahead KV slots, skip_drafts): every workload with K > 0 drafts gets "
                             "config.num_lookahead_tokens K, set after the draw")
    parser.add_argument("--stages", type=int_in(1, MAX_STAGES), default=None, metavar="N",
                        help="every workload with N pipeline stages in place of the drawn 2-4, set after the "
                             "draw (the rest of each workload is the seed's own); 1: no pipeline, so no finding "
                             "that needs batches in flight ends a sync trace early")
    parser.add_argument("--mid-step-inputs", action=argparse.BooleanOptionalAction, default=None,
                        help="place arrivals and aborts, one in two, while a step waits for a batch's output "
                             "(vLLM 0.34's _wait_for_output; earlier engines handle them after the step); "
                             "default: on when every version runs 0.34's engine loop")
    parser.add_argument("--family", choices=sorted(FAMILIES),
                        help="every workload of that family (generate.py): chunked prefill off, or vLLM "
                             "0.34's cache-aware admission order, the knobs that tell versions apart")
    parser.add_argument("--kv-connector", action="store_true",
                        help="the kv-connector family (generate.py, kv_generate.py): a fabricated KV connector "
                             "in vLLM 0.33.0/0.34.0's real scheduler, each version sync and async (only async "
                             "with --async); the differential is reported as not run until the reference has "
                             "a connector")
    parser.add_argument("--all-features", action="store_true",
                        help="every feature the bridge models (features.py: the KV connector, and each "
                             "request state added since), each in a seeded share of the workloads, for the "
                             "features each version has; each version sync and async (only async with --async); "
                             "default versions: every release with a feature")
    parser.add_argument("--json", help="write the report here")
    parser.add_argument("--jobs", type=int_in(1, 64), default=1,
                        help="processes for the local executor, each with its own replay worker (default 1)")
    executors.add_options(parser)
    parser.add_argument("--keep-disagreements", type=Path, metavar="DIR",
                        help="copy every trace (and its workload) on which check-trace and vLLM's ground "
                             "truth disagree into DIR")
