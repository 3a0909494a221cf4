"""The KV connector's part of the trace checker (docs/trace-format.md, "KV
connector"; the model: docs/kv-connector.md).

From the trace, as the environment's (the connector's) choices: what it
offers each arrival (`external_hit`, `load_async`) and its reports
(`kv_received`, `kv_failed`, `kv_sent`), each replayed as the spec's action
(`receive_kv`, `fail_kv_load`, `send_kv`) where the trace writes it. As the
scheduler's decisions, against the spec: each entry's `external`, the
requests a schedule call parks for an async load (`kv_loads`) and their
start, a rollback's counters, and whether a finished request's blocks are
held for a send (`finish.held`).

Where a decision differs, the message names the KV property it breaks,
when one does (a loading request scheduled: KV2; a rollback not restored:
KV3; a landed load left waiting: KV5; a park past the load limit: KV6;
blocks freed under a send or held past it: KV1, KV4), else
`kv_load_decision`. A report the spec's connector cannot make (its action
disabled) is the connector's violation, not the scheduler's: it names the
contract clause it breaks (C1-C3) and says the connector broke it.
Every schedule event, whatever the spec decides: an entry computing on
KV a failed load left invalid and nothing has recomputed (KV7,
`_check_invalid_kv`; spec/kv_invalid.py).
"""

from __future__ import annotations

from typing import Any, Callable

from flightcheck.spec import Config, Schedule, Scheduled, State, Status, schedule, step
from flightcheck.spec.config import KvConnector
from flightcheck.spec.kv_invalid import kv7_reads, mark_invalid
from flightcheck.spec.kv_loads import admits_inflight_load, promote
from flightcheck.spec.kv_reports import fail_cut_parked_load, mark_finished_load_invalid, rollback
from flightcheck.spec.schedule import is_empty_step
from flightcheck.spec.state import Fate, Load
from flightcheck.spec.transitions import CONTRACT_PROPERTIES, FailKvLoad, FailKvOutput, ReceiveKv, SendKv

from .named_state import quoted, transfer_pending
from .unwritten import trace_batch

CONTRACT = "the KV connector broke its contract"
KV_LOAD_DECISION = "kv_load_decision"


def connector_from_event(event: dict[str, Any]) -> KvConnector | None:
    """The spec's KvConnector from a validated config event (None: no connector)."""
    keys = event.get("kv_connector")
    if keys is None:
        return None
    return KvConnector(consumer=keys["consumer"], producer=keys["producer"],
                       load_failure_policy=keys.get("load_failure_policy", "fail"),
                       max_inflight_loads=keys.get("max_inflight_loads"))


def prompt_offer(event: dict[str, Any]) -> dict[str, Any]:
    """The connector's offer to an arrival, as Prompt fields."""
    return {"external_hit": event.get("external_hit", 0), "load_async": event.get("load_async", False)}


def loading(q) -> bool:
    """A request the scheduler must not schedule: in WAITING_FOR_REMOTE_KVS."""
    return q.status is Status.WAITING_FOR_REMOTE_KVS


class ConnectorEvents:
    """The connector's events for check.py's TraceChecker (a mixin: it reads
    the checker's state and names and raises through `self._violation`)."""

    state: State
    cfg: Config
    slot: dict[str, int]
    names: list[str]
    unchecked: set[str]
    finished_now: dict[int, Status]
    _violation: Callable[[str, str], Exception]
    _quoted_name: Callable[[int], str]
    _check_properties: Callable[..., None]
    _arrival_order: Callable[[], list[int]]
    _match_blocks: Callable[[str, list, tuple[int, ...]], None]
    _with_queue_slot: Callable[[], State]
    scheduled: Scheduled | None

    def _start_connector(self) -> None:
        # slot -> the spec's (computed, placeholders) after its recompute
        # rollback, until its next entry or park (KV3 is checked there)
        self.rolled_back: dict[int, tuple[int, int]] = {}
        # slots the fail policy finished at a kv_failed whose finish event may
        # still wait for the update's outputs (until the next complete)
        self.errors_after_outputs: set[int] = set()
        # the kv_failed events of the output being read (KvOutput), judged jointly
        self.kv_output: KvOutput | None = None
        # slots whose own load's failure was applied (a second report of it is no cut)
        self.own_load_failed: set[int] = set()

    def _promote_at_empty_calls(self, event: dict) -> None:
        """A schedule() call that formed nothing still ran its waiting loop,
        which promotes a landed load at the head of kv_holding_waiting before
        failing to admit it (`_handle_blocked_waiting_request`,
        `_update_waiting_for_remote_kv`: the table of a load that left nothing
        valid goes back to the free queue's head, a valid prefix is cached).
        So at an event noting such calls (`empty_batches_before`), the
        promotions of the spec's step there are taken now, when the calls were
        made: taken at the next batch, after a completion drained fenced frees
        ahead of them, the freed table would be allocated first (a false S9,
        0.33.0 async `campaign --all-features --seed 3` index 150)."""
        notes = event.get("empty_batches_before")
        if not isinstance(notes, list) or not any(isinstance(n, dict) and n.get("ev") == "schedule" for n in notes):
            return
        now = self._with_queue_slot() if self.cfg.rules.output_placeholders else self.state
        scheduled = schedule(now, self.cfg)
        if scheduled is None or not is_empty_step(scheduled) or scheduled.kv_loads:
            return                   # (a call that formed or parked something: the trace's next batch says)
        after = self.state
        for r in [x for x in scheduled.state.kv_holding + scheduled.state.waiting
                  if loading(self.state.requests[x]) and not loading(scheduled.state.requests[x])]:
            after = promote(after, self.cfg, r)
        if after is not self.state:
            self.scheduled = scheduled
            before, self.state = self.state, after
            self._check_properties(before, after, Schedule())

    # -- the reports ----------------------------------------------------------

    def _report_slot(self, name: str, action: Callable[[int], Any],
                     state: State | None = None) -> tuple[int, Any, State] | None:
        """The incarnation of `name` the report is for: the newest one whose
        action the spec enables in `state` (default: the current one; an older
        incarnation may still hold a transfer while a newer holds the name).
        None if none does."""
        state = self.state if state is None else state
        current = self.slot.get(name)
        candidates = [current] if current is not None else []
        candidates += [r for r in range(len(self.names) - 1, -1, -1) if self.names[r] == name and r != current]
        for r in candidates:
            label = action(r)
            after = step(state, self.cfg, label)
            if after is not None:
                return r, label, after
        return None

    def _apply_report(self, r: int, label: Any, after: State) -> None:
        before, self.state = self.state, after
        self._check_properties(before, after, label)
        # the fail policy finishes r, and every request sharing its invalid
        # blocks (kv_reports.shared_holders): their finish events follow
        for x, q in enumerate(after.requests):
            if q.status.is_finished and not before.requests[x].status.is_finished:
                self.finished_now[x] = q.status
                if isinstance(label, (FailKvLoad, FailKvOutput)):
                    self.errors_after_outputs.add(x)

    def _error_finish_may_wait(self, event: dict) -> bool:
        """vLLM's `update_from_output` handles load failures first and
        finishes the fail policy's errors after the batch's outputs: between a
        kv_failed and its finish by "error" the trace may write more failures
        of the update and its one complete event."""
        if not self.errors_after_outputs or not set(self.finished_now) <= self.errors_after_outputs:
            return False
        if event["ev"] == "complete":
            self.errors_after_outputs = set()                     # its finishes come next
            return True
        return event["ev"] == "kv_failed"

    def _on_kv_received(self, event: dict) -> None:
        found = self._report_slot(event["req"], ReceiveKv)
        if found is None:
            raise self._violation("C3_report_once", f"{CONTRACT}: kv_received for {quoted(event['req'])}, "
                                  f"which has no KV load in flight ({self._transfer_state(event['req'])})")
        self._apply_report(*found)

    def _on_kv_sent(self, event: dict) -> None:
        found = self._report_slot(event["req"], SendKv)
        if found is None:
            raise self._violation("C3_report_once", f"{CONTRACT}: kv_sent for {quoted(event['req'])}, "
                                  f"which holds no blocks for a send ({self._transfer_state(event['req'])})")
        self._apply_report(*found)

    def _on_kv_failed(self, event: dict) -> None:
        """A failure of the output being read: judged with the output's
        earlier ones, from the state before the output (`KvOutput`)."""
        output = self.kv_output
        if output is None or not output.continued_by(self.state, event):
            output = self.kv_output = KvOutput(self.state, _output_key(event))
        output.seen += 1
        name, from_block = event["req"], event["from_block"]
        found = self._report_slot(name, lambda r: FailKvLoad(r, from_block), output.before)
        if found is None and self._failure_of_finished_load(name, output.before):
            self.state = mark_finished_load_invalid(self.state, self.cfg, self.slot[name], from_block)
            output.finished.append((self.slot[name], from_block))
            self._cut_parked_load_again(name, event)
            output.after = self.state
            return
        if found is None and self._cut_running_load_again(name, event):
            output.after = self.state
            return
        if found is None:
            why = (f"{self.cfg.profile} has no KV load failures" if not self.cfg.rules.kv_load_failures
                   else self._transfer_state(name))
            raise self._violation("C2_reports_own_blocks", f"{CONTRACT}: kv_failed for {quoted(name)} from "
                                  f"block {from_block}, which is not a block of a KV load of its own in "
                                  f"flight ({why})")
        r, label, alone = found
        joint = FailKvOutput(tuple(f for f, _ in output.failures) + (label,))
        after = step(output.before, self.cfg, joint) if output.failures else alone
        if after is None:
            # a second report of one load (the spec's connector makes none), or
            # two carrying batches: read it after the others, as a later output's
            self.kv_output = KvOutput(self.state, _output_key(event))
            return self._on_kv_failed(event)
        after = output.with_finished_marks(after, self.cfg)
        for prop in CONTRACT_PROPERTIES if output.failures else ():
            if not prop.holds(output.before, alone, label, self.cfg):   # the contract, as alone
                raise self._violation(prop.name, prop.statement)
        output.failures.append((label, event))
        self.own_load_failed.add(r)
        self._apply_report(r, label if len(output.failures) == 1 else joint, after)
        output.after = self.state
        self._note_rollbacks(output)

    def _note_rollbacks(self, output: "KvOutput") -> None:
        """Every request the output's failures rolled back so far (KV3 at
        its next entry or park), and the failing requests' counters against
        their events (KV3 at the event): at each event, or, where the writer
        says how many failures the output has (`of`), once all are read."""
        for h in output.noted:
            self.rolled_back.pop(h, None)
        output.noted = set()
        for h, (b, a) in enumerate(zip(output.before.requests, self.state.requests)):
            if not a.status.is_finished and a.num_computed < b.num_computed:
                self.rolled_back[h] = (a.num_computed, a.placeholders)
                output.noted.add(h)
        if output.seen < output.failures[-1][1].get("of", 1):
            return
        for label, event in output.failures:
            q = self.state.requests[label.req]
            if q.status.is_finished:
                continue
            self.rolled_back[label.req] = (q.num_computed, q.placeholders)
            output.noted.add(label.req)
            self._check_rollback_counters(label.req, event)
        for holder in output.failures[-1][1].get("holders", ()):
            self._check_holder_counters(holder)

    def _check_holder_counters(self, holder: dict) -> None:
        """KV3 at the event for a request the output rolled back besides the
        failing ones (`holders`: it shares their invalid blocks), against the
        spec's rollback of it; without them a holder aborted before its next
        entry is never checked (0.33.0 async `campaign --all-features --seed 1`
        index 64: #49250's placeholders on a sharer)."""
        r = self.slot.get(holder["req"])
        q = None if r is None else self.state.requests[r]
        if q is None or q.status.is_finished or r not in self.rolled_back:
            raise self._violation("KV3_rollback_restores_counters",
                                  f"the trace rolls {quoted(holder['req'])} back with the failed loads, the "
                                  f"spec does not ({'no such request' if q is None else self._transfer_state(holder['req'])})")
        for key, attr in (("computed", "num_computed"), ("placeholders", "placeholders")):
            if key in holder and holder[key] != getattr(q, attr):
                raise self._violation("KV3_rollback_restores_counters",
                                      f"{self._quoted_name(r)}, which shares the failed blocks, has {key} "
                                      f"{holder[key]} after the rollback in the trace, {getattr(q, attr)} in the spec")

    def _failure_of_finished_load(self, name: str, state: State) -> bool:
        """A failure reported for the load of a request that finished (aborted,
        or failed before) while the load or the batch carrying it was in
        flight, or of a parked load already failed: the connector reports
        what it knew, and vLLM acts on no finished request (`_handle_failed_recving` takes only requests in
        WAITING_FOR_REMOTE_KVS, `_update_requests_with_invalid_blocks` only
        parked and running ones). The spec's state is unchanged; an aborted
        async load still owes its `finished_recving` (C3)."""
        r = self.slot.get(name)
        if r is None:
            return False
        q = state.requests[r]
        # a parked load another request's failure already failed (it shared
        # the invalid blocks): its own report reaches past the valid prefix
        # vLLM's scan reads (`num_computed_tokens`), and changes nothing
        shared_failure = q.status is Status.WAITING_FOR_REMOTE_KVS and q.load is Load.FAILED
        return shared_failure or (q.status.is_finished and q.load is not Load.NONE)

    def _cut_parked_load_again(self, name: str, event: dict) -> None:
        """The own failure of a parked load another load's failure cut before
        (`_failure_of_finished_load`): vLLM cuts it again where its own failure
        is shorter (kv_reports.fail_cut_parked_load: a request-level report
        zeroes it; 0.34.0 `campaign --all-features --seed 1` index 173, a false
        KV3 before). Only a parked request's computed tokens go down (no table,
        queue or batch changes, so no invariant can break); as before, no
        contract clause is read (the spec's FAILED load does not tell a sharer's
        cut from its own failure); KV3 here and at its next entry or park."""
        r = self.slot[name]
        after = fail_cut_parked_load(self.state, self.cfg, r, event["from_block"])
        if after is None or after.requests[r].num_computed == self.state.requests[r].num_computed:
            return
        self.state = after
        self.rolled_back[r] = (after.requests[r].num_computed, after.requests[r].placeholders)
        self._check_rollback_counters(r, event)

    def _cut_running_load_again(self, name: str, event: dict) -> bool:
        """The own failure of a running request's sync load whose entry another
        load's failure superseded (it held that load's blocks and was rolled
        back), reported with the batch that carried it: vLLM's scan over
        `running` (`_update_requests_with_invalid_blocks`) cuts the request
        again where it has computed past the failed block since (0.34.0
        `campaign --all-features` seed 33 index 27, a false C2 before); the
        intended rollback from there (kv_reports.rollback), KV3 at the event.
        False: not such a report (a second report of a load already failed
        is none: the spec's connector makes none, C2)."""
        r = self.slot.get(name)
        if r is None or r in self.own_load_failed or self.state.requests[r].status is not Status.RUNNING:
            return False
        carried = [e for e in self.state.entries_of(r, fate=None) if e.external and e.fate is Fate.SUPERSEDED]
        if not carried:
            return False
        valid, bs = event["from_block"] * self.cfg.block_size, self.cfg.block_size
        if self.cfg.kv_connector.load_failure_policy == "recompute":   # KV7: its loaded blocks from there
            table = self.state.requests[r].block_table
            self.state = mark_invalid(self.state, table[event["from_block"]:-(-carried[-1].start // bs)])
        if self.state.requests[r].num_computed > valid:
            self.state = rollback(self.state, self.cfg, r, valid)
            self.rolled_back[r] = (valid, self.state.requests[r].placeholders)
            self._check_rollback_counters(r, event)
        return True

    def _check_rollback_counters(self, r: int, event: dict) -> None:
        """KV3 at the event: the counters the trace says the rollback left."""
        q = self.state.requests[r]
        said = [(key, event[key], getattr(q, attr)) for key, attr in
                (("computed", "num_computed"), ("placeholders", "placeholders")) if key in event]
        if not said:
            self.unchecked.add("a rollback's counters at its kv_failed event (no computed or placeholders; "
                               "the request's next entry checks them)")
        for key, theirs, spec in said:
            if theirs != spec:
                raise self._violation("KV3_rollback_restores_counters",
                                      f"after the failed load of {self._quoted_name(r)} from block "
                                      f"{event['from_block']} the trace's {key} is {theirs}, the spec's "
                                      f"rollback leaves {spec}")

    def _transfer_state(self, name: str) -> str:
        r = self.slot.get(name)
        if r is None:
            return "it never arrived"
        q = self.state.requests[r]
        return f"{q.status.value}, load {q.load.value}{', held' if q.held else ''}"

    # -- the scheduler's decisions ----------------------------------------------

    def _diagnose_kv_entries(self, spec_entries, trace_entries: list[dict], parked: list[int]) -> None:
        """Before a schedule_decision is reported: the KV property the
        trace's batch breaks, if it breaks one (`parked`: the requests the
        spec's call parks)."""
        if self.cfg.kv_connector is None:
            return
        spec_by_req = {e.req: e for e in spec_entries}
        for x in trace_entries:
            r = self.slot.get(x["req"])
            if r is None:
                continue
            q, e = self.state.requests[r], spec_by_req.get(r)
            if (loading(q) or r in parked) and e is None:
                where = (f"while in WAITING_FOR_REMOTE_KVS (its load {q.load.value})" if loading(q)
                         else "in the call that parks it for its async KV load")
                raise self._violation("KV2_loading_not_scheduled", f"{self._quoted_name(r)} is scheduled "
                                      f"{where}: the spec does not schedule it")
            if r in self.rolled_back and e is not None and (x["start"], x["n"]) != (e.start, e.n):
                raise self._violation("KV3_rollback_restores_counters", f"after its rolled-back load "
                                      f"{self._quoted_name(r)} is scheduled @{x['start']}+{x['n']}, the spec "
                                      f"schedules it @{e.start}+{e.n}")
            if e is not None and x.get("external", 0) and not e.external and q.load is not Load.NONE:
                raise self._violation("C1_load_promised_once", f"{CONTRACT}: {self._quoted_name(r)} loads "
                                      f"{x['external']} tokens again, after its load was done or failed")
        traced = {self.slot.get(x["req"]) for x in trace_entries}
        for e in spec_entries:
            if self.state.requests[e.req].load is Load.RECEIVED and e.req not in traced and trace_entries:
                raise self._violation("KV5_loaded_not_starved", f"{self._quoted_name(e.req)}'s load has "
                                      "landed and the spec promotes and schedules it; the trace leaves it "
                                      "waiting while it schedules others")

    def _check_invalid_kv(self, scheduled: Scheduled | None, trace_entries: list[dict]) -> None:
        """KV7 at a schedule event, before its decisions are compared: an
        entry of the trace's batch whose computed prefix holds a block a
        failed load left invalid that the batch does not recompute
        (spec/kv_invalid.py; vLLM #37827), save a rolled-back request whose
        entry the spec's call does not make as the trace does (KV3 names its
        start, `_diagnose_kv_entries`). A rolled-back sharer the spec
        schedules alike is KV7's: vLLM 0.34.0 `_update_requests_with_invalid_blocks`
        lets it keep blocks the marker recomputes later, and a chunked marker
        (`long_prefill_token_threshold`) rewrites them batches after the
        sharer reads them (0.34.0 `campaign --all-features --spec-tokens 2
        --lookahead --reuse-ids --seed 379` index 44, a miss before). The
        tables: the spec's after its call, or before it where the spec's is
        shorter than the entry's start."""
        invalid, bs = self.state.invalid_kv, self.cfg.block_size
        if not invalid or not trace_entries:
            return
        batch = trace_batch(self.slot, self.state, scheduled, trace_entries, bs)
        ours = {e.req: (e.start, e.n) for e in scheduled.entries} if scheduled is not None else {}
        for r, blocks in kv7_reads(invalid, batch, bs):
            x = next(x for x in trace_entries if self.slot.get(x["req"]) == r)
            if r in self.rolled_back and ours.get(r) != (x["start"], x["n"]):
                continue                  # its rollback's start differs: KV3 (`_diagnose_kv_entries`) names it
            raise self._violation("KV7_no_compute_on_invalid_kv", f"{self._quoted_name(r)} is scheduled "
                                  f"@{x['start']}+{x['n']} on blocks {[self._trace_id(b) for b in blocks]} "
                                  "(the trace's ids), whose KV a failed load left "
                                  "invalid and no batch has recomputed (vLLM #37827)")

    def _check_kv_loads(self, before: State, scheduled: Scheduled | None, event: dict) -> None:
        """The requests the spec's call from `before` parked for an async
        load (`Scheduled.kv_loads`), and their start, against the trace's
        `kv_loads`."""
        loads = event.get("kv_loads", [])
        parked = [r for r, _ in scheduled.kv_loads] if scheduled is not None else []
        after = scheduled.state if scheduled is not None else before
        theirs = [(x["req"], x["start"]) for x in loads]
        ours = [(self.names[r], start) for r, start in (scheduled.kv_loads if scheduled is not None else ())]
        if theirs == ours:
            if any("block_ids" not in x for x in loads):
                self.unchecked.add("the blocks of parked KV loads (kv_loads carry no block_ids)")
                return
            for x, r in zip(loads, parked):
                self._match_blocks(x["req"], list(x["block_ids"]), after.requests[r].block_table)
            return
        names_ours = [n for n, _ in ours]
        for name, start in theirs:
            r = self.slot.get(name)
            if r is not None and r in self.rolled_back and name in names_ours:
                raise self._violation("KV3_rollback_restores_counters", f"after its rolled-back load "
                                      f"{quoted(name)} is parked at {start}, the spec at "
                                      f"{dict(ours)[name]}")
            if name not in names_ours and r is not None and not admits_inflight_load(after, self.cfg):
                raise self._violation("KV6_load_limit", f"{quoted(name)} is parked for a KV load with "
                                      f"{self.cfg.kv_connector.max_inflight_loads} loads already in flight "
                                      "(max_inflight_loads)")
            if name not in names_ours and r is not None and self.state.requests[r].load is Load.DONE:
                raise self._violation("C1_load_promised_once", f"{CONTRACT}: {quoted(name)} is parked for a "
                                      "second KV load, after its load was done or failed")
        raise self._violation(KV_LOAD_DECISION, f"the spec parks {_fmt_loads(ours)} for a KV load, the trace "
                              f"{_fmt_loads(theirs)}")

    def _parked_table(self, r: int) -> tuple[int, ...]:
        """The table r holds before this schedule call for its async load
        (a promoted request is admitted with it: `block_ids` lists it first),
        parked still or promoted by an earlier call and not admitted then (it
        keeps its table in `kv_holding_waiting`, its load RECEIVED until it
        runs). What a parked load keeps is the spec's promotion's to say
        (`kv_loads.promote`): a load that left nothing valid gives its table
        back (vLLM 0.33.0/0.34.0 `Scheduler._update_waiting_for_remote_kv`
        frees it, the admission allocates anew), one that covered every
        token keeps it though `num_computed` drops to `num_tokens - 1`: 0
        for a one-token prompt (campaign --kv-connector 0.33.0 async,
        --spec-tokens 2, seed 11 index 19), so `num_computed` does not tell."""
        q = self.state.requests[r]
        if loading(q):
            return promote(self.state, self.cfg, r).requests[r].block_table
        promoted = q.status is Status.WAITING and q.load is Load.RECEIVED
        return q.block_table if promoted else ()

    def _diagnose_block_under_transfer(self, name: str, trace_block: Any, spec_block: int) -> None:
        """A block handed out again (the trace's id already names spec block
        `spec_block`) while a KV transfer or, behind the step fence, an
        in-flight batch still references it: KV1, not a mere renaming."""
        if self.cfg.kv_connector is None:
            return
        s = self.state
        if any(spec_block in table for _, table in s.deferred_frees):
            why = "its free deferred behind a batch still in flight (the step fence)"
        elif any(spec_block in q.block_table for q in s.requests if q.held or q.load.in_transfer):
            why = "a KV transfer still holds it"
        else:
            return
        raise self._violation("KV1_no_reuse_under_transfer", f"{quoted(name)} gets block {trace_block} in the "
                              f"trace, which the spec has not freed: {why}")

    def _settle_rollbacks(self, scheduled_or_parked: list[int]) -> None:
        """A rolled-back request's next entry or park was checked (KV3)."""
        for r in scheduled_or_parked:
            self.rolled_back.pop(r, None)

    def _transfers_at_end(self) -> None:
        """At `end`: a load or a send the connector never reported."""
        if self.cfg.kv_connector is None:
            return
        for r in self._arrival_order():
            q = self.state.requests[r]
            if q.load.in_transfer or q.held:
                what = "KV load" if q.load.in_transfer else "KV send (its blocks held for it)"
                raise self._violation("C3_report_once", f"{CONTRACT}: the run ended with the {what} of "
                                      f"{self._quoted_name(r)} never reported")

    def _check_held(self, r: int, event: dict) -> None:
        """finish.held against the spec's decision to hold r's blocks for a
        send. A request finished during its load is held for the load's
        report instead, which the spec knows from the load: there `held` may
        say either (writers differ on whether that hold is a `held`)."""
        if self.cfg.kv_connector is None:
            return
        q = self.state.requests[r]
        if "held" not in event:
            if self.cfg.kv_connector.producer:
                self.unchecked.add("whether finished requests' blocks were held for a KV send (finish "
                                   "events carry no held)")
            return
        if event["held"] and not q.held:
            raise self._violation("KV4_no_leak", f"{self._quoted_name(r)} finishes with its blocks held for a "
                                  "KV send; the spec frees them (no transfer is in flight for it)")
        if not event["held"] and q.held and not q.load.in_transfer:
            raise self._violation("KV1_no_reuse_under_transfer", f"{self._quoted_name(r)} finishes with its "
                                  "blocks freed; the spec holds them until its KV is sent")


class KvOutput:
    """The `kv_failed` events of one batch output, read so far: vLLM judges
    an output's failures together (kv_reports.fail_kv_output), so each is
    replayed as the joint action of the output's failures so far from the
    state before the output. A writer writes them one after another, with
    one `step` and `engine_step` (docs/trace-format.md, "kv_failed")."""

    def __init__(self, before: State, key: tuple, failures: list | None = None) -> None:
        self.before = before                       # the state before the output's failures
        self.key = key
        self.failures: list[tuple[FailKvLoad, dict]] = failures or []
        self.after: State | None = None            # the state after its last kv_failed
        self.noted: set[int] = set()               # slots it put in rolled_back
        self.seen = len(self.failures)             # its kv_failed events read (some change nothing)
        self.finished: list[tuple[int, int]] = []  # (slot, from_block): failures of finished loads read

    def with_finished_marks(self, state: State, cfg: Config) -> State:
        """`state`, a step from `before`, with the blocks the output's finished
        loads' failures left invalid: no action of that step marks them (KV7;
        0.34.0 `Scheduler._handle_invalid_blocks` takes every report's
        `invalid_block_ids` at once; seed 429 index 44, a miss before)."""
        for r, from_block in self.finished:
            state = mark_finished_load_invalid(state, cfg, r, from_block)
        return state

    def continued_by(self, state: State, event: dict) -> bool:
        """`event` is a failure of this output: nothing changed the state
        since its last kv_failed, and it has the same step and engine step."""
        return state is self.after and _output_key(event) == self.key


def _output_key(event: dict) -> tuple:
    return event.get("step"), event.get("engine_step")


def _fmt_loads(loads: list[tuple[str, int]]) -> str:
    return "[" + ", ".join(f"{quoted(name)}@{start}" for name, start in loads) + "]"


__all__ = ["CONTRACT", "ConnectorEvents", "KV_LOAD_DECISION", "connector_from_event", "loading",
           "prompt_offer", "transfer_pending"]
