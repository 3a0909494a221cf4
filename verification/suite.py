"""The verification suite `flightcheck verify` runs: every property by every
method that applies, and every mutant hunted to its shortest counterexample.

Methods:
* exhaustive: explicit-state search of a small model; for a finite model,
  visiting every reachable state proves an invariant for all depths;
* k-induction (Z3): the invariants with strengthening invariants are
  inductive, so they hold for all depths of the default model;
* 1-induction with an inferred invariant (Z3, `inferred=True` only: some
  minutes): the same, with no hand-written strengthening (verification/z3/induction/inferred.py);
* parameterised k-induction (Z3): the accounting invariants for any number
  of requests, with the KV pool and the policy over-approximated
  (verification/z3/param/model.py);
* bmc (Z3): bounded model checking to a depth, shortest-first; for
  "sometimes" targets, the depth at which they are first reached.

Each run is under one version profile (spec/profiles.py): its exhaustive
models are the profile's (`PROFILE_MODELS`), and every mutant is hunted with
the profile's block constants (`mutant_model(name, profile)`). The Z3 rows
come from the encoding of the profiles it covers (`Z3_PROFILES`).

A mutant (verification/mutants: a small edit of spec functions that puts a
bug in, their code swapped for the edited code while it is hunted)
is killed when some safety or liveness property is violated on the model it
is hunted in, searched with the mutant applied; "sometimes" targets that go
unreached do not count as kills, since a mutant that only makes the spec do
less proves nothing.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from typing import Callable, Sequence

from flightcheck.spec.profiles import DEFAULT_PROFILE, PROFILES
from flightcheck.verification import executors
from flightcheck.verification.explicit_rows import (MutantResult, all_property_names, exhaustive_rows,  # noqa: F401
                                                    hunt_mutant, hunt_mutant_against_base)
from flightcheck.verification.kv_models import KV_INVALID_MODELS, KV_MUTANT_MODELS, KV_PROFILE_MODELS
from flightcheck.verification.reset_pause_models import RESET_PAUSE_MODELS, reset_pause_mutant_model
from flightcheck.verification.session_models import SESSION_MUTANT_MODELS, SESSION_PROFILE, SESSION_PROFILE_MODELS
from flightcheck.verification.models import (
    NAME_REUSE_MODELS,
    NAME_REUSE_MUTANT_MODELS,
    PROFILE_MODELS,
    SHARED_K3,
    Model,
)
from flightcheck.verification.mutants import mutants_of
from flightcheck.verification.mutants.registry import RESET_PAUSE_MUTANTS
from flightcheck.verification.results import SOMETIMES_NAMES, PropertyResult  # noqa: F401 (re-exported)
from flightcheck.verification.traces.counterexample import Counterexample, to_json

# `flightcheck verify`'s Z3 model: 3 requests, K = 3, prefix caching, spec
# decode, long-prefill threshold, aborts and stop tokens; BMC's default depth.
VERIFY_MODEL = SHARED_K3
VERIFY_DEPTH = 4
# The profiles the Z3 encoding models (z3/profiles.py ENCODED_PROFILES, kept
# equal by a test); under another profile the Z3 engines would prove the
# default profile's rules, so they are not run there. The default profile
# runs every engine; another encoded one k-induction and BMC of the verify
# model under it (`z3_suite.profile_rows`).
# vllm-0.33-async among them since its auxiliary invariants (A12, A6's async
# form: z3.induction.strengthening) made its k-induction go through.
Z3_PROFILES: frozenset[str] = frozenset({DEFAULT_PROFILE, "vllm-0.8.4", "vllm-0.33", "vllm-0.33-hardened",
                                         "vllm-0.33-async", "vllm-0.34", "vllm-0.34-async",
                                         "vllm-0.34-invalid-kv-fixed", "vllm-0.34-unwritten-kv-fixed"})
# Profiles `verify` runs no Z3 engine under, with why (encoded or not): it
# proves their properties by exhaustive search of their models alone, and
# says so. None today; kept for a profile whose encoding or proof lags.
EXPLICIT_ONLY_PROFILES: dict[str, str] = {}
# Mutants a profile's rules make equivalent to the correct spec, with why:
# not hunted under that profile, and listed as such in its report.
MOOT_MUTANTS: dict[str, dict[str, str]] = {
    "vllm-0.33": {
        name: ("replaces schedule._supersede_orphans, which vLLM 0.33's deferred resumption "
               "(Profile.defer_resume_while_stale) only ever calls on a request without orphans")
        for name in ("stale_output_applied_to_resumed", "orphan_kept_after_reschedule")}
    | {"empty_batch_submitted": ("replaces schedule._launch to queue an empty batch for a step that only "
                                 "preempted, which is what vLLM 0.33's engine does (Profile.empty_batches)")},
}
# Async scheduling keeps 0.33's empty batches and lifts the sync decode gate
# itself; the two mutants of `_supersede_orphans` are hunted there in drop
# mode (async-drop-k2), where a resumption does supersede orphans.
MOOT_MUTANTS["vllm-0.33-async"] = {
    "empty_batch_submitted": MOOT_MUTANTS["vllm-0.33"]["empty_batch_submitted"],
    "decode_while_token_in_flight": (
        "replaces schedule._num_new_running to schedule a decode whose token is still in flight, which "
        "async scheduling does by design (num_new_tokens counts the output placeholders); the one case "
        "it adds, a decode at position max_model_len - 1 that 0.33's sampled-token clip refuses (and "
        "0.8.x schedules), breaks no property of the profile: S2 bounds entries by max_model_len"),
    "draft_cap_ignored": (
        "edits actions.max_next_drafts, the most drafts a completion proposes; under async scheduling "
        "a completion proposes none (AsyncScheduler._update_after_schedule leaves k placeholder drafts "
        "after every sampling entry: Profile.draft_source, spec/drafts.py), so the edit changes nothing")}
# The hardened 0.33 variant has 0.33's rules, so 0.33's equivalent mutants,
# and its two guards against a reused name, which never bind while names are
# unique: their mutants are hunted with names reused (`--allow-name-reuse`,
# NAME_REUSE_MUTANT_MODELS).
MOOT_MUTANTS["vllm-0.33-hardened"] = MOOT_MUTANTS["vllm-0.33"] | {
    "stale_tested_by_truthiness": ("replaces schedule._has_positive_stale_output with vLLM 0.33's truthiness "
                                   "test, which differs from > 0 only on a negative stale count: never, while "
                                   "names are unique (IF2); hunted with --allow-name-reuse"),
    "in_flight_below_zero": ("replaces actions._floor_in_flight with no floor, which never binds while names "
                             "are unique (IF1: the counter is the request's own tokens in flight); hunted "
                             "with --allow-name-reuse"),
}
# A profile that follows another (`Profile.follows`) shares its moot mutants.
for _name, _profile in PROFILES.items():
    if _profile.follows is not None:
        MOOT_MUTANTS[_name] = MOOT_MUTANTS[_profile.follows]


@dataclass
class SuiteResult:
    seconds: float
    properties: list[PropertyResult]
    mutants: list[MutantResult]
    profile: str = DEFAULT_PROFILE
    moot: dict[str, str] = field(default_factory=dict)   # mutant -> why the profile makes it equivalent
    # the shortest counterexample of each violated property (name reuse)
    counterexamples: list[Counterexample] = field(default_factory=list)
    allow_name_reuse: bool = False
    explicit_only: str | None = None      # why Z3 is not run under this profile, if it is not
    kv_connector: bool = False            # the KV connector's models (`--kv-connector`)
    streaming_sessions: bool = False      # the streaming sessions' models (`--streaming-sessions`)
    executor: str = "local"               # where its tasks ran (verification/executors)
    tasks: int = 0                        # how many tasks it ran there (none: all in this process)
    retried: int = 0                      # tasks run again after their worker was lost
    reset_pause: bool = False             # reset and pause's models (`--reset-pause`)
    structured_output: bool = False       # structured output's models (`--structured-output`)
    priority: bool = False                # the priority policy's models (`--priority`)
    prefill_cadence: bool = False         # the prefill cadence's models (`--prefill-cadence`)
    lora: bool = False                    # the LoRA cap's and prompt logprobs' models (`--lora`)

    @property
    def ok(self) -> bool:
        """Nothing violated; every invariant and liveness property proved by
        some method, every "sometimes" target reached by some method (a
        bounded method that stops short is not a failure); every mutant killed."""
        if any(p.status == "violated" for p in self.properties):
            return False
        settled: dict[str, bool] = {}
        for p in self.properties:
            good = p.status == ("reached" if p.kind == "sometimes" else "proved")
            settled[p.name] = settled.get(p.name, False) or good
        return all(settled.values()) and all(m.killed for m in self.mutants)

    def to_json(self) -> dict:
        return {
            "profile": self.profile,
            "seconds": round(self.seconds, 3),
            "ok": self.ok,
            "properties": [asdict(p) | {"seconds": round(p.seconds, 3)} for p in self.properties],
            "executor": self.executor,
            "tasks": self.tasks,
            "retried": self.retried,
            "mutants": [{"name": m.name, "killed": m.killed, "trace_length": m.trace_length,
                         "seconds": round(m.seconds, 3), "property": m.property, "model": m.model,
                         "method": m.method} for m in self.mutants],
        } | ({"moot_mutants": dict(self.moot)} if self.moot else {}) | (
            {"explicit_only": self.explicit_only} if self.explicit_only else {}) | (
            {"allow_name_reuse": True, "counterexamples": [to_json(cx) for cx in self.counterexamples]}
            if self.allow_name_reuse else {}) | ({"kv_connector": True} if self.kv_connector else {}) | (
            {"counterexamples": [to_json(cx) for cx in self.counterexamples]}    # KV7 under vLLM's rules
            if self.counterexamples and not self.allow_name_reuse else {}) | (
            {"reset_pause": True} if self.reset_pause else {}) | (
            {"structured_output": True} if self.structured_output else {}) | (
            {"streaming_sessions": True} if self.streaming_sessions else {}) | (
            {"priority": True} if self.priority else {}) | (
            {"prefill_cadence": True} if self.prefill_cadence else {}) | ({"lora": True} if self.lora else {})


@dataclass(frozen=True)
class SuiteOptions:
    """What one run of the suite covers (`flightcheck verify`'s flags): Z3
    proofs and BMC to `depth` on `model`, `jobs` processes, under `profile`;
    `mutants` None hunts every mutant of the profile (its moot ones listed,
    not hunted), a list only those; `inferred` adds the inferred-invariant
    proof; `allow_name_reuse` searches the profile's name-reuse models
    instead, `kv_connector` its KV connector models, `reset_pause` its reset-and-pause
    models, `streaming_sessions` its sessions', `priority` (priority_suite.py) its policy's."""
    model: Model = VERIFY_MODEL
    depth: int = VERIFY_DEPTH
    use_z3: bool = True
    mutants: tuple[str, ...] | None = None
    jobs: int = 1
    inferred: bool = False
    profile: str = DEFAULT_PROFILE
    allow_name_reuse: bool = False
    kv_connector: bool = False
    reset_pause: bool = False
    streaming_sessions: bool = False
    structured_output: bool = False
    priority: bool = False

    @property
    def runs_z3(self) -> bool:
        """The Z3 engines run: asked for, and the encoding models the profile."""
        return self.use_z3 and self.profile in Z3_PROFILES


# Told the name of each phase as it begins (`flightcheck verify` times them).
Progress = Callable[[str], None]


def _silent(_phase: str) -> None:
    pass


def counted_suite(suite: Callable[[SuiteOptions, Progress], SuiteResult], options: SuiteOptions,
                  progress: Progress | None = None) -> SuiteResult:
    """`suite(options, progress)`, its tasks counted in the result (the
    executor, how many ran, how many ran again after a lost worker)."""
    before = executors.counts()
    result = suite(options, progress or _silent)
    ran = executors.ran_since(before)
    result.executor, result.tasks, result.retried = ran["executor"], ran["tasks"], ran["retried"]
    return result


def run_suite(options: SuiteOptions = SuiteOptions(), progress: Progress | None = None) -> SuiteResult:
    """The suite under `options.profile`: exhaustive search of the profile's
    small models, Z3 proofs and BMC on `options.model` (profiles the encoding
    covers), and every mutant hunted; or, with `allow_name_reuse`, the
    name-reuse search (`_name_reuse_suite`). Its tasks (the explicit part
    beside the Z3 engines, the Houdini rounds) run on the configured
    executor (verification/executors), counted in the result."""
    if options.profile not in PROFILES:
        raise ValueError(f"unknown profile {options.profile!r}; known: {', '.join(PROFILES)}")
    return counted_suite(_chosen_suite, options, progress)


def _chosen_suite(options: SuiteOptions, say: Progress) -> SuiteResult:
    """The suite the options choose: one feature's, or the profile's."""
    if options.allow_name_reuse:
        return _name_reuse_suite(options, say)
    elif options.kv_connector:
        return _kv_connector_suite(options, say)
    elif options.reset_pause:
        return _reset_pause_suite(options, say)
    elif options.streaming_sessions:
        return _sessions_suite(options, say)
    elif options.structured_output:
        return _structured_output_suite(options, say)
    elif options.priority:
        raise ValueError("the priority suite is verification.priority_suite.run_priority_suite")
    else:
        return _profile_suite(options, say)


def _profile_suite(options: SuiteOptions, say: Progress) -> SuiteResult:
    """The suite proper (run_suite without name reuse, a KV connector, or reset and pause)."""
    profile = options.profile
    t0 = time.perf_counter()
    moot = MOOT_MUTANTS.get(profile, {}) if options.mutants is None else {}
    hunted_names = (list(options.mutants) if options.mutants is not None
                    else [m for m in mutants_of(profile) if m not in moot])
    if options.runs_z3 and options.jobs > 1:
        return _explicit_beside_z3(options, hunted_names, moot, say)
    rows: list[PropertyResult] = []
    for small in PROFILE_MODELS[profile]:
        say(f"exhaustive search of {small.name} ({profile})")
        rows += exhaustive_rows(small)
    if options.runs_z3:
        rows += _z3_rows(options, say)
    results = []
    for name in hunted_names:
        say(f"hunting mutant {name} ({profile})")
        results.append(hunt_mutant(name, profile=profile))
    return SuiteResult(time.perf_counter() - t0, rows, results, profile, moot,
                       explicit_only=EXPLICIT_ONLY_PROFILES.get(profile) if options.use_z3 else None)


def _explicit_beside_z3(options: SuiteOptions, hunted_names: list[str], moot: dict[str, str],
                        say: Progress) -> SuiteResult:
    """The explicit part (exhaustive search and mutant hunt) as one task of
    the executor while the Z3 engines run here, so it fills the time a core
    would otherwise wait on the engines' slowest share; same searches, same
    rows, only when and where they run changes."""
    profile, t0 = options.profile, time.perf_counter()
    say(f"exhaustive search of {', '.join(m.name for m in PROFILE_MODELS[profile])} and the mutant hunt "
        f"({profile}) as a task of the {executors.configured()} executor, beside the Z3 engines")
    with executors.open_executor(1) as executor:
        explicit_part = executor.stream([executors.Task((profile,), _explicit_part, (profile, hunted_names),
                                                        f"exhaustive search and mutant hunt ({profile})")])
        rows = _z3_rows(options, say)
        say("waiting for the exhaustive search and the mutant hunt")
        explicit_rows, results = next(explicit_part).result
    return SuiteResult(time.perf_counter() - t0, explicit_rows + rows, results, profile, moot)


def _z3_rows(options: SuiteOptions, say: Progress) -> list[PropertyResult]:
    """The Z3 engines' rows: under the default profile k-induction (and the
    inferred invariant's proof, if asked), the parameterised proof and BMC;
    under another encoded profile k-induction and BMC of the model under it."""
    from flightcheck.verification.z3 import suite as z3_suite
    model, profile, jobs = options.model, options.profile, options.jobs
    if profile != DEFAULT_PROFILE:
        say(f"k-induction and bounded model checking of {model.name} under {profile}"
            + (" (and of tiny-stale for the deferred resumption)" if PROFILES[profile].defer_resume_while_stale
               else ""))
        return z3_suite.profile_rows(model, profile, options.depth, jobs=jobs)
    say(f"k-induction on {model.name}")
    rows = z3_suite.induction_rows(model, jobs=jobs)
    if options.inferred:
        say(f"1-induction on {model.name} with an inferred invariant")
        rows += z3_suite.inferred_rows(model, jobs=jobs)
    say(f"parameterised k-induction, K = {model.cfg.num_stages}, any number of requests")
    rows += z3_suite.param_rows(model.cfg.num_stages)
    say(f"bounded model checking of {model.name} to depth {options.depth}")
    return rows + z3_suite.bmc_rows(model, options.depth, jobs=jobs)


def _name_reuse_suite(options: SuiteOptions, say: Progress) -> SuiteResult:
    """With names reused: only the exhaustive search of the profile's
    name-reuse models (`NAME_REUSE_MODELS`), with the shortest counterexample
    of every property it violates; no Z3, and only the mutants of guards that
    bind only with names reused (`NAME_REUSE_MUTANT_MODELS`: the hardened
    variant's), each killed only by a property the correct spec keeps on that model."""
    profile = options.profile
    if profile not in NAME_REUSE_MODELS:
        raise ValueError(f"profile {profile!r} has no name-reuse model; "
                         f"known: {', '.join(NAME_REUSE_MODELS)}")
    t0 = time.perf_counter()
    rows: list[PropertyResult] = []
    found: list[Counterexample] = []
    broken: dict[str, set[str]] = {}
    for small in NAME_REUSE_MODELS[profile]:
        say(f"exhaustive search of {small.name} ({profile}, names reused)")
        small_rows = exhaustive_rows(small, found)
        broken[small.name] = {row.name for row in small_rows if row.status == "violated"}
        rows += small_rows
    hunted = []
    for name, small in NAME_REUSE_MUTANT_MODELS.get(profile, {}).items():
        if options.mutants is not None and name not in options.mutants:
            continue
        say(f"hunting mutant {name} ({profile}, names reused)")
        hunted.append(hunt_mutant_against_base(name, small, broken[small.name]))
    return SuiteResult(time.perf_counter() - t0, rows, hunted, profile, counterexamples=found,
                       allow_name_reuse=True, explicit_only=EXPLICIT_ONLY_PROFILES.get(profile))


# Why `--kv-connector` runs no Z3 engine under a profile the connector's
# encoding does not cover (z3.suite.KV_ENCODED_PROFILE).
KV_EXPLICIT_ONLY = "the Z3 encoding of the KV connector does not cover this profile: its models are searched exhaustively"


def _kv_connector_suite(options: SuiteOptions, say: Progress) -> SuiteResult:
    """With a KV connector: the exhaustive search of the profile's connector
    models (`KV_PROFILE_MODELS`), every invariant, transition property,
    liveness property and target of each, and the connector's mutants
    (`KV_MUTANT_MODELS`), each on its own model."""
    profile = options.profile
    if profile not in KV_PROFILE_MODELS and profile not in KV_INVALID_MODELS:
        known = ', '.join(dict.fromkeys([*KV_PROFILE_MODELS, *KV_INVALID_MODELS]))
        raise ValueError(f"profile {profile!r} has no KV connector model; known: {known}")
    t0 = time.perf_counter()
    rows: list[PropertyResult] = []
    found: list[Counterexample] = []
    for small in KV_PROFILE_MODELS.get(profile, ()) + KV_INVALID_MODELS.get(profile, ()):
        say(f"exhaustive search of {small.name} ({profile}, KV connector)")
        rows += exhaustive_rows(small, found)        # KV7 under the released rules: its counterexample
    z3_rows = options.use_z3 and _kv_encoded(profile)
    if z3_rows:
        from flightcheck.verification.z3 import suite as z3_suite
        say(f"k-induction and bounded model checking of the Z3 connector models ({profile})")
        rows += z3_suite.kv_rows(profile)
    hunted = []
    for name, small in KV_MUTANT_MODELS.get(profile, {}).items():
        if options.mutants is not None and name not in options.mutants:
            continue
        say(f"hunting mutant {name} ({profile}, KV connector)")
        hunted.append(hunt_mutant(name, model=small))
    return SuiteResult(time.perf_counter() - t0, rows, hunted, profile, kv_connector=True, counterexamples=found,
                       explicit_only=KV_EXPLICIT_ONLY if options.use_z3 and not z3_rows else None)


RESET_PAUSE_EXPLICIT_ONLY = "the Z3 model of reset and pause does not cover this profile: its models are searched exhaustively"


def _reset_pause_suite(options: SuiteOptions, say: Progress) -> SuiteResult:
    """`--reset-pause` (spec/reset_pause.py): the exhaustive search of the
    profile's reset-and-pause model, every invariant, transition property
    (RP1-RP4 among them), liveness property and target of it, and, under
    `vllm-0.34-async`, reset and pause's mutants, each on its model."""
    profile = options.profile
    if profile not in RESET_PAUSE_MODELS:
        raise ValueError(f"profile {profile!r} has no reset-and-pause model; known: {', '.join(RESET_PAUSE_MODELS)}")
    mutants = [(name, reset_pause_mutant_model(name)) for name, m in RESET_PAUSE_MUTANTS.items()
               if m.profile == profile]
    from flightcheck.verification.z3.reset_pause_engines import RP_ENCODED_PROFILE, reset_pause_rows
    z3_rows = options.use_z3 and profile in RP_ENCODED_PROFILE
    result = _explicit_feature_suite(options, say, "reset and pause", RESET_PAUSE_MODELS[profile], mutants,
                                     None if z3_rows else RESET_PAUSE_EXPLICIT_ONLY, reset_pause=True)
    if z3_rows:         # RP1-RP4, RP5 beside a connector: k-induction and BMC (z3/reset_pause_engines.py)
        say(f"k-induction and bounded model checking of the Z3 reset-and-pause model ({profile})")
        t0 = time.perf_counter()
        rows = reset_pause_rows(profile)
        result = replace(result, properties=result.properties + rows,
                                     seconds=result.seconds + time.perf_counter() - t0)
    return result


def _explicit_feature_suite(options: SuiteOptions, say: Progress, feature: str, models: Sequence[Model],
                            mutants: Sequence[tuple[str, Model]], explicit_only: str | None, **flags: bool) -> SuiteResult:
    """A request state's suite without a Z3 engine: the exhaustive search of
    each of its models, then each of its mutants hunted on its own model."""
    profile = options.profile
    t0 = time.perf_counter()
    rows: list[PropertyResult] = []
    found: list[Counterexample] = []
    for small in models:
        say(f"exhaustive search of {small.name} ({profile}, {feature})")
        rows += exhaustive_rows(small, found)       # KV8 under the released rules: its counterexample
    hunted = []
    for name, small in mutants:
        if options.mutants is None or name in options.mutants:
            say(f"hunting mutant {name} ({profile}, {feature})")
            hunted.append(hunt_mutant(name, model=small))
    return SuiteResult(time.perf_counter() - t0, rows, hunted, profile, counterexamples=found,
                       explicit_only=explicit_only if options.use_z3 else None, **flags)


# Why `--streaming-sessions` runs no Z3 engine under a profile outside
# z3.session_engines.SESSION_Z3_PROFILES (none of the session profiles today).
SESSIONS_EXPLICIT_ONLY = "the Z3 encoding has no session model under this profile: its models are searched exhaustively"


def _sessions_suite(options: SuiteOptions, say: Progress) -> SuiteResult:
    """With streaming sessions: the exhaustive search of the profile's
    session models (`SESSION_PROFILE_MODELS`), every invariant, transition
    property, liveness property and target of each (SS1-SS4 among them),
    and, under SESSION_PROFILE, the sessions' mutants (`SESSION_MUTANT_MODELS`),
    each on its own model."""
    profile = options.profile
    if profile not in SESSION_PROFILE_MODELS:
        raise ValueError(f"profile {profile!r} has no streaming sessions; known: {', '.join(SESSION_PROFILE_MODELS)}")
    mutants = list(SESSION_MUTANT_MODELS.items()) if profile == SESSION_PROFILE else []
    t0 = time.perf_counter()
    result = _explicit_feature_suite(options, say, "streaming sessions", SESSION_PROFILE_MODELS[profile], mutants,
                                     SESSIONS_EXPLICIT_ONLY, streaming_sessions=True)
    from flightcheck.verification.z3.session_engines import SESSION_Z3_PROFILES, session_rows
    if options.use_z3 and profile in SESSION_Z3_PROFILES:      # the Z3 session model (z3/session_models.py)
        say(f"k-induction and bounded model checking of the Z3 session model ({profile})")
        result.properties += session_rows(profile)
        from flightcheck.verification.z3.priority_session_engines import SS5_Z3_PROFILES, ss5_rows
        if profile in SS5_Z3_PROFILES:      # SS5: the priority policy beside sessions (z3/session_models.PRIO_SESSIONS)
            say(f"k-induction and bounded model checking of SS5 on the Z3 priority-sessions model ({profile})")
            result.properties += ss5_rows(profile)
        result.explicit_only = None
        result.seconds = time.perf_counter() - t0
    return result


def _kv_encoded(profile: str) -> bool:
    """The Z3 encoding of the connector covers `profile` (z3.suite.KV_ENCODED_PROFILE)."""
    from flightcheck.verification.z3.suite import KV_ENCODED_PROFILE
    return profile in KV_ENCODED_PROFILE


def _explicit_part(profile: str, mutants: list[str]) -> tuple[list[PropertyResult], list[MutantResult]]:
    """The suite's explicit-state part under `profile`: the exhaustive rows
    of its models, then each of `mutants` hunted (run_suite's second process)."""
    rows = [row for small in PROFILE_MODELS[profile] for row in exhaustive_rows(small)]
    return rows, [hunt_mutant(name, profile=profile) for name in mutants]


def _structured_output_suite(options: SuiteOptions, say: Progress) -> SuiteResult:
    """`--structured-output` (spec/grammar.py): the exhaustive search of the
    profile's grammar models, under `vllm-0.34-async` the grammar's mutants,
    each on its model, and (unless --no-z3) G1-G3 by k-induction and BMC on
    the Z3 grammar model (z3.grammar_models, vLLM 0.34 sync, whatever the profile)."""
    from flightcheck.verification.grammar_models import GRAMMAR_MODELS, grammar_mutant_model
    from flightcheck.verification.mutants.registry import GRAMMAR_MUTANTS
    from flightcheck.verification.z3 import suite as z3_suite
    profile = options.profile
    models = [m for m in GRAMMAR_MODELS if m.cfg.profile == profile]
    if not models:
        raise ValueError(f"profile {profile!r} has no structured-output model")
    mutants = [(name, grammar_mutant_model(name)) for name, m in GRAMMAR_MUTANTS.items() if m.profile == profile]
    result = _explicit_feature_suite(options, say, "structured output", models, mutants, "", structured_output=True)
    if options.use_z3:
        t0 = time.perf_counter()
        say("k-induction and BMC of G1-G3 on the Z3 grammar model")
        result.properties += z3_suite.grammar_rows()
        result.seconds += time.perf_counter() - t0
    result.explicit_only = None
    return result

