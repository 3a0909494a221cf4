"""KV8's block arithmetic (spec/kv_unwritten.py): which blocks a batch
writes, and which entries read a block no batch wrote (the trace checker's
rule at a schedule event, verification/traces/unwritten.py)."""

from __future__ import annotations

from flightcheck.spec.kv_unwritten import kv8_reads, written

BS = 8


def test_an_entry_writes_every_block_it_touches_a_partial_one_included() -> None:
    # r0 @12+6 on table (2, 3, 4): tokens 12-17, the end of block 3 and the start of block 4
    assert written([(0, 12, 6, (2, 3, 4), 0)], BS) == {3, 4}
    # a sync load writes the `external` tokens before its start too: 0-15 loaded, 16-17 computed
    assert written([(1, 16, 2, (5, 6, 7), 16)], BS) == {5, 6, 7}
    assert written([(2, 16, 0, (5, 6, 7), 0)], BS) == frozenset()


def test_a_hit_on_an_unwritten_block_is_read_unless_the_batch_writes_it() -> None:
    readmitted = (0, 16, 2, (2, 3, 4), 0)          # the kept traces' r0: a 16-token hit on blocks 2 and 3
    assert kv8_reads(frozenset({3}), [readmitted], BS) == [(0, [3])]
    assert kv8_reads(frozenset({4}), [readmitted], BS) == []             # past its start: it writes block 4
    writer = (1, 8, 8, (9, 3), 0)                  # another entry computing block 3's tokens in the batch
    assert kv8_reads(frozenset({3}), [readmitted, writer], BS) == []
