"""The campaign's `--lookahead`: a drawn workload with drafts, run with a
drafter that has its own forward pass (workload.py `config.num_lookahead_tokens`).

vLLM derives the lookahead slots from the drafter (0.34
`VllmConfig.num_lookahead_tokens`: k for a draft model or EAGLE, 0 for
n-gram), so the only value beside 0 is k. `VllmConfig.
_set_max_num_scheduled_tokens` refuses a budget not above them, so a budget
of k or less is raised to k + 1 (the draw's budgets are 4 to 32: only k >= 4
moves it). The name says it (`diff-lookahead-...`), so a kept workload is
told apart from the same draw without it.

Standard library only.
"""

from __future__ import annotations

import copy
from typing import Any

LABEL = "lookahead-"
# The input slots a draft model takes per scheduled request from the batch's
# budget: 0.34 `StandaloneARSpeculatorConfig.max_num_new_slots_for_drafting`
# ("The autoregressive draft-model input retains one unsliced token"), the
# drafter replay_worker.py builds for lookahead slots; 0.33's
# `SpeculativeConfig.max_num_new_slots_for_drafting` gives the same.
DRAFT_MODEL_INPUT_SLOTS = 1


def draft_input_slots(config: Any) -> int:
    """A workload config's draft input slots: the draft model's with lookahead slots, else none (n-gram)."""
    return DRAFT_MODEL_INPUT_SLOTS if config.num_lookahead_tokens else 0


def with_lookahead(workloads: list[dict[str, Any]], on: bool) -> list[dict[str, Any]]:
    """The campaign's workloads, each with drafts given lookahead slots when `on`."""
    return [lookahead_workload(w) for w in workloads] if on else workloads


def lookahead_workload(workload: dict[str, Any]) -> dict[str, Any]:
    """`workload` with k lookahead slots when it has k > 0 drafts; unchanged
    (the same object) without drafts."""
    k = workload["config"].get("num_spec_tokens", 0)
    if not k:
        return workload
    changed = copy.deepcopy(workload)
    config = changed["config"]
    config["num_lookahead_tokens"] = k
    config["max_num_batched_tokens"] = max(config["max_num_batched_tokens"], k + 1)
    prefix, _, rest = changed["name"].partition("-")
    changed["name"] = f"{prefix}-{LABEL}{rest}" if rest else f"{LABEL}{prefix}"
    return changed
