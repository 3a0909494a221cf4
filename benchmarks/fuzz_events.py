"""How often the unmutated refinement fuzzer reaches the events the slow
reference mutants need.

A median of steps to kill over ten seeds moves 2-4x from one seed range to
the next (docs/fuzzing.md); counting the events themselves over many
steps is the steadier measure of a strategy. Runs `flightcheck fuzz` on
the correct reference with the steps shared by the 0.8.x profiles as the
default run shared them before it drove vLLM 0.33 too (vllm-0.8.5, then
vllm-0.8.4 for the last ninth: the events are 0.8.x's, and the figures
docs/fuzzing.md quotes were counted so; `--profiles` names others) and
counts, under vLLM 0.8.x, at every checked step:

  live_rejections         a live entry returns with drafts rejected
                          (rejections_not_subtracted)
  preempted_in_flight     a request is preempted with an entry in flight
  ... one_batch_policy    that, under the one-batch-per-request policy
                          (inflight_set_not_cleared_on_preemption)
  orphan_rejections       an orphaned or superseded entry returns with
                          drafts rejected (rejections_subtracted_after_reset)
  stale_on_running        a superseded entry returns while its request
                          runs again (stale_output_applied_to_resumed)
  ... sampled             that, for an entry that sampled: a wrong
                          scheduler appends its token (the mutant's event)
  orphaned_sampling       a request is preempted with an entry that samples
                          in flight (the event before the former)
  window_aborts           aborts taken in a resume window (machine.py
                          `_resume_window`), which make the former two meet
  no_draft_outcomes       sampled outcomes proposing no draft, of all sampled
  last_drafting_alone     schedule steps where the last running request
                          (0.8.5's victim) has drafts in flight and no other
                          request runs, of all those where it has them

    python benchmarks/fuzz_events.py [--steps 5000] [--seeds 20] [--first-seed 0]
                                     [--profiles vllm-0.8.5,vllm-0.8.4]
                                     [--without-resume-window] [--json]

`--without-resume-window` counts with the machine's resume window closed
(the strategies before it), for comparison.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import sys
from collections.abc import Iterator

from flightcheck.commands.common import positive_int, seed_int
from flightcheck.reference.profiles import PROFILES
from flightcheck.verification.refinement import machine
from flightcheck.verification.refinement.fuzz import fuzz

from flightcheck import spec

# The profiles whose events are counted, sharing each seed's steps as the
# default run shared them when the quoted figures were counted.
COUNTED_PROFILES: tuple[str, ...] = ("vllm-0.8.5", "vllm-0.8.4")


def _count_step(counts: collections.Counter, m: machine.RefinementMachine,
                before: spec.State, after: spec.State, action: object) -> None:
    if isinstance(action, spec.Schedule):
        if before.running:
            last = before.running[-1]
            if any(e.req == last and e.drafts and e.fate is spec.Fate.LIVE
                   for batch in before.in_flight for e in batch):
                counts["last_drafting"] += 1
                counts["last_drafting_alone"] += len(before.running) == 1
        for slot, (was, now) in enumerate(zip(before.requests, after.requests)):
            if not (was.status is spec.Status.RUNNING and now.status is spec.Status.PREEMPTED):
                continue
            in_flight = [e for batch in before.in_flight for e in batch
                         if e.req == slot and e.fate is spec.Fate.LIVE]
            if in_flight:
                counts["preempted_in_flight"] += 1
                counts["preempted_in_flight_one_batch_policy"] += not m.cfg.continue_prefill
                counts["orphaned_sampling"] += any(e.samples for e in in_flight)
    if isinstance(action, spec.CompleteOldest) and before.in_flight:
        for entry, sample in zip(spec.sampling_entries(before, m.spec_cfg), action.samples):
            rejected = entry.drafts > sample.num_accepted
            counts["live_rejections" if entry.fate is spec.Fate.LIVE
                   else "orphan_rejections"] += rejected
            counts["sampled_outcomes"] += 1
            counts["no_draft_outcomes"] += sample.next_drafts == 0
        for entry in before.in_flight[0]:
            stale_on_running = (entry.fate is spec.Fate.SUPERSEDED and
                                before.requests[entry.req].status is spec.Status.RUNNING)
            counts["stale_on_running"] += stale_on_running
            counts["stale_on_running_sampled"] += stale_on_running and entry.samples


@contextlib.contextmanager
def counting(counts: collections.Counter) -> Iterator[None]:
    """Every checked step of every machine counts into `counts` (0.8.x only)."""
    checked = machine.RefinementMachine._check

    def check_and_count(self, action, expected=None):
        before = self.state
        # the window as the abort rule saw it: the state is still the one before
        in_window = not self.by_name and isinstance(action, spec.Abort) and bool(self._resume_window())
        checked(self, action, expected)
        counts["steps"] += 1
        if not self.by_name:
            counts["window_aborts"] += in_window
            _count_step(counts, self, before, self.state, action)

    machine.RefinementMachine._check = check_and_count
    try:
        yield
    finally:
        machine.RefinementMachine._check = checked


@contextlib.contextmanager
def resume_window(open_: bool) -> Iterator[None]:
    """The machine as it is, or (not `open_`) with its resume window closed."""
    window = machine.RefinementMachine._resume_window
    if not open_:
        machine.RefinementMachine._resume_window = lambda self: []
    try:
        yield
    finally:
        machine.RefinementMachine._resume_window = window


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=positive_int, default=5_000, help="steps per seed")
    parser.add_argument("--seeds", type=positive_int, default=20, help="how many seeds")
    parser.add_argument("--first-seed", type=seed_int, default=0, help="seeds FIRST..FIRST+N-1")
    parser.add_argument("--profiles", default=",".join(COUNTED_PROFILES),
                        help="the profiles sharing each seed's steps, the first taking the rest "
                             f"(default: {','.join(COUNTED_PROFILES)})")
    parser.add_argument("--without-resume-window", action="store_true",
                        help="close the machine's resume window (the strategies before it)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    shared_by = tuple(name for name in args.profiles.split(",") if name)
    unknown = sorted(set(shared_by) - set(PROFILES)) or ([] if shared_by else ["(none)"])
    if unknown:
        parser.error(f"--profiles: unknown {', '.join(unknown)}; known: {', '.join(PROFILES)}")
    counts: collections.Counter = collections.Counter()
    with counting(counts), resume_window(open_=not args.without_resume_window):
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            result = fuzz(args.steps, seed, shrink=False, shared_by=shared_by)
            if result.failed:                      # the correct reference must pass
                print(f"seed {seed}: the fuzzer failed on the correct reference\n{result.failure}",
                      file=sys.stderr)
                return 2
    if args.json:
        print(json.dumps(dict(sorted(counts.items()))))
    else:
        for key, value in sorted(counts.items()):
            print(f"{key:40} {value:>8,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
