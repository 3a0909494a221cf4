"""`flightcheck verify --lora` (spec/lora.py): the exhaustive search of the
profile's LoRA and prompt-logprobs models (verification/lora_models.py),
every property of each (LORA1, LORA2, PL1 among them); under LORA_PROFILE
the LoRA mutants, each on its model; and the Z3 rows
(z3/lora_engines.lora_rows: LORA1 by k-induction, LORA2 and PL1 one step
from its invariant, all three by BMC). Kept beside suite.py (at its size
limit), whose feature suites it follows, as cadence_suite.py is; the verify
command calls `run_lora_suite` where it calls `run_suite`."""

from __future__ import annotations

import time

from flightcheck.verification.lora_models import LORA_K2, LORA_MODELS, PROMPT_LOGPROBS_K2
from flightcheck.verification.mutants.lora import LORA, LORA_PROFILE
from flightcheck.verification.suite import Progress, SuiteOptions, SuiteResult, _explicit_feature_suite, counted_suite


def run_lora_suite(options: SuiteOptions, progress: Progress | None = None) -> SuiteResult:
    """The LoRA suite under `options.profile`, its tasks counted as run_suite counts them."""
    return counted_suite(_lora_suite, options, progress)


# Why `--lora` runs no Z3 engine under a profile the Z3 models do not cover (none of the four today).
LORA_EXPLICIT_ONLY = "the Z3 models of the LoRA cap do not cover this profile: its models are searched exhaustively"


def _lora_suite(options: SuiteOptions, say: Progress) -> SuiteResult:
    """`--lora`: the exhaustive search of the profile's LoRA models; under
    LORA_PROFILE the LoRA mutants, each hunted on its model (the
    prompt-logprobs one on prompt-logprobs-k2, the others on lora-k2);
    unless --no-z3, LORA1, LORA2 and PL1 by k-induction and by BMC on the Z3
    models under the profile's synchronous rules."""
    from flightcheck.verification.z3.lora_engines import LORA_ENCODED_PROFILE, lora_rows
    profile = options.profile
    if profile not in LORA_MODELS:
        raise ValueError(f"profile {profile!r} has no LoRA models; known: {', '.join(LORA_MODELS)}")
    mutants = [(m.name, PROMPT_LOGPROBS_K2 if m.name.startswith("prompt_logprobs") else LORA_K2)
               for m in LORA] if profile == LORA_PROFILE else []
    result = _explicit_feature_suite(options, say, "LoRA cap and prompt logprobs", LORA_MODELS[profile], mutants,
                                     LORA_EXPLICIT_ONLY, lora=True)
    if options.use_z3 and profile in LORA_ENCODED_PROFILE:
        say(f"k-induction and bounded model checking of the Z3 LoRA models ({profile})")
        t0 = time.perf_counter()
        result.properties += lora_rows(profile)
        result.seconds += time.perf_counter() - t0
        result.explicit_only = None
    return result
