"""The engine-loop copy's deferred-output drafts (engine.py `deferred_drafts`,
draft_handler.py): with a structured request's sampling deferred
(`pending_structured_output_tokens`, async scheduling) and speculative
decoding on, vLLM's `EngineCore.step_with_batch_queue` (0.33.0, 0.34.0)
hands the runner's drafts to `Scheduler.update_draft_token_ids_in_output`
after the oldest output is applied and before the deferred batch's bitmask.
The runner's answer is the V2 runner's `DraftTokensHandler`, per version."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

from flightcheck.vllm.compat import queued_requests
from flightcheck.vllm.draft_handler import DraftHandler
from flightcheck.vllm.engine import BatchQueueEngineV033, BatchQueueEngineV034
from flightcheck.vllm.run_endings import unfinished_requests

pytestmark = pytest.mark.usefixtures("both_checkers")   # its vLLM runs are checked: both checkers compared


def _output(spec: dict[str, list[int]], deferred: bool) -> SimpleNamespace:
    return SimpleNamespace(num_scheduled_tokens={r: 1 + len(d) for r, d in spec.items()},
                           total_num_scheduled_tokens=sum(1 + len(d) for d in spec.values()),
                           scheduled_spec_decode_tokens=dict(spec), pending_structured_output_tokens=deferred,
                           finished_req_ids=set())


def test_033s_runner_answers_with_the_latest_sampled_batch_and_034s_with_each_live_requests_row() -> None:
    deferred = _output({"b": [-1, -1], "c": [-1, -1]}, True)
    for retains, expected in ((False, (["a", "b"], [[1, 2], [3, 4]])), (True, (["b", "c"], [[3, 4], [5, 6]]))):
        handler = DraftHandler(retains)
        handler.submitted({"c": [5, 6]})              # an older batch
        handler.submitted({"a": [1, 2], "b": [3, 4]})  # the latest batch that sampled
        handler.submitted({"b": [7, 8], "c": [9, 9]})  # the deferred batch: not sampled yet when asked
        req_ids, drafts = handler.take(deferred)
        assert (req_ids, drafts) == expected
        drafts[0].append(0)                            # the scheduler trims and pads in place: fresh lists
        assert handler.take(deferred) == expected
    handler = DraftHandler(True)
    handler.submitted({"b": [3, 4], "c": [5, 6]})
    handler.discard("c")                               # finished (or preempted) before the deferred batch
    handler.submitted({"b": [7, 8]})
    assert handler.take(deferred) == (["b"], [[3, 4]])


class _Scheduler:
    """Just what the engine loop calls, each call logged."""

    def __init__(self, outputs: list[SimpleNamespace]) -> None:
        self.outputs, self.calls = list(outputs), []
        self.waiting, self.running = [], []

    def has_requests(self) -> bool:
        return bool(self.outputs)

    def schedule(self) -> Any:
        output = self.outputs.pop(0)
        self.calls.append(("schedule", output.pending_structured_output_tokens))
        return output

    def update_from_output(self, output: Any, result: Any) -> Any:
        self.calls.append(("update_from_output", output.pending_structured_output_tokens))
        return {}

    def update_draft_token_ids_in_output(self, drafts: Any, output: Any) -> None:
        self.calls.append(("update_draft_token_ids_in_output", drafts.req_ids, drafts.draft_token_ids))

    def get_grammar_bitmask(self, output: Any) -> None:
        self.calls.append(("get_grammar_bitmask", output.pending_structured_output_tokens))


class _Model:
    """Submits each batch's rows to the handler, as FabricatedModel does."""

    def __init__(self) -> None:
        self.draft_handler: DraftHandler | None = None
        self.latest_drafts = None

    def execute(self, output: Any) -> None:
        assert self.draft_handler is not None
        self.draft_handler.submitted({r: [10 + i, 20 + i] for i, r in enumerate(output.num_scheduled_tokens)})


@pytest.mark.parametrize("engine_class", [BatchQueueEngineV033, BatchQueueEngineV034])
def test_a_deferred_batch_gets_the_runners_drafts_after_the_oldest_output_and_before_its_bitmask(engine_class):
    scheduler = _Scheduler([_output({"r": [-1, -1]}, False), _output({"r": [-1, -1]}, True)])
    engine = engine_class(scheduler, _Model(), 2, lambda ids: None, None,
                          deferred_draft_token_ids=lambda ids, drafts: SimpleNamespace(req_ids=ids,
                                                                                      draft_token_ids=drafts))
    engine.step_with_batch_queue()
    engine.step_with_batch_queue()
    assert scheduler.calls == [("schedule", False), ("get_grammar_bitmask", False), ("schedule", True),
                               ("update_from_output", False),
                               ("update_draft_token_ids_in_output", ["r"], [[10, 20]]),
                               ("get_grammar_bitmask", True)]
    assert engine.deferred_drafts_handed == 1


def test_without_drafts_a_deferred_batch_gets_only_its_bitmask() -> None:
    scheduler = _Scheduler([_output({"r": []}, False), _output({"r": []}, True)])
    model = _Model()
    model.draft_handler = DraftHandler(True)
    engine = BatchQueueEngineV034(scheduler, model, 2, lambda ids: None)
    engine.step_with_batch_queue()
    engine.step_with_batch_queue()
    assert [c[0] for c in scheduler.calls] == ["schedule", "get_grammar_bitmask", "schedule",
                                               "update_from_output", "get_grammar_bitmask"]


@dataclass(order=True)
class _Request:
    request_id: str                     # ordered as vLLM's Request.__lt__ orders (a total order)


class _Heap:
    """A priority queue as vLLM's: its iterator must not run for the bridge's bookkeeping."""

    def __init__(self, requests: list[Any]) -> None:
        self._heap = requests

    def __iter__(self) -> Any:
        raise AssertionError("the bridge called the queue's iterator")


def test_the_unfinished_requests_are_read_without_the_priority_queues_iterator() -> None:
    scheduler = SimpleNamespace(waiting=_Heap([_Request("b"), _Request("a")]), running=[_Request("c")])
    assert unfinished_requests(scheduler) == ["a", "b", "c"]
    assert unfinished_requests(SimpleNamespace(waiting=[SimpleNamespace(request_id="x")], running=[])) == ["x"]
    # the heap read in the queue's own order (what its iterator yields: ascending)
    assert queued_requests(_Heap([3, 1, 2])) == [1, 2, 3]
    assert queued_requests(deque([3, 1, 2])) == [3, 1, 2]


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_vllms_scheduler_takes_the_deferred_drafts_under_grammars_and_drafts(version: str) -> None:
    """Async scheduling, k = 2, structured requests: the real scheduler's
    `update_draft_token_ids_in_output` is called and every run ends done."""
    from flightcheck.vllm import ASYNC_RECORDER
    from flightcheck.vllm.generate import RandomPicker, campaign_workloads, hash_seed
    from flightcheck.vllm.grammar_generate import with_grammars
    from flightcheck.vllm.replay import ReplayWorker

    from .vllm_support import require_venv
    require_venv(version)
    worker = ReplayWorker(version)
    try:
        calls, endings = 0, set()
        for i, workload in enumerate(campaign_workloads(23, 6, spec_tokens=2, mid_step_inputs=True)):
            with_grammars(RandomPicker(hash_seed(99, i)), workload)
            workload["config"]["async_scheduling"] = True
            result = worker.replay(workload, scheduler_cls=ASYNC_RECORDER)
            calls += result["deferred_drafts"]
            endings.add(result["ending"])
    finally:
        worker.close()
    assert calls > 0 and endings == {"done"}
