"""What the recorder writes for a drafter with lookahead slots
(docs/trace-format.md), as hooks recording.py calls:

* the config event carries `num_lookahead_tokens` when the scheduler
  reserves KV slots past the scheduled tokens for the drafter's own forward
  pass (vLLM 0.33/0.34 `Scheduler.num_lookahead_tokens`, from
  `VllmConfig.num_lookahead_tokens`: k for a draft model or EAGLE, 0 for
  n-gram), so a trace without them is written as before;
* a schedule event carries `skip_drafts: true` when vLLM told the model
  runner to propose no drafts after this batch (`SchedulerOutput.skip_drafts`,
  set by `Scheduler.schedule` from `_drafts_unused` when `can_skip_drafts`).

Imports no vLLM.
"""

from __future__ import annotations

from typing import Any


def config_fields(scheduler: Any) -> dict[str, Any]:
    lookahead = int(getattr(scheduler, "num_lookahead_tokens", 0) or 0)
    return {"num_lookahead_tokens": lookahead} if lookahead else {}


def schedule_fields(output: Any) -> dict[str, Any]:
    return {"skip_drafts": True} if getattr(output, "skip_drafts", False) else {}
