"""Version profiles of the reference (reference/profiles.py): the constants
each vLLM version's source gives, and how a SchedulerConfig picks them up."""

from __future__ import annotations

import pytest

from flightcheck.reference import Request, RequestStatus, SamplingParams, Scheduler, SchedulerConfig
from flightcheck.reference.consistency import consistency_errors, leak_errors
from flightcheck.reference.drive import VLLM_0_8_4_LOOP, loop_for_policy


def test_the_default_profile_is_vllm_0_8_5_continue_prefill_without_preallocation():
    config = SchedulerConfig()
    assert config.profile == "vllm-0.8.5"
    assert config.continue_prefill is True and config.policy == "continue-prefill"
    assert config.num_preallocate_tokens == 0 and config.cache_duplicate_blocks


def test_vllm_0_8_4_is_one_batch_per_request_with_64_tokens_preallocated():
    config = SchedulerConfig(profile="vllm-0.8.4")
    assert config.continue_prefill is False and config.policy == "one-batch-per-request"
    assert config.num_preallocate_tokens == 64
    assert loop_for_policy(config.continue_prefill) is VLLM_0_8_4_LOOP


@pytest.mark.parametrize("profile", ["vllm-0.8.5", "vllm-0.8.4"])
def test_release_order_is_reverse_with_prefix_caching_and_forward_without(profile):
    assert SchedulerConfig(profile=profile, enable_prefix_caching=True).release_order == "reverse"
    assert SchedulerConfig(profile=profile, enable_prefix_caching=False).release_order == "forward"


def test_explicit_knobs_override_the_profile():
    config = SchedulerConfig(profile="vllm-0.8.4", continue_prefill=True, num_preallocate_tokens=0)
    assert config.continue_prefill is True and config.num_preallocate_tokens == 0


def test_an_unknown_profile_or_a_negative_preallocation_is_refused():
    with pytest.raises(ValueError, match="unknown profile"):
        SchedulerConfig(profile="vllm-0.1")
    with pytest.raises(ValueError, match="num_preallocate_tokens"):
        SchedulerConfig(num_preallocate_tokens=-1)


def test_a_vllm_0_8_4_schedule_preallocates_and_an_abort_frees_every_block():
    config = SchedulerConfig(profile="vllm-0.8.4", max_num_batched_tokens=16, max_num_seqs=2,
                             max_model_len=32, block_size=4, num_blocks=12, num_pipeline_stages=2)
    scheduler = Scheduler(config)
    scheduler.add_request(Request("a", list(range(5)), SamplingParams(max_tokens=6)))
    scheduler.add_request(Request("b", list(range(50, 57)), SamplingParams(max_tokens=6)))
    first = scheduler.schedule()
    # a needs 2 blocks and takes 16 more, capped at its 8 blocks (32 / 4);
    # b needs 2 and gets the 4 left.
    assert [len(entry.new_block_ids) for entry in first.entries] == [8, 4]
    assert consistency_errors(scheduler) == []
    scheduler.finish_requests(["a", "b"], RequestStatus.FINISHED_ABORTED)
    assert leak_errors(scheduler) == []
