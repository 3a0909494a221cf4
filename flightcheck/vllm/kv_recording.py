"""What the recorder writes about a KV connector (docs/kv-connector.md,
"Trace events"; docs/trace-format.md, "KV connector"): `KVRecordingMixin`
goes in front of `RecordingMixin` (recorder.py) and adds, on a scheduler
that has a connector (`Scheduler.connector`, vLLM 0.33 on), and nothing
otherwise:

* `config.kv_connector`: `consumer` / `producer` (the `KVTransferConfig`'s
  `is_kv_consumer` / `is_kv_producer`), `load_failure_policy`
  (`kv_load_failure_policy`), `max_inflight_loads` (0.34's
  `SchedulerConfig.max_num_inflight_kv_loads`, null without);
* `arrive.external_hit` / `arrive.load_async`: what the connector offers the
  request, asked of a connector that can say (the replay's fabricated one,
  `flightcheck_offer`); a deployment's connector cannot, and they are left out;
* `schedule.entries[].external` (tokens of the entry's `start` a sync load
  brings in this batch) and `schedule.kv_loads` (`[{req, start}]`: requests
  parked for an async load by this call, `start` their `num_computed_tokens`
  then), read from the connector metadata of the call (`loads`, the
  fabricated connector's); a `schedule` event is written for a call that
  only parks loads;
* `kv_failed` (`req`, `from_block`: 0 for a failed receive, else the first
  block of the request's table among `invalid_block_ids`; per request whose
  own load failed, as the fabricated connector says, or, with a connector
  that cannot say, per holder), read before vLLM acts and written before
  the first event of the update (the
  completion, or a finish by `"error"`): vLLM handles failures first in
  `update_from_output`; under the recompute policy with `computed` (and,
  async, `placeholders`): the request's counters once vLLM rolled it back
  (vLLM handles an output's failures in one scan: where an output has
  several, each carries `of`, their number);
  `kv_received` / `kv_sent` (`req`) after the completion and its finishes:
  vLLM handles `finished_recving`, then `finished_sending`, at the end of
  `update_from_output`;
* `schedule.kv_loads[].block_ids`: the table allocated for the load;
* `finish.held`: true when vLLM keeps the finished request (and its blocks)
  for a send; a request aborted during its load is held for the load's
  report instead, which the format leaves to the model (`held` false).

And the ground truth (ground_truth.Observations) from vLLM's state: a
block that a parked or held request references found back in the free pool
(`kv_blocks_freed_under_transfer`), blocks or requests not returned at
the end of a complete run (`kv_blocks_leaked_at_end`), a recompute
rollback that keeps output placeholders (`kv_rollback_placeholders`,
#49250), and a token of a batch in flight at a rollback appended all the
same (`kv_superseded_tokens`: the failing batch's output is skipped, later
ones are not). A KV failure's requests finished by `"error"` are finished
one by one in the order vLLM's `_handle_invalid_blocks` scanned them
(recording.py): vLLM frees a set in its hash order, which varies.

Standard library only: this module never imports vLLM.
"""

from __future__ import annotations

from typing import Any

from .run_endings import left_to_clients, unfinished_requests


class KVRecordingMixin:
    """Put in front of RecordingMixin (recorder.py)."""

    _fc_kv_loads: list[dict[str, Any]] = []
    _fc_kv_failures: list[dict[str, Any]] = []
    # ids of requests aborted while their load was in flight (held for the
    # load's report, not for a send), until that report
    _fc_kv_load_holds: frozenset[str] = frozenset()
    # (batch, request id): entries in flight when vLLM rolled the request back
    _fc_kv_superseded: frozenset[tuple[Any, str]] = frozenset()
    _fc_kv_computed_before: dict[str, tuple[Any, int]] = {}
    # ids vLLM's invalid-block scan rolled back during the update being read,
    # and those of them it set back by the failing batch's tokens (every
    # invalid block they hold marked by a request before them in the pass)
    _fc_kv_scanned_back: frozenset[str] = frozenset()
    _fc_kv_reverted: frozenset[str] = frozenset()
    # a holder's over-counted rollback, by request: where its KV stops being
    # valid, and the observation a later cut to there withdraws
    _fc_holder_bases: dict[str, tuple[int, dict[str, Any]]] = {}

    def _fc_connector(self) -> Any:
        return getattr(self, "connector", None)

    # -- ground truth (ground_truth.Observations, KV fields) -------------------------

    def _fc_check_transfer_holds(self) -> None:
        """Every block of a request parked for a load, or finished and kept
        for a transfer, still has a holder (`ref_cnt` > 0): none is back in
        the free pool where the next allocation may hand it out (KV1)."""
        observations = self.flightcheck_observations  # type: ignore[attr-defined]
        observations.kv_connector = True
        for req_id, request in list(self.requests.items()):
            status = request.status.name
            if status != "WAITING_FOR_REMOTE_KVS" and not request.is_finished():
                continue
            groups = self.kv_cache_manager.get_blocks(req_id).blocks  # type: ignore[attr-defined]
            freed = [block.block_id for block in (groups[0] if groups else ())
                     if not getattr(block, "is_null", False) and block.ref_cnt <= 0]
            seen = getattr(self, "_fc_kv_freed_seen", set())
            if freed and (id(request), tuple(freed)) not in seen:
                self._fc_kv_freed_seen = seen | {(id(request), tuple(freed))}
                observations.kv_blocks_freed_under_transfer.append({
                    "step": self.flightcheck_step, "req": req_id, "blocks": freed,  # type: ignore[attr-defined]
                    "why": "loading" if status == "WAITING_FOR_REMOTE_KVS" else "finished, held"})

    def flightcheck_end(self, *, complete: bool = True) -> None:
        """At the end of a complete run: every block back in the pool and no
        request kept (KV4), then RecordingMixin's end."""
        if complete and self._fc_connector() is not None:
            self._fc_check_returned_at_end()
        super().flightcheck_end(complete=complete)  # type: ignore[misc]

    def _fc_check_returned_at_end(self) -> None:
        """KV4 at the end: every block back in the pool, no request kept. A
        run that ends waiting on the clients of sessions parked for input
        (run_endings.py `left_to_clients`: a client that never sends the end
        of its session) leaves its unfinished requests theirs: a parked
        session keeps its blocks (vLLM 0.33.0/0.34.0 `_handle_stopped_request`
        frees none) and what waits behind it keeps what it holds."""
        pool = self.kv_cache_manager.block_pool  # type: ignore[attr-defined]
        missing = int(self.kv_cache_config.num_blocks) - 1 - int(pool.get_num_free_blocks())  # type: ignore
        kept = sorted(self.requests)
        if left_to_clients(self):
            unfinished = set(unfinished_requests(self))
            held = {block.block_id for req_id in unfinished
                    for block in (self.kv_cache_manager.get_blocks(req_id).blocks or [()])[0]  # type: ignore
                    if not getattr(block, "is_null", False)}
            missing, kept = missing - len(held), [req_id for req_id in kept if req_id not in unfinished]
        if missing or kept:
            self.flightcheck_observations.kv_blocks_leaked_at_end.append({  # type: ignore[attr-defined]
                "step": self.flightcheck_step, "blocks": missing, "requests": kept})  # type: ignore

    def _fc_config_event(self) -> dict[str, Any]:
        event = super()._fc_config_event()  # type: ignore[misc]
        if self._fc_connector() is not None:
            transfer = self.vllm_config.kv_transfer_config  # type: ignore[attr-defined]
            limit = getattr(self.scheduler_config, "max_num_inflight_kv_loads", None)  # type: ignore[attr-defined]
            event["kv_connector"] = {"consumer": bool(transfer.is_kv_consumer),
                                     "producer": bool(transfer.is_kv_producer),
                                     "load_failure_policy": str(transfer.kv_load_failure_policy),
                                     "max_inflight_loads": limit}
        return event

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        self._fc_kv_loads = []
        try:
            output = super().schedule(*args, **kwargs)  # type: ignore[misc]
        finally:
            self._fc_kv_loads = []
        if self._fc_connector() is not None:
            self._fc_check_transfer_holds()
        return output

    def _fc_entries(self, output: Any) -> list[tuple[Any, dict[str, Any]]]:
        """RecordingMixin's entries, with `external`; notes the call's parked loads."""
        entries = super()._fc_entries(output)  # type: ignore[misc]
        loads = getattr(getattr(output, "kv_connector_metadata", None), "loads", None) or []
        sync = {load.req_id: load.num_external_tokens for load in loads if not load.load_async}
        for _, written in entries:
            if written["req"] in sync:
                written["external"] = sync[written["req"]]
        self._fc_kv_loads = [{"req": load.req_id, "start": int(self.requests[load.req_id].num_computed_tokens),
                              "block_ids": self._fc_block_table(load.req_id)}
                             for load in loads if load.load_async and load.req_id in self.requests]
        return entries

    def _fc_has_kv_loads(self) -> bool:
        return bool(self._fc_kv_loads)

    def _fc_write(self, event: dict[str, Any], with_step: bool = True) -> None:
        if self._fc_connector() is not None:
            if self._fc_kv_failures and event.get("ev") != "kv_failed":
                self._fc_write_failures()
            self._fc_kv_fields(event)
            if event.get("ev") == "complete" and self._fc_kv_superseded:
                self._fc_check_superseded_output(event)
        super()._fc_write(event, with_step)  # type: ignore[misc]

    def _fc_kv_fields(self, event: dict[str, Any]) -> None:
        kind = event.get("ev")
        if kind == "arrive":
            offer = getattr(self._fc_connector(), "flightcheck_offer", None)
            request = self.requests.get(event["req"])
            if offer is not None and request is not None:
                hit, load_async = offer(request)
                event.update(external_hit=int(hit), load_async=bool(load_async))
        elif kind == "schedule" and self._fc_kv_loads:
            event["kv_loads"] = self._fc_kv_loads
        elif kind == "finish":
            request = self.requests.get(event["req"])
            event["held"] = (request is not None and request.is_finished()
                             and event["req"] not in self._fc_kv_load_holds)

    def finish_requests(self, request_ids: Any, finished_status: Any) -> Any:
        """Notes the requests finished while their load is in flight (vLLM
        holds their blocks for the load's report, not for a send)."""
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids or ())
        loading = {i for i in ids if i in self.requests
                   and self.requests[i].status.name == "WAITING_FOR_REMOTE_KVS"}
        self._fc_kv_load_holds = self._fc_kv_load_holds | loading
        return super().finish_requests(request_ids, finished_status)  # type: ignore[misc]

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        report = getattr(model_runner_output, "kv_connector_output", None)
        if report is None or self._fc_connector() is None:
            return super().update_from_output(scheduler_output, model_runner_output)  # type: ignore[misc]
        # written once vLLM has processed them, before the first event the update writes
        self._fc_kv_failures = self._fc_failures(report)
        # every request's counter before vLLM handles the failures: the ones it
        # rolls back (the failing loads and the requests sharing their blocks)
        self._fc_kv_computed_before = ({req_id: (request, int(request.num_computed_tokens))
                                        for req_id, request in self.requests.items()}
                                       if self._fc_kv_failures else {})
        self._fc_kv_scanned_back = self._fc_kv_reverted = frozenset()
        result = super().update_from_output(scheduler_output, model_runner_output)  # type: ignore[misc]
        self._fc_write_failures()
        for req_id in sorted(report.finished_recving or ()):
            self._fc_kv_load_holds = self._fc_kv_load_holds - {req_id}
            self._fc_write({"ev": "kv_received", "req": req_id})
        for req_id in sorted(report.finished_sending or ()):
            self._fc_write({"ev": "kv_sent", "req": req_id})
        self._fc_check_transfer_holds()
        return result

    def _update_requests_with_invalid_blocks(self, requests: Any, invalid_block_ids: Any,
                                             num_scheduled_tokens: Any, *args: Any, **kwargs: Any) -> Any:
        """vLLM's scan (0.33, 0.34), noting the requests it reports affected:
        only those are rolled back by the failure (`_fc_write_failures`);
        and, read before it acts, those it sets back to `num_computed_tokens`
        less the failing batch's tokens rather than to their first invalid
        block: each of their invalid blocks among the computed ones (the
        failing batch's tokens not counted) was marked by a request before
        them in the pass (`marked_invalid_block_ids`)."""
        requests = list(requests)            # vLLM passes a generator for the parked loads
        marked: set[int] = set()
        reverted = set()
        for request in requests:
            computed = int(request.num_computed_tokens) - int(num_scheduled_tokens.get(request.request_id, 0))
            table = self._fc_block_table(request.request_id)[:max(0, -(-computed // self.block_size))]  # type: ignore
            held = {block for block in table if block in invalid_block_ids}
            if held and held <= marked:
                reverted.add(request.request_id)
            marked |= held
        found = super()._update_requests_with_invalid_blocks(  # type: ignore[misc]
            requests, invalid_block_ids, num_scheduled_tokens, *args, **kwargs)
        self._fc_kv_scanned_back = self._fc_kv_scanned_back | set(found[0])
        self._fc_kv_reverted = self._fc_kv_reverted | reverted
        return found

    def _fc_failures(self, report: Any) -> list[dict[str, Any]]:
        """The `kv_failed` events of a report: a failed receive from block 0;
        invalid blocks: each request whose own load failed, from the load's
        first invalid block (the fabricated connector says which and where,
        whether or not the request still holds them), else, read against
        vLLM's block tables before it acts, each holder from its first."""
        failures = [{"ev": "kv_failed", "req": req_id, "from_block": 0}
                    for req_id in sorted(getattr(report, "failed_recving", None) or ())]
        own = getattr(report, "flightcheck_failed_loads", None)
        if own is not None:                  # the fabricated connector: the loads that failed, and where
            return failures + [{"ev": "kv_failed", "req": req_id, "from_block": own[req_id]} for req_id in sorted(own)]
        invalid = set(report.invalid_block_ids or ())
        for req_id in sorted(self.requests) if invalid else ():
            table = self._fc_block_table(req_id)
            first = next((i for i, block in enumerate(table) if block in invalid), None)
            if first is not None:
                failures.append({"ev": "kv_failed", "req": req_id, "from_block": first})
        return failures

    def _fc_write_failures(self) -> None:
        """The pending `kv_failed` events, with the request's computed tokens
        (and, async, its output placeholders) once vLLM processed the failure
        under the recompute policy. A request is rolled back when a failure
        is its own or vLLM's `_update_requests_with_invalid_blocks` reported
        it affected: any other whose counter fell lost rejected drafts in
        `update_from_output` (0.34.0 sync, one stage, drafts: campaign seed
        2 index 45 of `--all-features --spec-tokens 2 --stages 1`, a holder
        beside another request's failed receive)."""
        pending, self._fc_kv_failures = self._fc_kv_failures, []
        recompute = bool(getattr(self, "recompute_kv_load_failures", False))
        failing = {failure["req"] for failure in pending}
        holders, superseded_before = [], self._fc_kv_superseded
        for req_id, (request, computed) in self._fc_kv_computed_before.items():
            if req_id not in failing | self._fc_kv_scanned_back:
                continue
            if recompute and not request.is_finished() and request.num_computed_tokens < computed:
                self._fc_withdraw_repaired_base(req_id, request)
                self._fc_note_superseded(req_id, request)
                if req_id not in failing:
                    holders.append(self._fc_counters({"req": req_id}, request))
                    self._fc_check_holder_base(req_id, request, superseded_before)
                    if self.records_async_scheduling:  # type: ignore[attr-defined]
                        self._fc_check_rollback(holders[-1])      # #49250 on a sharer too
        self._fc_kv_computed_before = {}
        if holders and pending:               # the requests sharing the failed blocks, on the output's last
            pending[-1]["holders"] = sorted(holders, key=lambda holder: holder["req"])
        for failure in pending:
            if len(pending) > 1:             # one output's: the checker judges them together
                failure["of"] = len(pending)
            request = self.requests.get(failure["req"])
            if recompute and request is not None and not request.is_finished():
                self._fc_counters(failure, request)
                if self.records_async_scheduling:  # type: ignore[attr-defined]
                    self._fc_check_rollback(failure)
            self._fc_write(failure)

    def _fc_counters(self, record: dict[str, Any], request: Any) -> dict[str, Any]:
        """A rolled-back request's computed tokens (and, async, its output
        placeholders), added to `record`."""
        record["computed"] = int(request.num_computed_tokens)
        if self.records_async_scheduling:  # type: ignore[attr-defined]
            record["placeholders"] = int(request.num_output_placeholders)
        return record

    def _fc_note_superseded(self, req_id: str, request: Any) -> None:
        """The batches still in flight with an entry of a request vLLM just
        rolled back: computed over the invalid KV, their output must never
        be applied (the carrier's own, vLLM skips)."""
        for record in self._fc_in_flight.values():  # type: ignore[attr-defined]
            if any(e.request is request for e in record.entries):
                self._fc_kv_superseded = self._fc_kv_superseded | {(record.batch_id, req_id)}

    def _fc_check_superseded_output(self, event: dict[str, Any]) -> None:
        """Ground truth: a token of a batch scheduled before the rollback,
        past the valid prefix, appended all the same (`_update_requests_with_invalid_blocks`
        skips only the failing batch's output: findings 1 and 2 of
        docs/vllm-kv-connector-findings.md)."""
        dropped = set(event.get("dropped", ()))
        for req_id, tokens in event.get("tokens", {}).items():
            if tokens and req_id not in dropped and (event.get("batch"), req_id) in self._fc_kv_superseded:
                self.flightcheck_observations.kv_superseded_tokens.append({  # type: ignore[attr-defined]
                    "step": self.flightcheck_step, "req": req_id, "batch": event["batch"]})  # type: ignore

    def _fc_check_holder_base(self, req_id: str, request: Any, superseded: frozenset[tuple[Any, str]]) -> None:
        """Ground truth: a request sharing the invalid blocks, which another
        recomputes, goes back to the start of its entry in the failing batch
        (the KV it computed there read them); vLLM's
        `_update_requests_with_invalid_blocks` takes `num_computed_tokens`
        less that entry's tokens, which counts its later batches still in
        flight as computed (`kv_rollback_base_assumes_one_batch`): for a
        request it set back so (`_fc_kv_reverted`), any later entry of the
        request's admission now that no earlier rollback superseded
        (`superseded`), however it stands to the base (0.33.0 `--all-features
        --spec-tokens 2 --seed 11` async index 41: r2's entry of the failing
        batch and its later one both 3 tokens, so the later one starts at the
        base); for a request cut at its first invalid block, an entry in
        flight starting below it (one of an earlier admission, from past a
        preemption's reset, starts above it and counts nothing)."""
        base, admission = int(request.num_computed_tokens), self._fc_admitted(request)  # type: ignore[attr-defined]
        reverted = req_id in self._fc_kv_reverted
        later = [(record.batch_id, e.start, e.n) for record in self._fc_in_flight.values()  # type: ignore[attr-defined]
                 for e in record.entries if e.request is request
                 and (e.n > 0 and e.incarnation == admission and (record.batch_id, req_id) not in superseded
                      if reverted else e.start < base)]
        if later:
            observed = {"step": self.flightcheck_step, "req": req_id,  # type: ignore[attr-defined]
                        "computed": base, "batches": [b for b, _, _ in later]}
            self.flightcheck_observations.kv_holder_base_counts_later_batches.append(observed)  # type: ignore
            if reverted:                      # each later entry's tokens counted past the failing entry's start
                valid_up_to = base - sum(n for _, _, n in later)
            else:
                failing_entry = self._fc_kv_computed_before[req_id][1] - base
                valid_up_to = min(start for _, start, _ in later) - failing_entry
            self._fc_holder_bases = {**self._fc_holder_bases, req_id: (valid_up_to, observed)}

    def _fc_withdraw_repaired_base(self, req_id: str, request: Any) -> None:
        """A holder rolled back over its later batches is cut again, by a
        failure of its own or another's, to where its KV was still valid:
        every over-counted token is recomputed before any use, so the run
        is not wrong there (campaign seed 33 index 27, grammar +
        kv-connector: r1's own load failure cuts it below the batches its
        holder rollback counted). A token sampled from those batches is
        the superseded output's own ground truth (`_fc_check_superseded_output`)."""
        noted = self._fc_holder_bases.get(req_id)
        if noted is not None and request.num_computed_tokens <= noted[0]:
            self._fc_holder_bases = {k: v for k, v in self._fc_holder_bases.items() if k != req_id}
            observations = self.flightcheck_observations.kv_holder_base_counts_later_batches  # type: ignore
            observations[:] = [o for o in observations if o is not noted[1]]

    def _fc_check_rollback(self, failure: dict[str, Any]) -> None:
        """Ground truth: the intended rollback supersedes every live entry of
        the request, so none of its output placeholders is left; vLLM's
        `_update_requests_with_invalid_blocks` leaves them (#49250), on the
        request whose load failed and on one rolled back for sharing its
        blocks alike (campaign `--versions 0.34.0,0.33.0 --all-features
        --async --seed 335` index 35: r4, holding r0's failed blocks, kept 3
        placeholders and was aborted at once, so no later breach named it:
        check-trace's KV3 at the `kv_failed` was counted a false rejection)."""
        if failure["placeholders"] > 0:
            self.flightcheck_observations.kv_rollback_placeholders.append({  # type: ignore[attr-defined]
                "step": self.flightcheck_step, "req": failure["req"],  # type: ignore[attr-defined]
                "computed": failure["computed"], "placeholders": failure["placeholders"]})

    def _fc_block_table(self, req_id: str) -> list[int]:
        groups = self.kv_cache_manager.get_block_ids(req_id)  # type: ignore[attr-defined]
        return list(groups[0]) if groups else []
