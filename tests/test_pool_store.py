"""The block pool's two representations (spec/pool_store.py): every
operation of spec/blocks.py on a large pool's store, updated in place, gives
the pool the same operation gives on tuples; older versions keep their
values; `changes_since` names every block an operation changed."""

from __future__ import annotations

import random

import pytest

from flightcheck.spec import blocks, pool_store
from flightcheck.spec.state import BlockPool


def _tuples(pool: BlockPool) -> BlockPool:
    """The same value as a plain pool of tuples."""
    return BlockPool(tuple(pool.ref_counts), tuple(pool.labels), tuple(pool.free_queue), tuple(pool.duplicates))


def _random_step(rng: random.Random, pool: BlockPool, tables: list[tuple[int, ...]], cfg: dict):
    """One random operation (as the spec's transitions use them); the new
    pool and the tables held after it."""
    kind = rng.choice(["alloc", "alloc", "hit", "cache", "free", "free", "uncache"])
    if kind == "alloc" or not tables:
        n = rng.randint(1, 4)
        if blocks.num_free(pool) < n:
            return pool, tables
        pool, taken = blocks.pop_fresh(pool, n)
        return pool, tables + [taken]
    if kind == "hit":
        labels = [rng.randint(1, cfg["labels"]) for _ in range(rng.randint(1, 4))]
        hit = blocks.lookup_hit(pool, labels, 4)
        if not hit or not blocks.can_allocate(pool, 0, hit):
            return pool, tables
        return blocks.touch(pool, hit), tables + [hit]
    i = rng.randrange(len(tables))
    if kind == "cache":
        labels = [rng.randint(1, cfg["labels"]) for _ in tables[i]]
        return blocks.cache_labels(pool, tables[i], labels, cfg["duplicates"]), tables
    if kind == "uncache":
        return blocks.uncache(pool, tables[i][rng.randrange(len(tables[i])):]), tables
    table = tables.pop(i)
    return blocks.free_table(pool, table, cfg["order"], cfg["to_head"]), tables


@pytest.mark.parametrize("seed", range(12))
def test_store_and_tuples_agree(seed: int, monkeypatch) -> None:
    rng = random.Random(seed)
    cfg = {"labels": rng.choice([3, 8, 30]), "duplicates": rng.random() < 0.6,
           "order": rng.choice(["reverse", "forward"]), "to_head": rng.random() < 0.4}
    num_blocks = rng.choice([6, 12, 40])
    history = []
    pools: dict[str, BlockPool] = {}
    states: dict[str, list] = {}
    for name, threshold in (("store", 0), ("tuples", 10**9)):
        monkeypatch.setattr(pool_store, "STORE_MIN_BLOCKS", threshold)
        step_rng = random.Random(seed * 1000 + 1)
        pool, tables, seen = BlockPool.empty(num_blocks), [], []
        for _ in range(150):
            before = pool
            pool, tables = _random_step(step_rng, pool, tables, cfg)
            seen.append((before, pool))
        pools[name], states[name] = pool, seen
        history.append(name)
    assert all("_store" in a.__dict__ for _, a in states["store"][20:])       # in place, as meant
    assert not any("_store" in a.__dict__ for _, a in states["tuples"])
    for (b1, a1), (b2, a2) in zip(states["store"], states["tuples"]):
        assert _tuples(a1) == _tuples(a2)
        assert a1 == a2 and hash(a1) == hash(a2)
    # older versions keep their values, read in any order
    for (b1, _), (b2, _) in reversed(list(zip(states["store"], states["tuples"]))):
        assert _tuples(b1) == _tuples(b2)


@pytest.mark.parametrize("seed", range(6))
def test_changes_since_names_every_change(seed: int, monkeypatch) -> None:
    monkeypatch.setattr(pool_store, "STORE_MIN_BLOCKS", 0)
    rng = random.Random(seed)
    cfg = {"labels": 6, "duplicates": True, "order": "reverse", "to_head": seed % 2 == 0}
    pool, tables = BlockPool.empty(20), []
    for _ in range(100):
        before = pool
        pool, tables = _random_step(rng, pool, tables, cfg)
        changes = pool_store.changes_since(before, pool)
        if pool is before:
            continue
        assert changes is not None
        old, new = _tuples(before), _tuples(pool)
        changed_refs = {b for b in range(20) if old.ref_counts[b] != new.ref_counts[b]}
        changed_labels = {b for b in range(20) if old.labels[b] != new.labels[b]}
        assert changed_refs <= set(changes[pool_store.REF])
        assert changed_labels <= set(changes[pool_store.LABEL])
        assert all(old.labels[b] == v for b, v in changes[pool_store.LABEL].items())
        assert all(old.ref_counts[b] == v for b, v in changes[pool_store.REF].items())


# -- the checkers' verdicts with both representations -------------------------------

from flightcheck.spec import request_store  # noqa: E402
from flightcheck.verification.traces.check import MalformedTrace, check_events, read_events  # noqa: E402

from .fixtures import load_benchmark  # noqa: E402
from .reference_trace_runs import run_cases, traced_run  # noqa: E402

pytestmark = pytest.mark.usefixtures("both_checkers")   # checks traces: both checkers compared

write_long_trace = load_benchmark("long_traces").write_long_trace


def _outcomes(events: list[dict], monkeypatch) -> dict[str, tuple]:
    """Each checker's full outcome with the stores forced on every pool and
    request tuple, and with none (tuples only)."""
    found = {}
    for stores, threshold in (("stores", 0), ("tuples", 10**9)):
        monkeypatch.setattr(pool_store, "STORE_MIN_BLOCKS", threshold)
        monkeypatch.setattr(request_store, "STORE_MIN_REQUESTS", threshold)
        for full in (False, True):
            try:
                result = check_events([dict(e) for e in events], full=full)
                found[f"{stores}-{full}"] = tuple(sorted(result.to_json().items(), key=lambda kv: kv[0]))
            except MalformedTrace as err:
                found[f"{stores}-{full}"] = ("malformed", str(err))
    return found


def _same(events: list[dict], monkeypatch) -> tuple:
    found = _outcomes(events, monkeypatch)
    assert found["stores-False"] == found["tuples-False"]
    assert found["stores-True"] == found["tuples-True"]
    return found["stores-False"]


CASES = run_cases()


@pytest.mark.parametrize("case", CASES[::7], ids=[case[0] for case in CASES[::7]])
def test_both_representations_give_the_same_verdict_on_golden_runs(case, monkeypatch) -> None:
    _, mutant, continue_prefill, seed = case
    text = traced_run(mutant, continue_prefill, seed)
    _same(read_events(line for line in text.split("\n") if not line.startswith("#")), monkeypatch)


@pytest.mark.parametrize("options", [{}, {"profile": "vllm-0.8.4", "continue_prefill": None},
                                     {"prefix_caching": False}, {"block_size": 4, "repeated_prompts": 0.3}],
                         ids=["0.8.5", "0.8.4", "no-prefix-caching", "duplicates"])
def test_both_representations_give_the_same_verdict_on_long_traces(options, monkeypatch) -> None:
    import io
    import json
    sink = io.StringIO()
    write_long_trace(sink, 10, 250, seed=5, **options)
    events = read_events(sink.getvalue().split("\n"))
    assert dict(_same(events, monkeypatch))["ok"] is True
    rng = random.Random(7)
    for _ in range(1):                                # damaged somewhere past the middle: the same violation
        broken = [json.loads(json.dumps(e)) for e in events]
        while True:
            index = rng.randrange(len(broken) // 2, len(broken) - 1)
            if broken[index]["ev"] == "schedule" and broken[index]["entries"]:
                broken[index]["entries"][0]["n"] += 1
                break
        assert dict(_same(broken, monkeypatch))["ok"] is False
