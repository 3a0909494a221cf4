"""LoRA's `max_loras` cap and the prompt-logprobs limit: their bugs, as
mutants (spec/lora.py), each a small named edit of the spec function the bug
lives in, named for the vLLM issue or pull request that reports it (ending
in its number), with what broke and the property that kills it. Hunted on
the LoRA models (verification/lora_models.py) only, as the other features'
mutants are on theirs.
"""

from __future__ import annotations

from flightcheck.verification.mutants.spec import Mutant, _edit, _mutant

# The profile every LoRA mutant is hunted under.
LORA_PROFILE = "vllm-0.34"

_HELD = "lora.held_by_lora_cap(step.state, cfg, r, step.state.running)"


def _lora(name: str, history: str, *edits, killed_by: str, shortest: int) -> Mutant:
    return _mutant(name, "historical", history, *edits, killed_by=killed_by, shortest=shortest,  # type: ignore[arg-type]
                   profile=LORA_PROFILE)


LORA: tuple[Mutant, ...] = (
    _lora("lora_no_admission_cap_issue14495",
          "vLLM issue #14495: a batch whose requests need more LoRAs than the model runner has "
          "slots failed in `activate_adapter` (\"No free lora slots\"): nothing at admission kept "
          "the LoRAs of a step within `max_loras`. The edit drops the waiting loop's LoRA test",
          _edit("schedule._schedule_waiting", _HELD, "False"),
          killed_by="LORA1_loras_within_cap", shortest=3),
    _lora("lora_cap_stops_admission_pr15422",
          "vLLM PR #15422 (LoRA: V1 scheduler optimization): before it, the V1 waiting loop "
          "stopped at the first request whose LoRA would exceed `max_loras`, so requests "
          "without a LoRA, or of a LoRA already running, waited behind it; the PR made it a skip "
          "(the request stays at its place and the loop goes on). The edit makes it a stop",
          _edit("schedule._schedule_waiting", f"""
                if {_HELD}:
                    step.state = cadence.note_skipped(step.state, cfg, r)
                    i += 1
                    continue""", f"""
                if {_HELD}:
                    break"""),
          killed_by="LORA2_held_request_is_passed_over", shortest=6),
    _lora("lora_cap_counts_scheduled_running_v0_8_5",
          "vLLM 0.8.5 and 0.8.4 (`Scheduler.schedule`): `scheduled_loras` began from the running "
          "requests scheduled in this step only, so a running request skipped because its "
          "tokens are all in flight (pipeline parallelism, async scheduling) did not count, and a "
          "waiting request of another LoRA was admitted beside it: more than `max_loras` "
          "adapters live in the model runner at once. 0.33/0.34 count every running request "
          "(\"including those not scheduled in this step\"); no issue number was found for the "
          "fix, so the mutant is named for the release. The edit counts the step's entries",
          _edit("schedule._schedule_waiting", _HELD,
                "lora.held_by_lora_cap(step.state, cfg, r, tuple(e.req for e in step.entries))"),
          killed_by="LORA1_loras_within_cap", shortest=4),
    _lora("prompt_logprobs_read_prefix_cache_issue3251",
          "vLLM issue #3251 (and #3914, #13409): a request asking for prompt logprobs with "
          "prefix caching on read its cached prefix, so the logits of the cached positions were "
          "never computed (an error, or fewer prompt logprobs than prompt tokens); V1 skips the "
          "cache read for it (#17251's `get_computed_blocks`, then `skip_reading_prefix_cache`, "
          "0.34's `prefix_cache_hit_limit`). The edit drops the test",
          _edit("schedule._prefix_hit", "not lora.reads_prefix_cache(state, r)", "False"),
          killed_by="PL1_prompt_logprobs_read_no_cache", shortest=3),
)
