"""Refinement with a KV connector: the reference's connector against the
spec's (docs/kv-connector.md), under every profile that has one
(`KV_FUZZED_PROFILES`).

The machine is machine.py's with three more kinds of choice for the
environment:

* the configuration draws a connector (`kv_configs`: role, failure policy,
  0.34's load limit); no drafts (the reference's connector is modelled
  without them) and no reservation for async loads (the spec abstracts
  vLLM's `_inflight_prefill_reserved_blocks` away:
  `SchedulerConfig.kv_load_reservation=False`);
* each arrival draws what the connector offers it (`hit` blocks beyond the
  local hit, sync or async): the reference request's `KvOffer`, the spec's
  `Prompt.external_hit` / `load_async`;
* each completion draws which of the connector's pending transfers report
  with that output (the reference's connector is scripted:
  `FabricatedConnector.scripted`, `next_output`): failures of a parked
  load or of a sync load the completing batch carries, landings, sends.
  vLLM delivers reports only with outputs, failures before the batch's
  outputs and the rest after them; the spec lets each happen between any
  two actions, so the reference's completion is checked against the spec's
  `FailKvLoad`s, then `CompleteOldest`, then the `ReceiveKv`s and `SendKv`s,
  in the order the reference takes them.

Left out by the draws: a sync load's failure whose blocks another table
holds (a prefix hit on them: vLLM and the reference roll that request back
too, the spec abstracts shared invalid blocks away), and under the fail
policy with prefix caching (vLLM evicts the failed blocks' hashes, the spec
abstracts that away).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule

from flightcheck import spec
from flightcheck.reference import Request, SamplingParams, SchedulerConfig
from flightcheck.reference.connector import KvConnectorConfig, KvConnectorOutput, KvOffer
from flightcheck.spec.kv_reports import failable_blocks
from flightcheck.verification.refinement.bounded_run import fuzz_machine, machine_per_profile
from flightcheck.verification.refinement.machine import RefinementMachine, _step
from flightcheck.verification.refinement.strategies import EOS, NEAR_CAP, configs, outcomes, prompt_tokens

KV_FUZZED_PROFILES: tuple[str, ...] = ("vllm-0.33", "vllm-0.33-async", "vllm-0.34", "vllm-0.34-async")
NUM_REPORT_CODES = 8


@st.composite
def kv_configs(draw: Any, profile: str) -> SchedulerConfig:
    """machine.py's configurations under `profile`, with a connector."""
    cfg = draw(configs(profile))
    connector = KvConnectorConfig(consumer=draw(st.sampled_from([True, True, False])),
                                  producer=draw(st.booleans()),
                                  load_failure_policy=draw(st.sampled_from(["recompute", "fail"])),
                                  max_inflight_loads=draw(st.sampled_from([None, 1, 2])))
    return replace(cfg, num_spec_tokens=0, kv_connector=connector, kv_load_reservation=False)


class KvRefinementMachine(RefinementMachine):
    """RefinementMachine with the connector's choices (the module doc)."""

    profile = KV_FUZZED_PROFILES[0]

    @initialize(data=st.data(), sample_every_chunk=st.booleans())
    def setup(self, data: Any, sample_every_chunk: bool) -> None:
        RefinementMachine.setup(self, cfg=data.draw(kv_configs(self.profile)),
                                sample_every_chunk=sample_every_chunk)
        self.scheduler.connector.scripted = True
        self._report_codes: list[int] = []
        self._after_completion: list[Any] = []

    @precondition(lambda self: self.engine is not None and self._may_arrive())
    @rule(prompt_len=st.integers(1, 4) | st.integers(1, 15 + NEAR_CAP), family=st.integers(0, 1),
          tail=st.integers(0, 4), max_tokens=st.integers(6, 20), hit_blocks=st.integers(0, 3),
          load_async=st.booleans())
    @_step
    def arrive(self, prompt_len: int, family: int, tail: int, max_tokens: int, hit_blocks: int,
               load_async: bool) -> None:
        """machine.py's arrival (fresh names only), offered `hit_blocks`
        blocks beyond its local hit, asynchronously or not."""
        slot = len(self.ledger.requests)
        if prompt_len > 15:
            length = max(1, self.cfg.max_model_len - 1 - (prompt_len - 16))
        else:
            length = 1 + (prompt_len - 1) % max(1, self.cfg.max_model_len // 2)
        request = Request(f"r{slot}", prompt_tokens(slot, family, max(0, length - tail), length),
                          SamplingParams(max_tokens=max_tokens), eos_token_id=EOS)
        hit = hit_blocks * self.cfg.block_size
        request.kv_offer = KvOffer(hit=hit, load_async=load_async) if hit else None
        self.engine.add_request(request)
        _, prompt = self.ledger.arrive(request)
        name = self.ledger.name_of(slot) if self.by_name else None
        prompt = replace(prompt, external_hit=hit, load_async=load_async and hit > 0)
        self._check(spec.Arrive(slot, prompt) if name is None else spec.ArriveAs(slot, prompt, name))

    @precondition(lambda self: self.engine is not None and self.engine.can_complete()
                  and self.num_completes * 8 <= len(self.history))
    @rule(returned=outcomes(), reports=st.lists(st.integers(0, 99), min_size=NUM_REPORT_CODES,
                                                max_size=NUM_REPORT_CODES))
    @_step
    def complete(self, returned: list[Any], reports: list[int]) -> None:
        self.num_completes += 1
        self._report_codes = reports
        self._complete(returned)

    @precondition(lambda self: self.engine is not None and (
        self.engine.can_complete() or self.scheduler.has_unfinished_requests()))
    @rule(returned=outcomes(), reports=st.lists(st.integers(0, 99), min_size=NUM_REPORT_CODES,
                                                max_size=NUM_REPORT_CODES))
    @_step
    def engine_step(self, returned: list[Any], reports: list[int]) -> None:
        """machine.py's `engine_step` under vLLM 0.33's loop (every connector
        profile runs it), reports drawn for a completion."""
        self._report_codes = reports
        self._step_queueing_empty_batches(returned)

    # -- the reports that come with a completion --------------------------------

    def _complete(self, returned: list[Any]) -> None:
        """Choose the reports, apply the failures to the spec's state first
        (they come before the batch's outputs), script them into the
        reference's connector, then complete (machine.py), the landings and
        sends checked after `CompleteOldest` (`_check`)."""
        failures, after = self._choose_reports(list(self._report_codes))
        output = KvConnectorOutput()
        for slot, from_block in failures:
            self._script_failure(output, slot, from_block)
            mid = spec.step(self.state, self.spec_cfg, spec.FailKvLoad(slot, from_block))
            if mid is None:
                self._fail(f"the spec refuses kv failure r{slot} from block {from_block} in "
                           f"{spec.describe(self.state)}")
            self.history.append((spec.FailKvLoad(slot, from_block), mid))
            if mid.requests[slot].status.is_finished:
                self.finished_unreported.add(slot)   # the fail policy: an error
            self.state = mid
        for action in after:
            name = self.ledger.requests[action.req].request_id
            (output.finished_recving if isinstance(action, spec.ReceiveKv) else output.finished_sending).append(name)
        self.scheduler.connector.next_output = output
        self._after_completion = after
        super()._complete(returned)

    def _choose_reports(self, codes: list[int]) -> tuple[list[tuple[int, int]], list[Any]]:
        """From the spec's state: failures (by request id, the reference's
        order), then landings in arrival order, then sends."""
        state, cfg = self.state, self.spec_cfg
        failures, receives, sends = [], [], []
        for slot, req in enumerate(state.requests):
            code = codes[slot % len(codes)] if codes else 0
            parked = req.status is spec.Status.WAITING_FOR_REMOTE_KVS
            if req.load.in_transfer and code % 3 == 0:
                receives.append(spec.ReceiveKv(slot))
            if req.held and not req.load.in_transfer and code % 4 == 1:
                sends.append(spec.SendKv(slot))
            if code % 5 != 2 or not cfg.rules.kv_load_failures:
                continue
            blocks = [b for b in failable_blocks(state, cfg, slot) if self._may_fail(slot, b)]
            if parked and req.load is spec.Load.IN_FLIGHT:
                blocks = sorted({0, *blocks})
            if blocks:
                failures.append((slot, blocks[(code // 5) % len(blocks)]))
        failures.sort(key=lambda f: self.ledger.requests[f[0]].request_id)
        return failures, [*receives, *sends]

    def _may_fail(self, slot: int, from_block: int) -> bool:
        """A sync load's failure the draws allow (the module doc): its
        blocks held by its table alone, and no eviction to abstract away."""
        req = self.state.requests[slot]
        if req.status is not spec.Status.RUNNING:
            return True
        if not self.state.in_flight or all(e.req != slot or e.external == 0 for e in self.state.in_flight[0]):
            return False                  # vLLM reports it with the batch that carried it
        if self.cfg.kv_connector.load_failure_policy == "fail" and self.cfg.enable_prefix_caching:
            return False
        return all(self.state.pool.ref_counts[b] == 1 for b in req.block_table[from_block:])

    def _script_failure(self, output: KvConnectorOutput, slot: int, from_block: int) -> None:
        """The worker's report of r's failure from `from_block`: request level
        for block 0 of a parked load, else its blocks from there."""
        request = self.ledger.requests[slot]
        req = self.state.requests[slot]
        if req.status is spec.Status.WAITING_FOR_REMOTE_KVS and from_block == 0:
            output.failed_recving.append(request.request_id)
            return
        end = failable_blocks(self.state, self.spec_cfg, slot).stop
        output.invalid_block_ids |= set(req.block_table[from_block:end])

    def _check(self, action: Any, expected: spec.State | None = None) -> None:
        """A completion's landings and sends follow the spec's CompleteOldest."""
        if isinstance(action, spec.CompleteOldest) and self._after_completion and expected is None:
            expected, _ = self._expected_after_completion(self.state, action)
            for report in self._after_completion:
                stepped = spec.step(expected, self.spec_cfg, report)
                if stepped is None:
                    self._fail(f"the spec refuses `{report}` in {spec.describe(expected)}")
                expected = stepped
            self._after_completion = []
        super()._check(action, expected)

    def _check_request_data(self, before: spec.State, output: Any) -> None:
        """machine.py's, with a landed load admitted as a new request: the
        workers get its whole table (vLLM's `NewRequestData`)."""
        for slot in before.kv_holding:
            if before.requests[slot].status is not spec.Status.PREEMPTED:
                before = before.with_request(slot, status=spec.Status.WAITING, block_table=())
        super()._check_request_data(before, output)

    def _check_engine_counts(self, after: spec.State) -> None:
        """machine.py's, with the connector's queue and holds: a request in
        `kv_holding` is unfinished, a held one keeps `has_requests()`."""
        unfinished = bool(after.waiting or after.running or after.kv_holding)
        if self.scheduler.has_unfinished_requests() != unfinished:
            self._fail(f"has_unfinished_requests() is {not unfinished} in {spec.describe(after)}")
        held = any(r.held for r in after.requests)
        if self.scheduler.has_requests() != (unfinished or held or bool(self.finished_unreported)):
            self._fail(f"has_requests() is {self.scheduler.has_requests()} in {spec.describe(after)}")


# The machine with every configuration under a profile (refused outside KV_FUZZED_PROFILES).
kv_machine = machine_per_profile(KvRefinementMachine, "KV connector", KV_FUZZED_PROFILES)


def kv_fuzz(steps: int, seed: int, profile: str, steps_per_program: int = 60,
            shrink: bool = True, mutant: str | None = None) -> str | None:
    """A refinement run with a connector under `profile`, `steps` rule steps
    from `seed`, the reference's `mutant` (a KV one: KV_MUTANTS) in force if
    given; the failure (the program, shrunk unless `shrink` is off, and its
    message), or None."""
    return fuzz_machine(kv_machine(profile), steps, seed, steps_per_program, shrink, mutant)
