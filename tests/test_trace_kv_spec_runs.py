"""The spec's own runs with a KV connector, written as traces, are legal to
check-trace, and both checkers agree on them (state_before included): every
offer, park, promotion, report, rollback, hold and fenced free the spec can
take, in random orders, under vLLM 0.33 and 0.34 with one and two batches in
flight. A run whose reports are then tampered with is rejected as the
connector's violation."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest

from flightcheck.spec import Abort, Arrive, Config, Prompt, Sample, Status, initial_state, schedule, step
from flightcheck.spec.actions import complete_oldest, sampling_entries
from flightcheck.spec.config import KvConnector
from flightcheck.spec.kv_reports import failable_blocks
from flightcheck.spec.transitions import FailKvLoad, ReceiveKv, SendKv
from flightcheck.verification.traces.check import check_events

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

REASONS = {Status.FINISHED_STOPPED: "stop", Status.FINISHED_LENGTH: "length",
           Status.FINISHED_ABORTED: "abort", Status.FINISHED_ERROR: "error"}


class _Writer:
    """A random run of the spec, written event by event as a trace."""

    def __init__(self, seed: int) -> None:
        self.rng = rng = random.Random(seed)
        version = ("0.33.0", "0.34.0")[seed % 2]
        kv = {"consumer": True, "producer": seed % 3 != 0, "load_failure_policy": ("recompute", "fail")[seed % 4 == 3],
              "max_inflight_loads": 1 if seed % 5 == 4 and version == "0.34.0" else None}
        self.cfg = Config(num_stages=1 + seed % 2, max_num_batched_tokens=8, max_num_seqs=3, block_size=2,
                          num_blocks=12, max_model_len=16, prefix_caching=False,
                          profile="vllm-0.34" if version == "0.34.0" else "vllm-0.33", kv_connector=KvConnector(**kv))
        self.prompts = [Prompt(rng.choice((2, 4, 6)), rng.randint(1, 3), external_hit=rng.choice((0, 2, 4)),
                               load_async=rng.random() < 0.5) for _ in range(5)]
        self.events: list[dict[str, Any]] = [
            {"ev": "config", "num_stages": self.cfg.num_stages, "max_num_batched_tokens": 8, "max_num_seqs": 3,
             "block_size": 2, "num_blocks": 12, "max_model_len": 16, "eos_token_id": 0, "vllm_version": version,
             "kv_connector": kv}]
        self.state = initial_state(len(self.prompts), 12)
        self.arrived = self.batch = 0
        self.fenced = 0                              # moves after which a free waited behind the fence

    def run(self, moves: int) -> list[dict[str, Any]]:
        for _ in range(moves):
            choice = self.rng.random()
            if choice < 0.15:
                self._arrive()
            elif choice < 0.5:
                self._schedule()
            elif choice < 0.75:
                self._complete()
            elif choice < 0.97:
                self._report()
            else:
                self._abort()
            self.fenced += bool(self.state.deferred_frees)
        return self.events

    def _finishes(self, before, after) -> None:
        for r, (b, a) in enumerate(zip(before.requests, after.requests)):
            if a.status.is_finished and not b.status.is_finished:
                held_for_send = a.held and not a.load.in_transfer      # not for an aborted load's report
                self.events.append({"ev": "finish", "req": f"r{r}", "reason": REASONS[a.status],
                                    "held": held_for_send})

    def _arrive(self) -> None:
        if self.arrived == len(self.prompts):
            return
        p, r = self.prompts[self.arrived], self.arrived
        self.state = step(self.state, self.cfg, Arrive(r, p))
        self.events.append({"ev": "arrive", "req": f"r{r}", "prompt_len": p.prompt_len, "max_tokens": p.max_tokens,
                            "external_hit": p.external_hit, "load_async": p.load_async})
        self.arrived += 1

    def _schedule(self) -> None:
        before, scheduled = self.state, schedule(self.state, self.cfg)
        if scheduled is None:
            return
        self.state = scheduled.state
        if not (scheduled.entries or scheduled.preempted or scheduled.kv_loads):
            return                                   # an empty batch: not written
        self.batch += 1
        entries = [{"req": f"r{e.req}", "start": e.start, "n": e.n, "cached": e.cached, "external": e.external,
                    "samples": e.samples, "block_ids": list(self._promoted_table(before, e.req) + e.block_ids)}
                   for e in scheduled.entries]
        self.events.append({"ev": "schedule", "batch": self.batch if entries else None, "entries": entries,
                            "preempted": [f"r{r}" for r in scheduled.preempted],
                            "kv_loads": [{"req": f"r{r}", "start": start,
                                          "block_ids": list(self.state.requests[r].block_table)}
                                         for r, start in scheduled.kv_loads]})
        if not entries and self.state.in_flight and not self.state.in_flight[-1]:
            # a call that only parked or preempted: its empty batch is done at once, as the checker does
            self.state = replace(self.state, in_flight=self.state.in_flight[:-1])

    @staticmethod
    def _promoted_table(before, r: int) -> tuple[int, ...]:
        q = before.requests[r]      # a load that left nothing valid gives its table back at promotion
        return q.block_table if q.status is Status.WAITING_FOR_REMOTE_KVS and q.num_computed > 0 else ()

    def _complete(self) -> None:
        if not self.state.in_flight:
            return
        head, sampling = self.state.in_flight[0], sampling_entries(self.state, self.cfg)
        samples = tuple(Sample(stop_at=0 if self.rng.random() < 0.2 else None) for _ in sampling)
        before, self.state = self.state, complete_oldest(self.state, self.cfg, samples)
        if head:
            self.events.append({"ev": "complete", "tokens": {f"r{e.req}": [0 if s.stop_at == 0 else 5]
                                                             for e, s in zip(sampling, samples)},
                                "dropped": [f"r{e.req}" for e in head if e.samples and e not in sampling]})
        self._finishes(before, self.state)

    def _report(self) -> None:
        options: list[tuple[Any, dict]] = []
        for r, q in enumerate(self.state.requests):
            if q.load.in_transfer:
                options.append((ReceiveKv(r), {"ev": "kv_received", "req": f"r{r}"}))
            for b in failable_blocks(self.state, self.cfg, r):
                options.append((FailKvLoad(r, b), {"ev": "kv_failed", "req": f"r{r}", "from_block": b}))
            if q.held and not q.load.in_transfer:
                options.append((SendKv(r), {"ev": "kv_sent", "req": f"r{r}"}))
        self.rng.shuffle(options)
        for action, event in options:
            after = step(self.state, self.cfg, action)
            if after is None:
                continue
            before, self.state = self.state, after
            if isinstance(action, FailKvLoad) and not after.requests[action.req].status.is_finished:
                q = after.requests[action.req]
                event |= {"computed": q.num_computed, "placeholders": q.placeholders}
            self.events.append(event)
            self._finishes(before, after)
            return

    def _abort(self) -> None:
        active = [r for r, q in enumerate(self.state.requests) if q.status.is_active]
        if active:
            r = self.rng.choice(active)
            before, self.state = self.state, step(self.state, self.cfg, Abort(r))
            self.events.append({"ev": "abort", "req": f"r{r}"})
            self._finishes(before, self.state)


SEEDS = range(16)


@pytest.mark.parametrize("seed", SEEDS)
def test_the_specs_own_kv_runs_are_legal_to_both_checkers(seed):
    events = _Writer(seed).run(160)
    kinds = {e["ev"] for e in events}
    result = check_events([dict(e) for e in events])
    assert result.ok, (seed, result.line, result.property, result.message)
    full = check_events([dict(e) for e in events], full=True)
    assert result.to_json() == full.to_json()
    assert "schedule" in kinds


def test_the_runs_take_every_kv_event():
    kinds: set[str] = set()
    fields: set[str] = set()
    fenced = 0
    for seed in SEEDS:
        writer = _Writer(seed)
        for e in writer.run(160):
            kinds.add(e["ev"])
            fields.update(k for k in ("kv_loads", "held") if e.get(k))
            fields.update("external" for x in e.get("entries", ()) if x.get("external"))
            fields.update("error" for _ in [0] if e.get("reason") == "error")
        fenced += writer.fenced
    assert {"kv_received", "kv_failed", "kv_sent", "abort"} <= kinds
    assert {"kv_loads", "held", "external", "error"} <= fields
    assert fenced > 0                                # the step fence deferred some free


def test_a_run_with_a_report_repeated_is_rejected_as_the_connectors():
    rejected = 0
    for seed in SEEDS:
        events = _Writer(seed).run(160)
        reports = [i for i, e in enumerate(events) if e["ev"] in ("kv_received", "kv_sent")]
        if not reports:
            continue
        at = reports[0]
        events.insert(at + 1, dict(events[at]))
        result = check_events(events)
        assert not result.ok and result.property == "C3_report_once" and result.line == at + 2, \
            (seed, result.line, result.property, result.message)
        rejected += 1
    assert rejected >= 8


@pytest.mark.parametrize("damage, prop", [
    ("held", "KV1_no_reuse_under_transfer"),         # blocks freed at finish under a send or an aborted load
    ("kv_loads", "kv_load_decision"),                # a park at another start
    ("computed", "KV3_rollback_restores_counters"),  # a rollback left past the valid prefix
])
def test_runs_with_a_seeded_scheduler_error_are_rejected_at_it(damage, prop):
    rejected = 0
    for seed in SEEDS:
        events = _Writer(seed).run(160)
        at = next((i for i, e in enumerate(events) if e.get(damage) or damage == "computed" and damage in e), None)
        if at is None:
            continue
        if damage == "held":
            events[at]["held"] = False
        elif damage == "kv_loads":
            events[at]["kv_loads"][0]["start"] += 1
        else:
            events[at]["computed"] += 2
        result = check_events(events)
        assert (result.ok, result.line, result.property) == (False, at + 1, prop), (seed, result.message)
        rejected += 1
    assert rejected >= 3
