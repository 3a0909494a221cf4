"""Model-checking constants, kept apart from the spec (as TLA+ keeps its .cfg
files apart from the module): which requests exist, what they ask for, and
which environment choices the checkers explore.

A `Model` fixes everything a checker needs: the scheduler configuration, one
prompt per request slot (prefix sharing is written as shared labels),
whether the environment may abort requests or sample stop tokens, and which
mutant of the spec (verification/mutants/) it checks, None for the correct one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from flightcheck.spec import Config, Prompt
from flightcheck.spec.blocks import cdiv
from flightcheck.spec.profiles import PROFILES
from flightcheck.verification.mutants import mutant as registered_mutant


@dataclass(frozen=True)
class Model:
    name: str
    cfg: Config
    prompts: tuple[Prompt, ...]
    allow_abort: bool = True
    allow_stop: bool = True
    mutant: str | None = None      # a name in verification/mutants; None is the correct spec
    # With a KV connector: whether the environment may make loads fail
    # (`FailKvLoad`; receives and sends are always explored).
    kv_failures: bool = False
    # "Sometimes" targets of every profile this model is too small to reach
    # (a connector model, sized for its feature; the profile's own models
    # reach them); each still applies to every other model.
    skip_targets: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        """Labels behave like vLLM's chained block hashes: distinct within a
        prompt, and two prompts share a label only with the whole prefix
        before it (so a shared label is a shared prefix, at the same block).

        A prompt the spec's `arrive` would refuse (a request that could never
        arrive), or one whose request can outgrow the whole pool (which
        deadlocks the correct spec, and which vLLM refuses at start-up), is
        an error here rather than a model that silently checks less."""
        if self.mutant is not None:
            registered_mutant(self.mutant)          # ValueError for a name not in the registry
        cfg = self.cfg
        for r, p in enumerate(self.prompts):
            if not 1 <= p.prompt_len < cfg.max_model_len or p.max_tokens < 1:
                raise ValueError(f"model {self.name}: request {r} needs 1 <= prompt_len < max_model_len "
                                 f"({cfg.max_model_len}) and max_tokens >= 1, got {p.prompt_len}, {p.max_tokens}")
            full_blocks = p.prompt_len // cfg.block_size
            if cfg.prefix_caching and len(p.labels) != full_blocks:
                raise ValueError(f"model {self.name}: request {r} has {p.prompt_len} prompt tokens, so "
                                 f"{full_blocks} full block(s) of {cfg.block_size}, but labels {p.labels}")
            # KV slots at the last decode: every token but the last output, plus its drafts
            drafts = cfg.num_spec_tokens if p.max_tokens > 1 else 0
            most_tokens = min(p.prompt_len + p.max_tokens - 1 + drafts, cfg.max_model_len)
            if cdiv(most_tokens, cfg.block_size) > cfg.num_blocks:
                raise ValueError(f"model {self.name}: request {r} can hold {most_tokens} tokens, more than "
                                 f"{cfg.num_blocks} blocks of {cfg.block_size}")
            if len(set(p.labels)) != len(p.labels):
                raise ValueError(f"model {self.name}: repeated block label in {p.labels}")
        for p in self.prompts:
            for q in self.prompts:
                for i, lab in enumerate(p.labels):
                    if lab in q.labels and q.labels[:q.labels.index(lab) + 1] != p.labels[:i + 1]:
                        raise ValueError(f"model {self.name}: label {lab} has different prefixes "
                                         f"in {p.labels} and {q.labels}")

    @property
    def num_requests(self) -> int:
        return len(self.prompts)

    @property
    def shares_prefix(self) -> bool:
        """Two prompts share a block label (so two blocks may compute one content)."""
        seen: set[int] = set()
        for p in self.prompts:
            if seen & set(p.labels):
                return True
            seen |= set(p.labels)
        return False

    def under_profile(self, profile: str) -> "Model":
        """This model under another version profile: the profile's block
        constants (release order, preallocation, duplicate caching); the
        policy stays the model's own, since a model is sized for the policy
        its behaviours need."""
        cfg = replace(self.cfg, profile=profile, release_order=None, num_preallocate_tokens=None,
                      cache_duplicate_blocks=None)
        return replace(self, cfg=cfg)

    def with_mutant(self, mutant: str | None) -> "Model":
        return replace(self, mutant=mutant)

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
        feats.append(f"profile={c.profile}")
        if c.release_order != "reverse":
            feats.append(f"release={c.release_order}")
        if c.num_preallocate_tokens:
            feats.append(f"preallocate={c.num_preallocate_tokens}")
        if self.allow_abort:
            feats.append("aborts")
        if c.rules.stale_output_counters and c.stale_mode != "deliver":
            feats.append(f"stale-mode={c.stale_mode}")
        if c.allow_name_reuse:
            feats.append("name-reuse")
        if not c.enable_chunked_prefill:
            feats.append("chunked-prefill-off")
        if c.kv_connector is not None:
            kv = c.kv_connector
            roles = "+".join(role for role, on in (("consumer", kv.consumer), ("producer", kv.producer)) if on)
            feats.append(f"kv-connector={roles}:{kv.load_failure_policy}"
                         + (f":max-loads={kv.max_inflight_loads}" if kv.max_inflight_loads is not None else "")
                         + (":failures" if self.kv_failures else ""))
        if c.cache_aware_admission_window:
            feats.append(f"cache-aware-window={c.cache_aware_admission_window}"
                         f"@{c.cache_aware_admission_threshold}")
        return " ".join(feats)


def _under(model: Model, profile: str) -> Model:
    """`model` under `profile`, renamed after it (vllm-0.34's copy of a 0.33 model: "deferred-k3@vllm-0.34";
    a copy of a copy after its base model: "deferred-k3@vllm-0.34-invalid-kv-fixed")."""
    return replace(model.under_profile(profile), name=f"{model.name.split('@')[0]}@{profile}")


def _p(prompt_len: int, max_tokens: int, labels: tuple[int, ...] = ()) -> Prompt:
    return Prompt(prompt_len, max_tokens, labels)


# Small configurations for exhaustive search: every reachable state is visited.
# Each is sized so that every "sometimes" target is reachable in it.
PRESSURE_K2 = Model(
    "pressure-k2",   # spec decode, long-prefill threshold, a pool small enough to preempt
    Config(num_stages=2, max_num_batched_tokens=3, max_num_seqs=2, block_size=2,
           num_blocks=4, max_model_len=8, prefix_caching=True, num_spec_tokens=1,
           long_prefill_token_threshold=2),
    (_p(1, 4), _p(3, 3, (7,))),
)

SHARED_K3 = Model(
    "shared-k3",     # three requests sharing a prefix label, three stages
    Config(num_stages=3, max_num_batched_tokens=3, max_num_seqs=2, block_size=2,
           num_blocks=4, max_model_len=8, prefix_caching=True, num_spec_tokens=1,
           long_prefill_token_threshold=2),
    (_p(3, 2, (7,)), _p(3, 2, (7,)), _p(2, 1, (7,))),
)

ONE_BATCH = Model(
    "one-batch",     # before the PR: one in-flight batch per request, 0.8.4's engine gate
    Config(num_stages=2, max_num_batched_tokens=3, max_num_seqs=2, block_size=2,
           num_blocks=3, max_model_len=8, prefix_caching=True, continue_prefill=False),
    (_p(1, 4), _p(3, 2, (7,))),
)

SINGLE_SEQ = Model(
    "single-seq",    # max_num_seqs = 1: admission must wait for a slot
    Config(num_stages=2, max_num_batched_tokens=3, max_num_seqs=1, block_size=2,
           num_blocks=3, max_model_len=8, prefix_caching=True),
    (_p(1, 2), _p(2, 1, (7,))),
)

CROWDED = Model(
    "crowded",       # a third request waits behind a preemption victim
    Config(num_stages=2, max_num_batched_tokens=3, max_num_seqs=3, block_size=2,
           num_blocks=3, max_model_len=8, prefix_caching=True),
    (_p(1, 3), _p(3, 3, (7,)), _p(1, 1)),
    allow_abort=False,
)

TIGHT_K2 = Model(
    "tight-k2",      # pressure-k2 with one block and two tokens of model length less
    Config(num_stages=2, max_num_batched_tokens=3, max_num_seqs=2, block_size=2,
           num_blocks=3, max_model_len=6, prefix_caching=True, num_spec_tokens=1,
           long_prefill_token_threshold=2),
    (_p(1, 3), _p(3, 2, (7,))),
)

CROWDED_CHUNKED = Model(
    "crowded-chunked",   # crowded with the long-prefill threshold: the victim is preempted three steps sooner
    Config(num_stages=2, max_num_batched_tokens=3, max_num_seqs=3, block_size=2,
           num_blocks=3, max_model_len=6, prefix_caching=True, long_prefill_token_threshold=2),
    (_p(1, 3), _p(3, 2, (7,)), _p(1, 1)),
    allow_abort=False,
)

PREEMPT_DRAFTS = Model(
    "preempt-drafts",    # a request preempted with a draft-carrying decode in flight (four blocks,
                         # nine steps); no prefix caching and no aborts, which it needs neither of
    Config(num_stages=2, max_num_batched_tokens=3, max_num_seqs=2, block_size=2,
           num_blocks=4, max_model_len=5, prefix_caching=False, num_spec_tokens=1,
           long_prefill_token_threshold=2),
    (_p(1, 3), _p(3, 3)),
    allow_abort=False,
)

# The profiles' own models: 3 requests, K = 3 each, so every invariant of a
# profile's table is proved where pipelining, preemption and the profile's
# block rules meet.
FORWARD_K3 = Model(
    "forward-k3",    # vLLM 0.8.5 without prefix caching: freed tables join the free queue in table order
    Config(num_stages=3, max_num_batched_tokens=3, max_num_seqs=3, block_size=2,
           num_blocks=3, max_model_len=6, prefix_caching=False),
    (_p(3, 2), _p(1, 2), _p(2, 1)),
)

PREALLOCATE_K3 = Model(
    "preallocate-k3",  # vLLM 0.8.4: one batch per request, 64 tokens preallocated, a shared prefix
    Config(num_stages=3, max_num_batched_tokens=3, max_num_seqs=2, block_size=2,
           num_blocks=4, max_model_len=6, prefix_caching=True, profile="vllm-0.8.4"),
    (_p(3, 2, (7,)), _p(2, 2, (7,)), _p(1, 3)),
)

DEFERRED_K3 = Model(
    "deferred-k3",   # vLLM 0.33 (sync): a shared prefix, the long-prefill threshold, a pool of 4 blocks:
                     # preemption with batches in flight, a deferred resumption, unhashed blocks reused first
    Config(num_stages=3, max_num_batched_tokens=3, max_num_seqs=3, block_size=2,
           num_blocks=4, max_model_len=6, prefix_caching=True, long_prefill_token_threshold=2,
           profile="vllm-0.33"),
    (_p(3, 2, (7,)), _p(2, 2, (7,)), _p(1, 2)),
)

# The admission knobs that tell 0.33 and 0.34 apart (explicit search only:
# the Z3 encoding admits with chunked prefill on, in FCFS order). With
# chunked prefill off, a 4-token prompt leaves 2 of the 6-token budget, too
# few for the second prompt's 3: vLLM 0.34 stops the waiting loop there,
# 0.33 still cuts that prompt to the threshold's 2 and admits it.
UNCHUNKED_K2 = Model(
    "unchunked-k2",
    Config(num_stages=2, max_num_batched_tokens=6, max_num_seqs=2, block_size=2,
           num_blocks=4, max_model_len=6, prefix_caching=False, long_prefill_token_threshold=2,
           enable_chunked_prefill=False, profile="vllm-0.34"),
    (_p(4, 2), _p(3, 2)),
    allow_abort=False,
)
# vLLM 0.34's cache-aware admission order, on at any usage (threshold 0):
# one seat, a prompt that caches a block and two that wait for the seat, one
# with that block and one without.
CACHE_AWARE_K2 = Model(
    "cache-aware-k2",
    Config(num_stages=2, max_num_batched_tokens=4, max_num_seqs=1, block_size=2,
           num_blocks=4, max_model_len=6, prefix_caching=True, cache_aware_admission_window=2,
           cache_aware_admission_threshold=0.0, profile="vllm-0.34"),
    (_p(3, 1, (7,)), _p(2, 1, (9,)), _p(3, 1, (7,))),
    allow_abort=False,
)
ADMISSION_MODELS: tuple[Model, ...] = (UNCHUNKED_K2, CACHE_AWARE_K2)

# vLLM 0.33 with request names reused (`Config.allow_name_reuse`: a new
# request may arrive under a finished one's name while its batches are in
# flight, as with request-id randomization off): the smallest model found in
# which the spec shows all three effects of docs/vllm-semantics.md §"vLLM 0.33: stale output, counters and reused ids" -- the old batch's
# token bound to the new incarnation (S7'), its counter driven below 0 (IF1,
# IF2), and the new incarnation, preempted with a negative stale count,
# never resumed while the engine spins on empty batches (a lasso, L4). Three
# requests, K = 2, 3 blocks; no prefix caching, spec decode or stop tokens,
# which the bug needs none of. `flightcheck verify --profile vllm-0.33
# --allow-name-reuse` searches it.
REUSE_K2 = Model(
    "reuse-k2",
    Config(num_stages=2, max_num_batched_tokens=2, max_num_seqs=2, block_size=2, num_blocks=3,
           max_model_len=6, prefix_caching=False, profile="vllm-0.33", allow_name_reuse=True),
    (_p(2, 1), _p(1, 3), _p(2, 2)),
    allow_stop=False,
)
# The hardened 0.33 variant (`vllm-0.33-hardened`: stale count tested `> 0`,
# in-flight counter floored at 0) with names reused: the smallest model found
# in which a reused name drives a stale count below 0 -- K = 3, so the new
# incarnation is preempted (by its own next prefill chunk, the pool
# over-committed by two full-sequence admissions) while the old
# incarnation's 3-token batch is still in flight, and that batch drains its
# 1-token stale count to -2. Budget 4 and threshold 3, so the old prompt goes
# out whole beside a 5-token prompt's first chunk. The hardened base keeps
# every liveness property and IF0 here; its guards' mutants break them.
REUSE_K3 = Model(
    "reuse-k3",
    Config(num_stages=3, max_num_batched_tokens=4, max_num_seqs=2, block_size=2, num_blocks=4,
           max_model_len=6, prefix_caching=False, long_prefill_token_threshold=3,
           profile="vllm-0.33-hardened", allow_name_reuse=True),
    (_p(3, 1), _p(5, 1), _p(3, 2)),
    allow_stop=False,
)
# The models `--allow-name-reuse` searches instead of the profile's own.
# Under async scheduling (vllm-0.33-async), names reused: the same bug, and
# the old incarnation's placeholders' outputs settled against the new one
# (IA1, IA2). Three requests, K = 2 (queue depth 3, stagger 2).
REUSE_ASYNC_K2 = Model(
    "reuse-async-k2",
    Config(num_stages=2, max_num_batched_tokens=2, max_num_seqs=2, block_size=2, num_blocks=3,
           max_model_len=6, prefix_caching=False, profile="vllm-0.33-async", allow_name_reuse=True),
    (_p(2, 1), _p(1, 2), _p(2, 1)),
    allow_stop=False,
)
NAME_REUSE_MODELS: dict[str, tuple[Model, ...]] = {"vllm-0.33": (REUSE_K2,), "vllm-0.33-async": (REUSE_ASYNC_K2,),
                                                   "vllm-0.33-hardened": (REUSE_K3,)}
# The mutants a profile hunts only with names reused (its guards against a
# reused name never bind while names are unique), and the model each is
# hunted on: one of NAME_REUSE_MODELS[profile], whose correct search says
# which properties the base keeps (the only ones that count as kills).
NAME_REUSE_MUTANT_MODELS: dict[str, dict[str, Model]] = {
    "vllm-0.33-hardened": {"stale_tested_by_truthiness": REUSE_K3, "in_flight_below_zero": REUSE_K3},
}

# vLLM 0.33's stale output, small: K = 3, so a request preempted with two
# prefill chunks in flight (of 2 and 1 tokens) still has stale output in
# flight when a seat frees up; where the counter mutants are hunted (the drop
# mode one in drop mode).
STALE_K3 = Model(
    "stale-k3",
    Config(num_stages=3, max_num_batched_tokens=2, max_num_seqs=2, block_size=2, num_blocks=3,
           max_model_len=6, prefix_caching=False, profile="vllm-0.33"),
    (_p(1, 3), _p(3, 2)),
    allow_stop=False,
)
STALE_K3_DROP = replace(STALE_K3, name="stale-k3-drop", cfg=replace(STALE_K3.cfg, stale_mode="drop"))

# vLLM 0.33 with asynchronous scheduling (profile vllm-0.33-async: a queue
# of K + 1 batches, output placeholders, decodes K schedule() calls apart).
# ASYNC_K3: three requests, K = 3 (queue depth 4, stagger 3), a pool of two
# blocks: a decode scheduled behind its request's decode in flight, preemption
# with placeholders in flight, a deferred resumption, a stop with a decode
# still in flight (its output dropped).
ASYNC_K3 = Model(
    "async-k3",
    Config(num_stages=3, max_num_batched_tokens=2, max_num_seqs=2, block_size=2, num_blocks=2,
           max_model_len=5, prefix_caching=False, profile="vllm-0.33-async"),
    (_p(1, 3), _p(2, 1), _p(1, 1)),
)
# ASYNC_DRAFTS_K2: spec decode (k = 1) and prefix caching under async, K = 2:
# placeholders with drafts, rejections settled, blocks hashed on output.
ASYNC_DRAFTS_K2 = Model(
    "async-drafts-k2",
    Config(num_stages=2, max_num_batched_tokens=2, max_num_seqs=2, block_size=2, num_blocks=4,
           max_model_len=6, prefix_caching=True, num_spec_tokens=1, profile="vllm-0.33-async"),
    (_p(2, 3, (7,)), _p(3, 2, (7,))),
    allow_abort=False,
)
# ASYNC_DROP_K2: drop mode (a preempted request resumed at once, its stale
# output discarded) with spec decode, K = 2.
ASYNC_DROP_K2 = Model(
    "async-drop-k2",
    Config(num_stages=2, max_num_batched_tokens=2, max_num_seqs=2, block_size=2, num_blocks=3,
           max_model_len=6, prefix_caching=False, num_spec_tokens=1, stale_mode="drop",
           profile="vllm-0.33-async"),
    (_p(1, 3), _p(2, 2)),
)

# Each profile's exhaustive models; the default profile's are the default run's.
PROFILE_MODELS: dict[str, tuple[Model, ...]] = {
    "vllm-0.8.5": (PRESSURE_K2, SHARED_K3, ONE_BATCH, FORWARD_K3),
    "vllm-0.8.4": (PREALLOCATE_K3,),
    "vllm-0.33": (DEFERRED_K3,),
    "vllm-0.33-async": (ASYNC_K3, ASYNC_DRAFTS_K2, ASYNC_DROP_K2),
    "vllm-0.33-hardened": (replace(DEFERRED_K3.under_profile("vllm-0.33-hardened"), name="deferred-k3-hardened"),),
}
EXHAUSTIVE_MODELS: tuple[Model, ...] = PROFILE_MODELS["vllm-0.8.5"]

# The default configuration of `flightcheck verify`: 3 requests, K = 3, prefix
# caching and spec decode on (proved by k-induction; too large to enumerate).
DEFAULT = Model(
    "default",
    Config(num_stages=3, max_num_batched_tokens=4, max_num_seqs=3, block_size=2,
           num_blocks=6, max_model_len=10, prefix_caching=True, num_spec_tokens=2,
           long_prefill_token_threshold=3),
    (_p(4, 3, (5, 6)), _p(3, 2, (5,)), _p(5, 2, (8, 9))),
)

# The vLLM engine test (docs/vllm-semantics.md §"vLLM's own tests the project replays"): two 12-token prompts, budget 10, K = 2.
ENGINE_TEST = Model(
    "engine-test",
    Config(num_stages=2, max_num_batched_tokens=10, max_num_seqs=2, block_size=4,
           num_blocks=16, max_model_len=64, prefix_caching=False),
    (_p(12, 5), _p(12, 5)),
    allow_abort=False, allow_stop=False,
)

# Eight requests, K = 8, every feature on, for the k-induction proof at scale
# (too large to enumerate or to unroll far): the smallest pool and budget that
# keep every feature (3 blocks, so preemption; budget 2, so chunked prefill).
NARROW_8X8 = Model(
    "narrow-8x8",
    Config(num_stages=8, max_num_batched_tokens=2, max_num_seqs=2, block_size=2, num_blocks=3,
           max_model_len=5, prefix_caching=True, num_spec_tokens=1, long_prefill_token_threshold=1),
    tuple(_p(2, 2, (5,)) if r % 2 else _p(1, 2) for r in range(8)),
)

# The same with a roomier pool and budget (10 blocks, budget 6, four sequences).
WIDE_8X8 = Model(
    "wide-8x8",
    Config(num_stages=8, max_num_batched_tokens=6, max_num_seqs=4, block_size=2, num_blocks=10,
           max_model_len=8, prefix_caching=True, num_spec_tokens=1, long_prefill_token_threshold=3),
    tuple(_p(3, 2, (5,)) if r % 2 else _p(2, 2, (5,)) for r in range(8)),
)

PROOF_MODELS: dict[str, Model] = {m.name: m for m in (NARROW_8X8, WIDE_8X8)}

MODELS: dict[str, Model] = {m.name: m for m in
                            (DEFAULT, PRESSURE_K2, SHARED_K3, ONE_BATCH, SINGLE_SEQ, CROWDED, TIGHT_K2,
                             CROWDED_CHUNKED, PREEMPT_DRAFTS, ENGINE_TEST, FORWARD_K3, PREALLOCATE_K3)}

# Where each mutant is hunted: the smallest model whose behaviours include its
# bug (tight-k2 unless named here), with only the features the bug needs.
# Smaller models give shorter counterexamples and, for BMC, a smaller circuit
# per step: every mutant's BMC counterexample comes within 60 s here
# (benchmarks/bmc_mutants.py), against 70-121 s for the last three below when
# they were hunted on crowded and pressure-k2.
MUTANT_MODELS: dict[str, Model] = {
    "inflight_set_not_cleared_on_preemption": ONE_BATCH,
    "max_num_seqs_ignored": SINGLE_SEQ,
    "admit_after_preemption": CROWDED_CHUNKED,
    "rejections_subtracted_after_reset": PREEMPT_DRAFTS,
    "preemption_clears_inflight_drafts": PREEMPT_DRAFTS,
}


# Under vLLM 0.8.4's preallocation the first request takes every block its
# max_model_len allows, so the models above, sized to the block, never preempt
# there: a mutant is hunted under 0.8.4 on its model with room for one more
# block (so a preallocation capped by the free blocks can run out), or on the
# model named here.
PROFILE_MUTANT_EXTRA_BLOCKS: dict[str, int] = {"vllm-0.8.5": 0, "vllm-0.8.4": 1, "vllm-0.33": 0,
                                               "vllm-0.33-async": 0,
                                               "vllm-0.33-hardened": 0}
# A request preempted with a draft-carrying decode in flight under 0.8.4: a
# third request is admitted once the first finishes, and the second, whose
# preallocation the pool capped, preempts it for its third block.
PREEMPT_DRAFTS_084 = replace(
    PREEMPT_DRAFTS.under_profile("vllm-0.8.4"), name="preempt-drafts-084",
    cfg=replace(PREEMPT_DRAFTS.under_profile("vllm-0.8.4").cfg, num_blocks=PREEMPT_DRAFTS.cfg.num_blocks + 1),
    prompts=(_p(1, 3), _p(2, 3), _p(1, 3)))
_PROFILE_MUTANT_MODELS_033: dict[str, Model] = {
    # 0.33 clips a running request one token short of max_model_len (the
    # sampled token's slot): one more token of length, so a draft-carrying
    # decode is still in flight when its request is preempted
    **{name: replace(PREEMPT_DRAFTS.under_profile("vllm-0.33"), name="preempt-drafts-033",
                     cfg=replace(PREEMPT_DRAFTS.under_profile("vllm-0.33").cfg, max_model_len=6))
       for name in ("rejections_subtracted_after_reset", "preemption_clears_inflight_drafts")},
    # 0.33's full-sequence admission: one more block, so both requests run at once
    "budget_ignored": replace(TIGHT_K2.under_profile("vllm-0.33"), name="tight-k2-033+1-block",
                              cfg=replace(TIGHT_K2.under_profile("vllm-0.33").cfg, num_blocks=4)),
    # 0.33 applies the threshold only with company, and S10 sees it only in a
    # batch of two entries: a budget of 4 leaves room for a second one
    # vLLM 0.33's counters (the profile's own mutants)
    "resumption_not_deferred": STALE_K3,
    "drop_leaves_counters": STALE_K3_DROP,
    "stale_drained_by_wrong_batch": STALE_K3,
    "in_flight_kept_without_output": STALE_K3,
    "threshold_ignored_on_admission": replace(
        CROWDED_CHUNKED.under_profile("vllm-0.33"), name="crowded-chunked-033",
        cfg=replace(CROWDED_CHUNKED.under_profile("vllm-0.33").cfg, max_num_batched_tokens=4)),
}
PROFILE_MUTANT_MODELS: dict[str, dict[str, Model]] = {
    "vllm-0.8.5": {},
    "vllm-0.33": _PROFILE_MUTANT_MODELS_033,
    "vllm-0.33-async": {
        # the sync 0.33 profile's models for the mutants it hunts on its own models
        **{name: replace(model.under_profile("vllm-0.33-async"), name=f"{model.name}-async")
           for name, model in _PROFILE_MUTANT_MODELS_033.items()},
        # the async profile's own mutants, each on the smallest model that has its bug's behaviour
        "async_rejections_not_settled": ASYNC_DRAFTS_K2,
        "async_placeholders_kept_on_preemption": ASYNC_K3,
        "async_stagger_ignored": ASYNC_K3,
        "async_max_tokens_guard_off_by_one": ASYNC_K3,
        "async_decode_on_stale_placeholder": ASYNC_DROP_K2,
        # deliver mode never resumes a request with orphans in flight (0.33 moots them); drop mode does
        "stale_output_applied_to_resumed": ASYNC_DROP_K2,
        "orphan_kept_after_reschedule": ASYNC_DROP_K2,
    },
    "vllm-0.8.4": {
        # 0.8.4's own counter drift: a third request and two more blocks, so a
        # request whose preallocation was capped is preempted with a batch in flight
        "inflight_set_not_cleared_on_preemption": replace(
            ONE_BATCH.under_profile("vllm-0.8.4"), name="one-batch-084",
            cfg=replace(ONE_BATCH.under_profile("vllm-0.8.4").cfg, num_blocks=ONE_BATCH.cfg.num_blocks + 2),
            prompts=ONE_BATCH.prompts + (_p(1, 2),)),
        "rejections_subtracted_after_reset": PREEMPT_DRAFTS_084,
        "preemption_clears_inflight_drafts": PREEMPT_DRAFTS_084,
        # a second request must be admitted past the first's preallocation
        "max_num_seqs_ignored": replace(
            SINGLE_SEQ.under_profile("vllm-0.8.4"), name="single-seq-084",
            cfg=replace(SINGLE_SEQ.under_profile("vllm-0.8.4").cfg, num_blocks=SINGLE_SEQ.cfg.num_blocks + 2)),
    },
}


# The hardened variant is vLLM 0.33 with unique names: the every-profile
# mutants are hunted on 0.33's models, under the hardened profile.
PROFILE_MUTANT_MODELS["vllm-0.33-hardened"] = {
    name: replace(model.under_profile("vllm-0.33-hardened"), name=f"{model.name}-hardened")
    for name, model in PROFILE_MUTANT_MODELS["vllm-0.33"].items()}


def carry_over(profile: str) -> None:
    """Give `profile` the models of the profile it follows (`Profile.follows`),
    each re-run under it: its exhaustive models, its name-reuse models, and
    the models its mutants are hunted on. A release whose rules are its
    predecessor's with constants changed is checked as deeply as that one."""
    older = PROFILES[profile].follows
    assert older is not None, f"{profile} follows no profile"
    PROFILE_MODELS[profile] = tuple(_under(m, profile) for m in PROFILE_MODELS[older])
    if older in NAME_REUSE_MODELS:
        NAME_REUSE_MODELS[profile] = tuple(_under(m, profile) for m in NAME_REUSE_MODELS[older])
    PROFILE_MUTANT_MODELS[profile] = {name: _under(m, profile) for name, m in PROFILE_MUTANT_MODELS[older].items()}
    PROFILE_MUTANT_EXTRA_BLOCKS[profile] = PROFILE_MUTANT_EXTRA_BLOCKS[older]


for _name, _profile in PROFILES.items():
    if _profile.follows is not None:
        carry_over(_name)


def mutant_model(mutant: str, profile: str = "vllm-0.8.5") -> Model:
    """The model `mutant` is hunted on under `profile`."""
    model = PROFILE_MUTANT_MODELS[profile].get(mutant)
    if model is None:
        base = MUTANT_MODELS.get(mutant, TIGHT_K2)
        model = base if base.cfg.profile == profile else base.under_profile(profile)
        extra = PROFILE_MUTANT_EXTRA_BLOCKS[profile]
        if extra:
            model = replace(model, name=f"{model.name}+{extra}-block",
                            cfg=replace(model.cfg, num_blocks=model.cfg.num_blocks + extra))
    return model.with_mutant(mutant)
