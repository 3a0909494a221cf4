"""Spacer proves the parameterised model's spec properties with no invariant
given (verification/z3/param/spacer.py), and finds the bug of a mutant instead."""

from __future__ import annotations

import pytest

from flightcheck.spec import Config, Prompt
from flightcheck.verification import models
from flightcheck.verification.z3.param.spacer import spacer_param

# One request, K = 2, spec decode and the long-prefill threshold: small
# enough for the default suite (seconds), large enough that a request has
# two chunks in flight and a sampling entry with drafts.
ONE_K2 = models.Model(
    "one-k2", Config(num_stages=2, max_num_batched_tokens=3, max_num_seqs=2, block_size=2, num_blocks=4,
                     max_model_len=8, prefix_caching=True, num_spec_tokens=1, long_prefill_token_threshold=2),
    (Prompt(3, 3, (7,)),))


def test_spacer_proves_the_accounting_of_one_request_with_no_invariant_given():
    result = spacer_param(ONE_K2, time_budget=300)
    assert result.status == "proved", result
    assert result.num_rules > 0 and "synthesised invariant" in result.message


@pytest.mark.parametrize("mutant", ["rejections_not_subtracted", "advance_at_completion"])
def test_spacer_finds_a_mutants_bug(mutant):
    assert spacer_param(ONE_K2.with_mutant(mutant), time_budget=300).status == "violated"


@pytest.mark.slow
def test_spacer_proves_the_accounting_of_two_requests_with_no_invariant_given():
    # about 80 s here (2-core box, shared)
    assert spacer_param(models.PRESSURE_K2, time_budget=1800).status == "proved"
