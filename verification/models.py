"""Model-checking constants, kept apart from the spec (as TLA+ keeps its .cfg
files apart from the module): which requests exist, what they ask for, and
which environment choices the checkers explore.

A `Model` fixes everything a checker needs: the scheduler configuration, one
prompt per request slot (prefix sharing is written as shared labels), and
whether the environment may abort requests or sample stop tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from flightcheck.spec import Config, Prompt


@dataclass(frozen=True)
class Model:
    name: str
    cfg: Config
    prompts: tuple[Prompt, ...]
    allow_abort: bool = True
    allow_stop: bool = True

    @property
    def num_requests(self) -> int:
        return len(self.prompts)

    def with_mutant(self, mutant: str | None) -> "Model":
        return replace(self, cfg=replace(self.cfg, mutant=mutant))

    def describe(self) -> str:
        c = self.cfg
        feats = [f"K={c.num_stages}", f"N={self.num_requests}", f"budget={c.max_num_batched_tokens}",
                 f"blocks={c.num_blocks}x{c.block_size}", f"max_len={c.max_model_len}",
                 f"seqs={c.max_num_seqs}"]
        if c.prefix_caching:
            feats.append("prefix-caching")
        if c.num_spec_tokens:
            feats.append(f"spec-decode k={c.num_spec_tokens}")
        if c.long_prefill_token_threshold:
            feats.append(f"threshold={c.long_prefill_token_threshold}")
        feats.append("continue-prefill" if c.continue_prefill else "one-batch-per-request")
        if self.allow_abort:
            feats.append("aborts")
        return " ".join(feats)


def _p(prompt_len: int, max_tokens: int, labels: tuple[int, ...] = ()) -> Prompt:
    return Prompt(prompt_len, max_tokens, labels)


# Small configurations for exhaustive search: every state is visited.
TINY = Model(
    "tiny",
    Config(num_stages=2, max_num_batched_tokens=3, max_num_seqs=2, block_size=2,
           num_blocks=3, max_model_len=8, prefix_caching=True),
    (_p(3, 2, (7,)), _p(2, 1, (7,))),
)

SMALL_SPEC = Model(
    "small-spec",
    Config(num_stages=2, max_num_batched_tokens=3, max_num_seqs=2, block_size=2,
           num_blocks=4, max_model_len=8, prefix_caching=True, num_spec_tokens=1),
    (_p(3, 3, (7,)), _p(2, 2, (7,))),
)

SMALL_K3 = Model(
    "small-k3",
    Config(num_stages=3, max_num_batched_tokens=2, max_num_seqs=2, block_size=2,
           num_blocks=3, max_model_len=8, prefix_caching=True),
    (_p(3, 2, (7,)), _p(3, 1, (7,))),
)

ONE_BATCH = Model(
    "one-batch",
    Config(num_stages=2, max_num_batched_tokens=3, max_num_seqs=2, block_size=2,
           num_blocks=3, max_model_len=8, prefix_caching=True, continue_prefill=False),
    (_p(3, 2, (7,)), _p(2, 1, (7,))),
)

EXHAUSTIVE_MODELS: tuple[Model, ...] = (TINY, SMALL_SPEC, SMALL_K3, ONE_BATCH)

# The default configuration of `flightcheck verify`: 3 requests, K = 3, prefix
# caching and spec decode on (proved by k-induction; too large to enumerate).
DEFAULT = Model(
    "default",
    Config(num_stages=3, max_num_batched_tokens=4, max_num_seqs=3, block_size=2,
           num_blocks=6, max_model_len=10, prefix_caching=True, num_spec_tokens=2,
           long_prefill_token_threshold=3),
    (_p(4, 3, (5, 6)), _p(3, 2, (5,)), _p(5, 2, (8, 9))),
)
