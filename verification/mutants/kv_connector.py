"""The KV connector's historical bugs, as mutants (docs/kv-connector.md,
"Historical bugs as mutants"): each a small named edit of the spec function
(or the few functions) the bug lives in, named for the vLLM pull request or
issue that reports it (`..._prNNNNN`), with what broke and the property that
kills it.

Two kinds, by where the bug lived:
* the scheduler's (edits of spec/schedule.py, kv_loads.py, kv_fence.py,
  kv_reports.py): killed by the KV invariants, the progress property
  P_KV_preemption_frees, or a contract clause the scheduler makes a
  connector break (it asks again after a load: C1);
* the connector's (a fabricated connector): an edit of the environment's
  reports (`search.kv_reports`, the reports the explicit search offers) and
  of the spec action that takes the report, so that the report is made and
  taken; killed by the clause of the contract it breaks
  (spec/connector_contract.py).

Every one is hunted under `vllm-0.34-async` (the connector rows of vLLM
0.34.0 with asynchronous scheduling), on the model `kv_models.kv_mutant_model`
names, by `flightcheck verify --profile vllm-0.34-async --kv-connector`.
"""

from __future__ import annotations

from flightcheck.verification.mutants.spec import Mutant, _edit, _mutant

# The profile every KV connector mutant is hunted under.
KV_PROFILE = "vllm-0.34-async"


def _kv(name: str, history: str, *edits, killed_by: str, shortest: int) -> Mutant:
    return _mutant(name, "historical", history, *edits, killed_by=killed_by, shortest=shortest,
                   profile=KV_PROFILE)


# -- the scheduler's bugs ---------------------------------------------------------

SCHEDULER_BUGS: tuple[Mutant, ...] = (
    _kv("promotion_asks_connector_again_pr18232",
        "vLLM PR #18232: once an async load had landed, the waiting loop took the request through the "
        "connector's matching again (get_num_new_matched_tokens); a MultiConnector whose first connector "
        "(NIXL) then answered 0 moved on to the next one (LMCache), which promised a second, synchronous "
        "load for the same request. The edit asks again at promotion, answered as a connector never "
        "asked, loading synchronously, would answer",
        _edit("schedule._schedule_waiting_with_connector",
              "external, is_async = kv_loads.connector_offer(step.state, cfg, r, len(hit) * cfg.block_size)", """
              asked = step.state
              if asked.requests[r].load is Load.RECEIVED:
                  asked = asked.with_request(r, load=Load.NONE, load_async=False)   # the next connector
              external, is_async = kv_loads.connector_offer(asked, cfg, r, len(hit) * cfg.block_size)"""),
        killed_by="C1_load_promised_once", shortest=4),
    _kv("landed_load_count_lost_pr18631",
        "vLLM PR #18631: a landed load's computed tokens were kept in a per-step variable "
        "(num_prealloc_computed_tokens); when the promoted request could not be scheduled in that step "
        "the count was lost, and the next step took the request for a fresh one, its blocks still "
        "allocated (an asserted invariant broke). The edit forgets the count of a promoted request the "
        "loop could not admit",
        _edit("schedule._schedule_waiting_with_connector", """
              if not _admit_with_connector(step, r, hit, external, computed, running_entries):
                  break""", """
              if not _admit_with_connector(step, r, hit, external, computed, running_entries):
                  if step.state.requests[r].load is Load.RECEIVED:
                      step.state = step.state.with_request(r, num_computed=0)    # the per-step count
                  break"""),
        killed_by="S9_kv_ownership", shortest=8),
    _kv("aborted_load_freed_at_once_pr32255",
        "vLLM PR #32255: a request aborted while its async load was in flight had its blocks freed at "
        "once (finish_requests -> _free_request), while the worker still wrote them: the next request to "
        "allocate them got blocks under transfer. The edit returns the aborted load's table to the pool "
        "at abort; the load still writes it (the request keeps it as its table, not held)",
        _edit("kv_fence.finish_with_connector", """
              if not held:
                  state = release_table(state, cfg, r, req.block_table)""", """
              if not held or req.load.in_transfer:
                  state = release_table(state, cfg, r, req.block_table)"""),
        _edit("kv_fence.finish_with_connector", "held=held", "held=held and not req.load.in_transfer"),
        killed_by="S9_kv_ownership", shortest=3),
    _kv("aborted_landed_load_held_pr32255",
        "vLLM PR #32255 (its review: an abort racing finished_recving): deciding to hold an aborted "
        "request's blocks by its status alone (WAITING_FOR_REMOTE_KVS) holds them too when its load has "
        "already landed, and no finished_recving will come to free them: they leak. The edit holds an "
        "aborted parked request's table whatever its load",
        _edit("kv_fence.holds_for_transfer", "req.status is Status.WAITING_FOR_REMOTE_KVS and req.load.in_transfer",
              "req.status is Status.WAITING_FOR_REMOTE_KVS"),
        killed_by="KV4_no_leak", shortest=4),
    _kv("fence_ignored_pr45357",
        "vLLM PR #45357: with overlapping batches and a consuming connector, a finished or preempted "
        "request's blocks went back to the pool while a step still in flight wrote them, and a load into "
        "a request that reallocated them raced that write. The edit frees at once, the step fence "
        "(_request_blocks_can_be_freed, deferred_frees) left out",
        _edit("kv_fence.release_table", "can_free_now(state, cfg, r)", "True"),
        killed_by="KV1_no_reuse_under_transfer", shortest=3),
    _kv("waiting_head_blocks_promotion_pr45388",
        "vLLM issue #45388: under KV pressure a plain WAITING request at the head of the one waiting "
        "queue could not allocate, the loop broke, and the loaded requests behind it were never promoted: "
        "their blocks held, the engine scheduled nothing for ever. The edit looks at the plain waiting "
        "queue before the block holders (kv_holding_waiting drained after waiting)",
        _edit("kv_loads.next_candidate", "held = _head(state.kv_holding, walk)", """
              plain_first = _head(tuple(r for r in state.waiting if not may_load_async(state, cfg, r)), walk)
              held = None if plain_first is not None else _head(state.kv_holding, walk)"""),
        killed_by="L2_no_deadlock", shortest=4),
    _kv("fenced_victim_preempted_pr49674",
        "vLLM issue #49674: under the step fence the running loop preempted the victim its policy chose "
        "even when the victim's last step was still in flight, so its blocks were put aside and the "
        "preemption freed nothing for the request it made room for: preemption cascades with zero "
        "progress. The edit drops the guard (_request_blocks_can_be_freed) before the preemption, whose "
        "free goes behind the fence as vLLM's _preempt_request's does (_free_request_blocks)",
        _edit("schedule._victim_frees_at_once", "can_free_now(step.state, step.cfg, victim)", "True"),
        _edit("schedule._preempt", """
              state = replace(state, pool=blocks.free_table(state.pool, req.block_table, step.cfg.release_order,
                                                            step.cfg.rules.unhashed_blocks_to_head),
                              running=state.running[:-1], waiting=(victim,) + state.waiting,
                              scheduled_ids=state.scheduled_ids - {victim})""", """
              from flightcheck.spec.kv_fence import release_table      # _free_request_blocks: fenced
              state = replace(release_table(state, step.cfg, victim, req.block_table),
                              running=state.running[:-1], waiting=(victim,) + state.waiting,
                              scheduled_ids=state.scheduled_ids - {victim})"""),
        killed_by="P_KV_preemption_frees", shortest=10),
    _kv("rollback_keeps_placeholders_pr49250",
        "vLLM issue #49250 (open; unchanged in 0.34.0): under async scheduling a recompute of a failed "
        "load (_update_requests_with_invalid_blocks) rolls num_computed_tokens back but never "
        "num_output_placeholders, so the recompute is scheduled with extra placeholder tokens. The edit "
        "leaves the placeholders of the superseded entries in place",
        _edit("kv_reports.rollback", "placeholders=req.placeholders - sum(1 + e.drafts for e in live if e.samples)",
              "placeholders=req.placeholders"),
        killed_by="KV3_rollback_restores_counters", shortest=3),
    _kv("shared_prefix_failure_skipped_pr37827",
        "vLLM PR #37827 (closed unmerged): async load failures when requests share a prefix. vLLM's "
        "invalid-block handling lets a request whose failed block another request shares keep that block "
        "as computed (marked_invalid_block_ids: the other request recomputes it), a rule its own comment "
        "says holds for sync loads only. The edit applies it to an async load: a parked load's failure "
        "leaves num_computed where it was when another active request shares the prompt up to the "
        "failed block",
        _edit("kv_reports.fail_kv_load", "return state.with_request(r, num_computed=valid, load=Load.FAILED)", """
              labels = req.prompt_labels[:from_block + 1]
              shared = any(x != r and q.status.is_active and len(labels) == from_block + 1
                           and q.prompt_labels[:from_block + 1] == labels for x, q in enumerate(state.requests))
              return state.with_request(r, num_computed=req.num_computed if shared else valid, load=Load.FAILED)"""),
        killed_by="KV3_rollback_restores_counters", shortest=4),
    _kv("spec_step_blocks_not_reserved_pr57104",
        "vLLM PR #57104 (merged 2026-09-16; in 0.33.0 and 0.34.0): with a KV connector and speculative "
        "decoding (MTP), an async load was admitted into the free blocks less the other loads' "
        "remaining blocks (`_inflight_prefill_reserved_blocks`), neither counting the blocks a decode "
        "step's drafts need past the sequence (allocated only once the load has landed); two loads "
        "filled the pool, the landed one could not allocate its first decode's blocks, the waiting loop "
        "broke there, the other load could not be preempted, and the engine scheduled nothing for ever. "
        "The edit takes the spec-decode step out of the reservation (`_spec_decode_step_blocks`, and "
        "its share of `_request_remaining_blocks`)",
        _edit("kv_loads.fits_beside_reservations", "step = lookahead.step_tokens(cfg)", "step = 0"),
        killed_by="L2_no_deadlock", shortest=6),
)

# -- the connector's bugs: fabricated connectors ------------------------------------

CONNECTOR_BUGS: tuple[Mutant, ...] = (
    _kv("send_reported_before_finish_pr26929",
        "vLLM #26929: a producer's KV transfer timed out (and was reported finished_sending) before its "
        "request had finished, so the scheduler freed the blocks of a request still running. The edit "
        "fabricates a producer that reports a send for a running request, and the scheduler takes it",
        _edit("search.kv_reports", "q.held", "q.held or q.status.value == 'RUNNING'"),
        _edit("kv_reports.send_kv", "req.status.is_finished and req.held and not req.load.in_transfer",
              "(req.status.is_finished and req.held or req.status is Status.RUNNING) and not req.load.in_transfer"),
        killed_by="C5_send_after_finish", shortest=3),
    _kv("old_incarnation_transfer_reported_pr46014",
        "vLLM issue #46014: the OffloadingConnector kept a preempted request's transfer jobs and, when the "
        "request was admitted again, took them for the new incarnation's (assert not "
        "req_status.transfer_jobs). The edit fabricates a connector that keeps the old incarnation's "
        "load and reports it (finished_recving) while the request waits preempted, and a scheduler that "
        "takes the report",
        _edit("search.kv_reports", "q.load.in_transfer", "q.load.in_transfer or q.status.value == 'PREEMPTED'"),
        _edit("kv_reports.receive_kv", "not req.load.in_transfer",
              "not req.load.in_transfer and req.status is not Status.PREEMPTED"),
        killed_by="C4_new_incarnation_new_state", shortest=12),
    _kv("load_reported_after_promotion_51786",
        "vLLM issue #51786 (open; unchanged in 0.34.0): MultiConnector.get_transfer_results unions its "
        "children's finished_recving without counting them (it counts only sends, `_extra_async_saves`), "
        "so with two consumer children (NixlConnector and LMCacheMPConnector) the same request's load is "
        "reported again some steps after the first report promoted it to RUNNING, and "
        "`_update_from_kv_xfer_finished` fails `assert RequestStatus.is_finished(req.status)`, killing "
        "EngineCore. The edit fabricates that connector: it reports finished_recving again for a request "
        "running on a promoted load, and the scheduler takes the report down the branch vLLM reaches past "
        "its assertion (the table freed under a running request: `_free_blocks`)",
        _edit("search.kv_reports", "q.load.in_transfer",
              "q.load.in_transfer or (q.load_async and q.load.value == 'done' and q.status.value == 'RUNNING')"),
        _edit("kv_reports.receive_kv", "not req.load.in_transfer",
              "not req.load.in_transfer and not (req.load_async and req.load is Load.DONE "
              "and req.status is Status.RUNNING)"),
        killed_by="C3_report_once", shortest=5),
    _kv("remote_load_requested_after_preemption_pr53250",
        "vLLM PR #53250 (open): MoRIIO's get_num_new_matched_tokens ignored do_remote_prefill=False after "
        "the one-shot transfer, so a request preempted and scheduled again asked for the remote KV again; "
        "the transfer never came (the request waited for ever, or EngineCore crashed). The edit "
        "fabricates a connector that offers a preempted request its load again",
        _edit("kv_loads.connector_offer", "q.load is not Load.NONE",
              "q.load is not Load.NONE and q.status is not Status.PREEMPTED"),
        killed_by="C1_load_promised_once", shortest=14),
)

# Fabricated connectors that break the clauses no historical bug above
# breaks: each shows that its clause carries weight (synthetic).
CONTRACT_WEIGHT: tuple[Mutant, ...] = (
    _mutant("failure_names_foreign_blocks", "synthetic",
            "a connector reports invalid blocks of a sync load's request that the load was not given (the "
            "blocks the batch computes past the loaded tokens), and the scheduler rolls back to them",
            _edit("kv_reports.failable_blocks", "range((e.start - e.external) // bs, cdiv(e.start, bs))",
                  "range((e.start - e.external) // bs, cdiv(e.start + e.n, bs))"),
            killed_by="C2_reports_own_blocks", shortest=3, profile=KV_PROFILE),
    _mutant("load_reported_twice", "synthetic",
            "a connector reports finished_recving again for a load that has landed, and the scheduler "
            "takes the second report as it takes an aborted load's",
            _edit("search.kv_reports", "q.load.in_transfer", "q.load.in_transfer or q.load.value == 'received'"),
            _edit("kv_reports.receive_kv", "not req.load.in_transfer",
                  "not req.load.in_transfer and req.load is not Load.RECEIVED"),
            killed_by="C3_report_once", shortest=4, profile=KV_PROFILE),
)

KV_CONNECTOR: tuple[Mutant, ...] = SCHEDULER_BUGS + CONNECTOR_BUGS + CONTRACT_WEIGHT
