"""What the recorder writes for a drafter with lookahead slots
(docs/trace-format.md), as hooks recording.py calls:

* the config event carries `num_lookahead_tokens` when the scheduler
  reserves KV slots past the scheduled tokens for the drafter's own forward
  pass (vLLM 0.33/0.34 `Scheduler.num_lookahead_tokens`, from
  `VllmConfig.num_lookahead_tokens`: k for a draft model or EAGLE, 0 for
  n-gram), so a trace without them is written as before;
* the config event carries `draft_input_slots` when the drafter takes
  input slots from the batch's budget per scheduled request
  (`SpeculativeConfig.max_num_new_slots_for_drafting`, which 0.33/0.34
  `Scheduler.schedule` reads as `draft_slots`: 1 for a draft model);
* a schedule event carries `skip_drafts: true` when vLLM told the model
  runner to propose no drafts after this batch (`SchedulerOutput.skip_drafts`,
  set by `Scheduler.schedule` from `_drafts_unused` when `can_skip_drafts`).

Imports no vLLM.
"""

from __future__ import annotations

from typing import Any


def config_fields(scheduler: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    lookahead = int(getattr(scheduler, "num_lookahead_tokens", 0) or 0)
    if lookahead:
        fields["num_lookahead_tokens"] = lookahead
    speculative = getattr(getattr(scheduler, "vllm_config", None), "speculative_config", None)
    slots = int(getattr(speculative, "max_num_new_slots_for_drafting", 0) or 0)
    if slots:
        fields["draft_input_slots"] = slots
    return fields


def schedule_fields(output: Any) -> dict[str, Any]:
    return {"skip_drafts": True} if getattr(output, "skip_drafts", False) else {}
