"""Setup shared by several test modules, in one place.

`dense_oracle` is what the runtime differential tests compare against: the
outputs a dense (unpaged, unbatched) greedy decode of the same seeded model
gives for a workload, cut at an EOS id the model really emits, so that some
requests stop early. Each test module binds it to its own workload in a
module-scoped fixture (`oracle`), built once per module.

`load_benchmark` imports one of benchmarks/*.py (the folder is not a
package) under a name of its own, without touching `sys.path`.
"""

from __future__ import annotations

import collections
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def dense_oracle(source: Any, workload: Sequence[Any], max_model_len: int) -> tuple[int, dict[str, list[int]]]:
    """An EOS id the model emits (so some requests stop) and the dense greedy
    outputs of every request of `workload`, each cut after that EOS."""
    import torch

    from flightcheck.runtime import build_model
    from flightcheck.runtime.dense import dense_greedy

    model = build_model(source.model_config(), source, torch.float64)
    free = {g.req_id: dense_greedy(model, g.prompt_token_ids, g.max_tokens, None, max_model_len)
            for g in workload}
    counts = collections.Counter(t for out in free.values() for t in out[1:-1])
    eos = counts.most_common(1)[0][0]
    return eos, {r: out[:out.index(eos) + 1] if eos in out else out for r, out in free.items()}


def load_benchmark(name: str) -> ModuleType:
    """benchmarks/NAME.py as a module, loaded from its file."""
    path = ROOT / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}_under_test", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    # registered before it runs, as an import would: its dataclasses look
    # their module up by name
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def read_module_as_rewritten(monkeypatch: Any, slot: Any, module_name: str, edit: Any) -> None:
    """Make the mutant mechanism (verification/mutants/patch.py) read module
    `module_name` as `edit` rewrites its text, and forget the code `slot`
    (patching's spec or reference slot) compiled for mutants applied before:
    how a drift test changes a function under a mutant without touching the file."""
    from flightcheck.verification.mutants import patch

    real = patch.module_source
    monkeypatch.setattr(slot, "compiled", {})

    def source(module: ModuleType) -> tuple[str, str]:
        filename, text = real(module)
        return (filename, edit(text)) if module.__name__ == module_name else (filename, text)
    monkeypatch.setattr(patch, "module_source", source)


def run_checked(cfg: Any, num_requests: int, actions: Sequence[Any]) -> Any:
    """The spec's run of `actions` from the initial state of `num_requests`
    requests, each action enabled and every invariant and transition
    property of `cfg` holding after it; returns the last state."""
    from flightcheck.spec import invariants_for, step, transition_properties_for
    from flightcheck.spec.state import initial_state

    state = initial_state(num_requests, cfg.num_blocks)
    for action in actions:
        nxt = step(state, cfg, action)
        assert nxt is not None, f"{action} is disabled"
        broken = ([i.name for i in invariants_for(cfg) if not i.holds(nxt, cfg)]
                  + [p.name for p in transition_properties_for(cfg) if not p.holds(state, nxt, action, cfg)])
        assert not broken, (action, broken)
        state = nxt
    return state


def assert_model_proves(model: Any, properties: set[str], pinned: tuple[int, int, int]) -> None:
    """`model`'s configuration checks every one of `properties`, and its
    exhaustive search is complete, finds no violation and reaches the pinned
    (states, edges, max depth)."""
    from flightcheck.spec import invariants_for, transition_properties_for
    from flightcheck.verification.explicit.search import search

    names = {i.name for i in invariants_for(model.cfg)} | {p.name for p in transition_properties_for(model.cfg)}
    assert properties <= names, properties - names
    r = search(model)
    assert r.complete and not r.violations, [(v.property, len(v.path)) for v in r.violations]
    assert (r.num_states, r.num_edges, r.max_depth) == pinned
