"""The Z3 models of LoRA's cap and of the prompt-logprobs limit
(z3/lora_engines.py): the explicit models themselves
(verification/lora_models.py), small enough for the proofs.

* lora-k2 (LORA1, LORA2): vLLM 0.34 sync, K = 2, a cap of one LoRA, three
  one-token prompts (LoRA 1, LoRA 2, none), 4 blocks, no prefix caching;
  294 states, every one cross-checked. A request of the second LoRA is held
  while the first runs (its token in flight or not), and the one without a
  LoRA behind it is admitted past it. Without prefix caching the LoRA's
  part of the block hash (the labels, spec/lora.py) plays no part.
* prompt-logprobs-k2 (PL1): two three-token prompts sharing a cached block,
  the second asking for prompt logprobs, prefix caching on; 52 states.

Every LoRA mutant (verification/mutants/lora.py) is reachable on its model:
BMC finds each at the explicit search's length (tests/test_z3_lora.py).
"""

from __future__ import annotations

from flightcheck.verification.lora_models import LORA_K2, PROMPT_LOGPROBS_K2

LORA_Z3_MODELS = (LORA_K2, PROMPT_LOGPROBS_K2)
