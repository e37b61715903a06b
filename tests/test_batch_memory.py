"""What building a batch holds in memory: a rollout's prompts packed by the ids each
adds, the packed ids shared rather than joined into a copy, and the gather's index a
small block at a time. The columns are the rows, whatever the packing. And what a
collection keeps per rollout: its log record and usage, slotted."""

from __future__ import annotations

import copyreg
import dataclasses
import pickle
import random
import sys
import tracemalloc

import numpy as np
import pytest

import focus.batch_columns as columns
from focus.agent import Piece, Rollout
from focus.batch import BatchBuilder, BatchError
from focus.batch_columns import TokenBuffer, _gathered
from focus.tree import RolloutRecord, Turn
from focus.usage import Usage


def _rollout(rng: random.Random, opening: tuple[int, ...], steps: int, obs: int) -> list[tuple[tuple, tuple]]:
    """(prompt, completion) of each turn of one rollout: ``Segments``'s prompts, each
    the last one, its completion and an observation's ids."""
    turns, prompt = [], opening
    for _ in range(steps):
        completion = tuple(rng.randrange(1, 9) for _ in range(3))
        turns.append((prompt, completion))
        prompt = prompt + completion + tuple(rng.randrange(256) for _ in range(obs))
    return turns


def _build(turns: list[tuple[tuple, tuple]], chained: bool) -> tuple[BatchBuilder, list]:
    b = BatchBuilder("c", 0)
    for i, (prompt, completion) in enumerate(turns):
        b.add_turn(
            "t", "t#0", 0, i, 0, "0", "action", prompt, completion, (-0.5,) * len(completion), 1, 0.0, 0.0, "stop",
            chained=chained,
        )  # fmt: skip
    actor, _ = b.tables()
    return b, actor.column("prompt_ids").to_pylist()


def test_a_rollouts_prompts_are_packed_by_the_ids_each_adds():
    """Six turns with 1,000-id observations: the prompts hold 15,000+ ids in all, the
    rollout's transcript 6,000; chained, the buffer packs the transcript once (it packed
    every prompt whole, the sum), and the prompt column is the prompts either way."""
    rng = random.Random(0)
    opening = tuple(rng.randrange(256) for _ in range(20))
    turns = _rollout(rng, opening, 6, 1000)
    whole = sum(len(p) + len(c) for p, c in turns)
    transcript = len(turns[-1][0]) + len(turns[-1][1])
    plain, rows = _build(turns, chained=False)
    assert len(plain.tokens) == whole
    assert [tuple(r) for r in rows] == [p for p, _ in turns]
    chained, rows = _build(turns, chained=True)
    assert len(chained.tokens) == transcript < whole / 2
    assert [tuple(r) for r in rows] == [p for p, _ in turns]


def test_chained_prompts_of_many_rollouts_siblings_and_strays_come_out_as_they_went_in():
    """Rollouts interleaved with siblings (the same prompt object), prompts that share
    only part of the run, lists and empty prompts: every row's prompt and completion as
    given, at every gather block."""
    rng = random.Random(1)
    opening = tuple(rng.randrange(256) for _ in range(5))
    turns: list[tuple] = []
    for r in range(12):
        turns += _rollout(rng, opening, rng.randrange(1, 5), rng.randrange(0, 6))
        if r % 3 == 0:
            p, c = turns[-1]
            turns.append((p, (7,)))  # a sibling: the very prompt object again
            turns.append((p[:-1] + (p[-1] + 1,) if p else (1,), c))  # same length, one id off
            turns.append((list(p + c), c))  # a list extending the run: packed whole
            turns.append(((), ()))
    for block in (1, 7, 1 << 16):
        columns_block = columns._GATHER_BLOCK
        columns._GATHER_BLOCK = block
        try:
            b, rows = _build(turns, chained=True)
        finally:
            columns._GATHER_BLOCK = columns_block
        assert [tuple(r) for r in rows] == [tuple(p) for p, _ in turns], block
        assert b.tables()[0].column("completion_ids").to_pylist() == [list(c) for _, c in turns]


def test_a_bad_id_in_a_chained_prompts_tail_is_refused_naming_the_column():
    rng = random.Random(2)
    (p0, c0), _ = _rollout(rng, (1, 2, 3), 2, 4)
    b = BatchBuilder("c", 0)
    b.add_turn("t", "t#0", 0, 0, 0, "0", "action", p0, c0, (-0.5,) * 3, 1, 0.0, 0.0, "stop", chained=True)
    with pytest.raises(BatchError, match="'prompt_ids' has a value outside int32: 4294967296"):
        b.add_turn(
            "t", "t#0", 0, 1, 0, "0", "action", p0 + c0 + (2**32,), c0, (-0.5,) * 3, 1, 0.0, 0.0, "stop", chained=True
        )


def test_the_buffer_shares_its_bytes_and_takes_more_after():
    """``values`` is a view of the packed bytes, not a joined copy (which held the
    buffer twice at the peak of preparing); ids added after it go on in a copy, and
    the view already taken keeps its ids."""
    buf = TokenBuffer()
    big = tuple(range(1 << 18))
    buf.add(big)
    tracemalloc.start()
    try:
        view = buf.values()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024, peak  # a joined copy: 1 MiB
    assert view.tolist() == list(big)
    start = buf.add((5, 6))
    assert start == len(big)
    assert buf.values()[start:].tolist() == [5, 6] and view.tolist() == list(big)


def test_the_gathers_index_is_built_a_small_block_at_a_time():
    """Gathering 4 M ids: the output (16 MiB) and an index of about 1 MiB beside it; a
    block of 1 << 20 values built 16 MiB of index (int64 and its arange) for any
    column of a million ids or more, the largest allocation of preparing a batch."""
    pool = np.arange(1 << 20, dtype=np.int32)
    starts = np.zeros(64, dtype=np.int64)
    lengths = np.full(64, 1 << 16, dtype=np.int64)
    tracemalloc.start()
    try:
        out = _gathered(pool, starts, lengths)
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(out) == 1 << 22 and (out[: 1 << 16] == pool[: 1 << 16]).all() and out[-1] == (1 << 16) - 1
    assert peak - out.nbytes < 4 << 20, (peak - out.nbytes) / 2**20


class _OldPickle:
    """Pickles as an instance of ``cls`` whose state is a ``__dict__``: what a checkpoint
    store holds of a record pickled before the class had slots."""

    def __init__(self, cls: type, state: dict) -> None:
        self.cls, self.state = cls, state

    def __reduce_ex__(self, protocol: object) -> tuple:
        return copyreg._reconstructor, (self.cls, object, None), self.state


def _record() -> RolloutRecord:
    pieces = (Piece((Turn((1,), (2, 3), (-0.5, -0.5), 1, "stop"),), "terminal", 1, ()),)
    usage = Usage.of_rollout(Rollout("t", pieces, 0.25, {"retries": 2, "retries:timeout": 2, "retried_calls": 1}))
    return RolloutRecord(3, 1, "continue", 2, 5, 1, 77, False, None, "terminal", 0.25, 1.5, usage)


def test_rollout_records_and_their_usage_are_slotted():
    """One of each per rollout, kept all collection: with a ``__dict__`` each took 520
    bytes; slotted, 136 (the record) and 176 (its usage, 18 fields)."""
    record = _record()
    for obj in (record, record.usage):
        assert not hasattr(obj, "__dict__"), type(obj).__name__
        assert sys.getsizeof(obj) <= 176, (type(obj).__name__, sys.getsizeof(obj))


def test_records_pickled_before_the_slots_load_as_they_were():
    """A checkpoint store's trees pickled a record and its usage with a ``__dict__``
    state; they load field by field (the dataclass's own ``__setstate__`` zipped the
    fields with the dict's keys: each field a field name), and pickle again the new way."""
    record = _record()
    usage_state = {f.name: getattr(record.usage, f.name) for f in dataclasses.fields(Usage)}
    old = {f.name: getattr(record, f.name) for f in dataclasses.fields(RolloutRecord)}
    old["usage"] = _OldPickle(Usage, usage_state)
    back = pickle.loads(pickle.dumps(_OldPickle(RolloutRecord, old)))
    assert type(back) is RolloutRecord and type(back.usage) is Usage
    assert back == record and back.usage.retry_causes == (("timeout", 2),)
    assert pickle.loads(pickle.dumps(back)) == record
    with pytest.raises(TypeError, match=r"RolloutRecord pickled without the fields \['seed'\]"):
        pickle.loads(pickle.dumps(_OldPickle(RolloutRecord, {k: v for k, v in old.items() if k != "seed"})))


def test_noise_rows_are_slotted():
    """A row per checkpoint for every fit and the batch: a ``__dict__`` of its 8 fields
    made each 328 bytes; slotted, 96."""
    from focus.noise_rows import Checkpoint

    row = Checkpoint(1, 1, 2, 0.5, None, None, 0.5, [])
    assert not hasattr(row, "__dict__") and sys.getsizeof(row) <= 96


def test_turns_are_slotted_and_load_from_a_dict_pickle():
    """One per model call, kept all collection: 160 bytes with a ``__dict__``, 112
    slotted; a turn pickled with a ``__dict__`` (a checkpoint store's trees, made
    before) loads as it was, its fields left out at their defaults."""
    turn = Turn((1, 2), (3,), (-0.5,), 1, "stop", observation="Total 3.")
    assert not hasattr(turn, "__dict__") and sys.getsizeof(turn) <= 112
    assert pickle.loads(pickle.dumps(turn)) == turn
    old = {f.name: getattr(turn, f.name) for f in dataclasses.fields(Turn) if f.name != "policy_version"}
    assert pickle.loads(pickle.dumps(_OldPickle(Turn, old))) == turn
