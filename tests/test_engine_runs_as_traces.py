"""The engine search's runs (verification/explicit/engine.py), written as
traces that number engine steps, against check-trace: random runs of a loop
that keeps E-a and E-b (the corrected 0.8.x loops, 0.33's, 0.34's with its
mid-step inputs, on small and larger models) are accepted by both checkers;
a run of 0.8.5's released loop that waits with a batch in flight, and whose
next input comes steps later, is rejected for E-a at that input; the
search's shortest counterexamples (0.8.5's wait, 0.8.4's stale in-flight
set) are rejected at the event where they break E-a and E-b. So the
checker's reading of engine steps and the spec's engine loop say the same
thing."""

from __future__ import annotations

import random

import pytest

from flightcheck.spec import Fate, Status, schedule
from flightcheck.spec.actions import sampling_entries
from flightcheck.spec.engine import E_A, E_B, corrected, loop_of
from flightcheck.spec import initial_state
from flightcheck.verification.explicit.engine import ENGINE_MODELS, EngineModel, search, successors
from flightcheck.verification.mutants import applied
from flightcheck.verification.models import CROWDED, PRESSURE_K2, SHARED_K3
from flightcheck.verification.traces.check import check_events

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

BY_NAME = {em.name: em for em in ENGINE_MODELS}
EOS = 0


class TraceWriter:
    """Writes one engine-model run as trace events, numbering engine steps."""

    def __init__(self, em: EngineModel) -> None:
        cfg = em.model.cfg
        self.em = em
        self.events: list[dict] = [{
            "ev": "config", "num_stages": cfg.num_stages, "max_num_batched_tokens": cfg.max_num_batched_tokens,
            "max_num_seqs": cfg.max_num_seqs, "block_size": cfg.block_size, "num_blocks": cfg.num_blocks,
            "max_model_len": cfg.max_model_len, "long_prefill_token_threshold": cfg.long_prefill_token_threshold,
            "num_spec_tokens": cfg.num_spec_tokens, "prefix_caching": cfg.prefix_caching,
            "profile": cfg.profile, "eos_token_id": EOS}]
        self.engine_step = 0
        self.batch = 0
        self.wait_broke_e_a_at: int | None = None    # the index of the first input after a wait in flight
        self.broke_e_b_at: int | None = None         # the index of the first completion that broke E-b
        # empty batches (vLLM 0.33's loop) noted as its recorder notes them
        self.notes: list[dict] = []
        self.empties = 0

    def _append(self, event: dict) -> None:
        if self.notes:
            event["empty_batches_before"], self.notes = self.notes, []
        self.events.append(event)

    def write(self, label: str, before, after, broke: str | None, gap: int) -> None:
        (state, phase), (nxt, nxt_phase) = before, after
        if label == "wait for input":
            self.engine_step += gap                   # the clock goes on while the engine waits
            if broke == E_A and self.wait_broke_e_a_at is None:
                self.wait_broke_e_a_at = len(self.events)
            return
        if label.startswith("arrive"):
            r = int(label.split()[1][1:])
            prompt = self.em.model.prompts[r]
            event = {"ev": "arrive", "req": f"r{r}", "prompt_len": prompt.prompt_len,
                     "max_tokens": prompt.max_tokens, "engine_step": self.engine_step}
            if self.em.model.cfg.prefix_caching:
                event["prompt_block_labels"] = list(prompt.labels)
            self._append(event)
        elif label.startswith("abort"):
            self._append({"ev": "abort", "req": label.split()[1], "engine_step": self.engine_step})
        elif label.startswith("step"):
            if broke is not None and self.broke_e_b_at is None:
                self.broke_e_b_at = len(self.events)  # no schedule event: the completion comes next
            self._step(state, nxt, nxt_phase)
        else:
            self._complete(state, nxt, label)

    def _step(self, state, nxt, nxt_phase: str) -> None:
        scheduled = schedule(state, self.em.model.cfg) if nxt is not state else None
        empty = scheduled is not None and not scheduled.entries and self.em.model.cfg.rules.empty_batches
        if empty:
            self.empties += 1
        if scheduled is not None and (scheduled.entries or scheduled.preempted):
            self.batch += 1 if scheduled.entries else 0
            event = {"ev": "schedule", "batch": self.batch if scheduled.entries else None,
                     "engine_step": self.engine_step, "preempted": [f"r{r}" for r in scheduled.preempted],
                     "entries": [{"req": f"r{e.req}", "start": e.start, "n": e.n, "cached": e.cached,
                                  "drafts": e.drafts, "samples": e.samples} for e in scheduled.entries]}
            if empty:
                event["empty_batch"] = self.empties
            self._append(event)
        elif empty:
            self.notes.append({"ev": "schedule", "empty_batch": self.empties})
        if nxt_phase != "mid":
            self.engine_step += 1

    def _complete(self, state, nxt, label: str) -> None:
        cfg = self.em.model.cfg
        head = state.in_flight[0]
        if head:
            samples = _samples_of(label, len(sampling_entries(state, cfg)))
            sampling = sampling_entries(state, cfg)
            tokens = {f"r{e.req}": [EOS if s[1] == i else 5 for i in range(s[0] + 1)]
                      for e, s in zip(sampling, samples)}
            drafts = {f"r{e.req}": s[2] for e, s in zip(sampling, samples) if s[2]}
            event = {"ev": "complete", "batch": None, "engine_step": self.engine_step, "tokens": tokens}
            dropped = [f"r{e.req}" for e in head if e.samples and e.fate is Fate.SUPERSEDED]
            if dropped:
                event["dropped"] = dropped
            if drafts:
                event["next_drafts"] = drafts
            self._append(event)
        else:
            self.notes.append({"ev": "complete", "empty_batch": 0})
        for r, (b, a) in enumerate(zip(state.requests, nxt.requests)):
            if a.status.is_finished and not b.status.is_finished:
                reason = "stop" if a.status is Status.FINISHED_STOPPED else "length"
                self._append({"ev": "finish", "req": f"r{r}", "reason": reason, "engine_step": self.engine_step})
        self.engine_step += 1


def _samples_of(label: str, count: int) -> list[tuple[int, int | None, int]]:
    """(accepted, stop_at, next drafts) per sampling entry, read back from the
    action's label (`CompleteOldest.__str__`)."""
    if "[" not in label:
        return [(0, None, 0)] * count
    out = []
    for part in label[label.index("[") + 1:-1].split("; "):
        accepted, stop_at, drafts = 0, None, 0
        for bit in part.split(","):
            if bit.startswith("acc="):
                accepted = int(bit[4:])
            elif bit.startswith("stop@"):
                stop_at = int(bit[5:])
            elif bit.startswith("drafts="):
                drafts = int(bit[7:])
        out.append((accepted, stop_at, drafts))
    return out


def random_run(em: EngineModel, seed: int, length: int = 150, gap: int = 1) -> TraceWriter:
    rng = random.Random(seed)
    writer = TraceWriter(em)
    node = (initial_state(em.model.num_requests, em.model.cfg.num_blocks), "between")
    with applied(em.model.mutant):
        for _ in range(length):
            edges = list(successors(em, node))
            if not edges:
                break
            inputs = [e for e in edges if e[0].startswith(("arrive", "abort"))]
            engine = [e for e in edges if e not in inputs]
            aborts_only = all(e[0].startswith("abort") for e in inputs)
            # the engine mostly gets its way; arrivals come often, aborts seldom
            pick_input = inputs and (not engine or rng.random() < (0.08 if aborts_only else 0.4))
            label, nxt, broke = rng.choice(inputs if pick_input else engine)
            writer.write(label, node, nxt, broke, gap)
            node = nxt
    return writer


def _larger(name: str, model, profile: str) -> EngineModel:
    """An engine model on one of the spec's larger search models, the
    profile's loop corrected (0.8.x) or as released (0.33, 0.34)."""
    under = model.under_profile(profile)
    loop = loop_of(under.cfg)
    return EngineModel(name, under, corrected(loop), None)


for _em in (_larger("pressure-k2@0.8.5", PRESSURE_K2, "vllm-0.8.5"),
            _larger("shared-k3@0.8.5", SHARED_K3, "vllm-0.8.5"),
            _larger("crowded@0.8.4", CROWDED, "vllm-0.8.4"),
            _larger("pressure-k2@0.33", PRESSURE_K2, "vllm-0.33"),
            _larger("shared-k3@0.34", SHARED_K3, "vllm-0.34")):
    BY_NAME[_em.name] = _em

CORRECT = ["0.8.5-loop-corrected", "0.8.4-loop-corrected", "0.33-loop", "0.34-loop", "pressure-k2@0.8.5",
           "shared-k3@0.8.5", "crowded@0.8.4", "pressure-k2@0.33", "shared-k3@0.34"]


@pytest.mark.parametrize("name", CORRECT)
@pytest.mark.parametrize("seed", range(20))
def test_runs_of_a_correct_engine_loop_are_accepted(name: str, seed: int):
    writer = random_run(BY_NAME[name], seed)
    result = check_events([dict(e) for e in writer.events])
    assert result.ok, (result.event_index, result.property, result.message)


def test_a_released_0_8_5_run_that_waits_in_flight_is_rejected_at_the_input_that_ends_the_wait():
    rejected = 0
    for seed in range(40):
        writer = random_run(BY_NAME["0.8.5-loop"], seed, gap=3)
        result = check_events([dict(e) for e in writer.events])
        if writer.wait_broke_e_a_at is None or writer.wait_broke_e_a_at >= len(writer.events):
            assert result.ok, (seed, result.property, result.message)
            continue
        assert (result.property, result.event_index) == (E_A, writer.wait_broke_e_a_at), seed
        rejected += 1
    assert rejected >= 5


def counterexample_as_trace(name: str) -> TraceWriter:
    """The engine search's shortest counterexample of `name`, written as a trace."""
    em = BY_NAME[name]
    violation = search(em).violation
    assert violation is not None
    writer = TraceWriter(em)
    node = (initial_state(em.model.num_requests, em.model.cfg.num_blocks), "between")
    with applied(em.model.mutant):
        for label, nxt in violation.path:
            broke = violation.property if (label, nxt) == violation.path[-1] else None
            writer.write(label, node, nxt, broke, gap=3)
            node = nxt
        if violation.path[-1][0].endswith("then complete oldest"):
            label, nxt, _ = next((e for e in successors(em, node) if e[0].startswith("complete")))
            writer.write(label, node, nxt, None, gap=3)
    return writer


def test_the_stale_in_flight_sets_counterexample_is_rejected_for_e_b_at_its_completion():
    # the spec mutant inflight_set_not_cleared_on_preemption drives the engine;
    # check-trace replays the correct spec and rejects the completion
    writer = counterexample_as_trace("0.8.4-loop-corrected+stale-in-flight-set")
    result = check_events([dict(e) for e in writer.events])
    assert (result.property, result.event_index) == (E_B, writer.broke_e_b_at)
    assert writer.events[result.event_index]["ev"] == "complete"


def test_0_8_5s_counterexample_is_rejected_for_e_a_at_the_input_that_ends_the_wait():
    writer = counterexample_as_trace("0.8.5-loop")
    writer.events.append({"ev": "arrive", "req": "r1", "prompt_len": 2, "max_tokens": 1,
                          "prompt_block_labels": [7], "engine_step": writer.engine_step})
    result = check_events([dict(e) for e in writer.events])
    assert (result.property, result.event_index) == (E_A, len(writer.events) - 1)
