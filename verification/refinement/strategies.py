"""The environment's choices in a refinement run, as Hypothesis strategies:
the configuration (drawn once per program), each arrival's prompt, and what
the model returns for each sampled entry of a completed batch. The machine
(machine.py) draws them as its rules' arguments; nothing here touches the
reference or the spec beyond building a `SchedulerConfig`."""

from __future__ import annotations

from dataclasses import dataclass, fields

from flightcheck.reference import SchedulerConfig
from flightcheck.reference.config import cdiv
from flightcheck.reference.profiles import get_profile
from hypothesis import strategies as st

NUM_SLOTS = 20         # requests per run: enough to crowd a small pool, few enough to shrink
EOS = 1                # the stop token; prompts never contain it, every request stops on it
NEAR_CAP = 4           # arrival lengths drawn past 15 mean max_model_len - 1 - (0..3)
UNKNOWN = -1           # an abort of an id no request ever had


@dataclass(frozen=True)
class Outcome:
    """What the model returns for one sampled entry: EOS or an ordinary token,
    how many of the scheduled drafts were accepted, how many drafts it
    proposes next and which of them (if any) is EOS."""

    eos: bool = False
    accepted: int = 0
    drafts: int = 0
    eos_draft: int | None = None

    def __repr__(self) -> str:
        parts = [f"{f.name}={getattr(self, f.name)!r}" for f in fields(self)
                 if getattr(self, f.name) != f.default]
        return f"Outcome({', '.join(parts)})"


def outcome(code: int) -> Outcome:
    """An outcome from one integer: cheaper to draw than four fields. The
    low digits hold what should vary most: the drafts proposed next, then how
    many were accepted (codes 5-7 of that digit reject every draft, so
    rejections, which spec decode must undo, are common); EOS is rare (1 in
    16), so requests live long enough to be preempted mid-decode.

    Code 0, which Hypothesis draws far more often than any other (it is
    where every integer shrinks to), is an ordinary token with the most
    drafts proposed next (clipped to the configuration's k) and none of the
    scheduled drafts accepted: the case spec decode must undo, not the plain
    token it used to be, with which 58 % of sampled entries proposed no
    draft (29 % now; benchmarks/fuzz_events.py, docs/fuzzing.md "The
    simplest draws")."""
    drafts, accepted = 4 - code % 5, (code // 5) % 8
    eos, eos_draft = (code // 40) % 16 == 15, (code // 640) % 5
    return Outcome(eos, accepted if accepted <= 4 else 0, drafts,
                   None if eos_draft == 0 else eos_draft - 1)


def outcomes() -> st.SearchStrategy[list[Outcome]]:
    """What the model returns for the (at most four) sampled entries of a batch."""
    return st.lists(st.integers(0, 5 * 8 * 16 * 5 - 1).map(outcome), min_size=4, max_size=4)


# The 0.8.x profiles, the machine's default first (`configs` draws under
# FUZZED_PROFILES[0] unless told otherwise). The default fuzz run drives
# every profile the reference models, these and the 0.33 ones: fuzz.py's
# DEFAULT_RUN_PROFILES gives each a share of the run's steps.
FUZZED_PROFILES: tuple[str, ...] = ("vllm-0.8.5", "vllm-0.8.4")


@st.composite
def configs(draw, profile: str = FUZZED_PROFILES[0]) -> SchedulerConfig:
    """Small, valid configurations: every request fits in the pool alone (the
    spec's liveness assumption, the reference's validation), with few blocks
    to spare so that preemption happens. A pipeline and a second sequence
    slot are the common case (most bugs need a batch in flight while another
    request moves), so K = 1 and max_num_seqs = 1 come last (shrink away) and
    K = 2, two sequences, come twice; spec decode is on unless shrunk away,
    the prefill threshold on one time in two (chunked prefills put entries
    that sample nothing before entries that sample, where a walk over a
    batch's outputs must go on past the former), and then 1 twice as often
    as any other value (a threshold of 1 clips a decode with drafts to its
    known token: the boundary where no draft is scheduled; measured: drawn
    uniformly instead, median steps to kill rose for three of four mutants,
    docs/fuzzing.md).

    All under the version `profile`, which draws nothing (so the default
    profile's programs are exactly those from before profiles were fuzzed);
    the scheduling policy is drawn on its own, so both policies run under
    each profile. Under a profile that preallocates, half the configurations
    preallocate a few blocks' worth instead of the profile's 64 tokens."""
    block_size = draw(st.integers(1, 4))
    max_model_len = draw(st.integers(8, 16) | st.integers(2, 16))
    # The budget counts down from 16: Hypothesis draws an integer's lower
    # bound far more often than any other value, and a budget of 1 clips
    # every decode to its known token (no draft is ever scheduled) and every
    # prefill to one token a batch; the whole range is still drawn.
    budget = 17 - draw(st.integers(1, 16))
    preallocate = None                     # the profile's own
    if get_profile(profile).num_preallocate_tokens and draw(st.booleans()):
        # 0.8.4's 64 tokens are more blocks than these pools hold, so every
        # allocation takes the cap (and one request the whole free pool); a
        # few blocks' worth (not a whole number of them, at times) makes the
        # preallocation itself what is taken, with room left for others.
        preallocate = draw(st.integers(1, 3 * block_size))
    return SchedulerConfig(
        max_num_batched_tokens=budget, max_num_seqs=draw(st.sampled_from([2, 3, 2, 4, 1])),
        max_model_len=max_model_len, block_size=block_size,
        num_blocks=cdiv(max_model_len, block_size) + draw(st.integers(0, 1)),
        num_pipeline_stages=draw(st.sampled_from([2, 3, 2, 4, 1])),
        long_prefill_token_threshold=(draw(st.integers(0, 8).map(lambda t: max(1, t)))
                                      if draw(st.integers(0, 3)) >= 2 else 0),
        num_spec_tokens=draw(st.sampled_from([3, 2, 3, 1, 0])),
        enable_prefix_caching=draw(st.booleans()),
        continue_prefill=(draw(st.integers(0, 2).map(lambda x: x != 2))
                          if not get_profile(profile).stale_output_counters else None),
        profile=profile, num_preallocate_tokens=preallocate,
        # vLLM 0.33's drop mode one configuration in three (deliver is its default)
        drop_stale_output=(get_profile(profile).stale_output_counters
                           and draw(st.integers(0, 2)) == 2))


def prompt_tokens(slot: int, family: int, shared: int, length: int) -> list[int]:
    """`shared` leading tokens common to every prompt of `family` (prefix
    hits), the rest unique to the slot; never EOS, always below output tokens."""
    return [100 + family * 1000 + p if p < shared else 10_000 + slot * 1000 + p
            for p in range(length)]
