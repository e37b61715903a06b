"""Rows to Arrow columns (focus.batch.BatchBuilder) and Parquet: shared tuples, packing, encodings.

The oracle for every conversion is pyarrow's own ``pa.array`` over plain lists, built from
copies of the rows (no shared objects), so the token buffer, the mask flags and the
packing are checked against an independent implementation.
"""

from __future__ import annotations

import random

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from focus.batch import ACTOR_SCHEMA, CRITIC_SCHEMA, ActorRow, Batch, BatchBuilder, BatchError, CriticRow
from storage import BatchStore, SchemaError
from storage.batches import _row_groups, _tokens_per_row
from storage.schema import actor_table, critic_table


def _branching_batch(seed: int = 0, trees: int = 6) -> Batch:
    """Trees whose rows share tuples the way the collector's do: every turn's prompt extends
    the previous one, sibling segments send their checkpoint's very tuple, a critic row's
    context is that same tuple; plus equal-but-distinct copies, empty prompts and mixed masks."""
    rng = random.Random(seed)
    actor: list[ActorRow] = []
    critic: list[CriticRow] = []
    for t in range(trees):
        root = tuple(rng.randrange(200_000) for _ in range(rng.randrange(5, 40)))
        checkpoints = [root]
        edge = 0
        for node, ctx in enumerate(checkpoints[:8]):
            critic.append(CriticRow("c", 0, f"task{t}", f"tree{t}", node, ctx, rng.random(), 2.0, None))
            for _sibling in range(2):  # two continuations from the same checkpoint tuple
                prompt = ctx if rng.random() < 0.8 else tuple(ctx)  # sometimes an equal copy
                for turn in range(rng.randrange(1, 4)):
                    n = rng.randrange(0, 12)
                    completion = tuple(rng.randrange(200_000) for _ in range(n))
                    mask = (1,) * n if rng.random() < 0.7 else tuple(rng.randrange(2) for _ in range(n))
                    lps = tuple(-rng.random() * 5 for _ in range(n))
                    actor.append(
                        ActorRow(
                            "c",
                            0,
                            f"task{t}",
                            f"tree{t}",
                            node,
                            edge,
                            turn,
                            "v1",
                            prompt,
                            completion,
                            lps,
                            mask,
                            rng.gauss(0, 1),
                            0.0,
                            "stop",
                        )  # fmt: skip
                    )
                    prompt = prompt + completion + tuple(rng.randrange(200_000) for _ in range(3))
                checkpoints.append(prompt)
                edge += 1
    actor.append(ActorRow("c", 0, "task0", "tree0", 0, edge, 0, "v1", (), (), (), (), 0.0, 0.0, "length"))
    critic.append(CriticRow("c", 0, "task0", "tree0", 99, (), 0.0, 0.0, 0.5))
    return Batch("c", 0, actor, critic, {"trees": trees})


def _copy(batch: Batch) -> Batch:
    """The same values with no tuple shared between rows (or with the original)."""

    def fresh(x: tuple) -> tuple:
        return tuple(list(x))

    actor = [
        ActorRow(
            **{
                **r.__dict__,
                **{k: fresh(getattr(r, k)) for k in ("prompt_ids", "completion_ids", "logprobs", "loss_mask")},
            }
        )
        for r in batch.actor
    ]
    critic = [CriticRow(**{**r.__dict__, "context_ids": fresh(r.context_ids)}) for r in batch.critic]
    return Batch(batch.collection_id, batch.iteration, actor, critic, dict(batch.stats))


def _reference(rows: list, schema: pa.Schema) -> pa.Table:
    cols = {f.name: [getattr(r, f.name) for r in rows] for f in schema}
    return pa.Table.from_arrays(
        [pa.array([list(v) if isinstance(v, tuple) else v for v in cols[f.name]], f.type) for f in schema],
        schema=schema,
    )


def test_shared_tuples_convert_exactly_like_distinct_copies():
    batch = _branching_batch()
    shared = sum(1 for r in batch.critic if any(r.context_ids is a.prompt_ids for a in batch.actor))
    assert shared >= len(batch.critic) // 2  # the data really shares tuples across tables
    builder = BatchBuilder("c", 0).add_rows(batch.actor, batch.critic)
    actor, critic = builder.tables()
    assert actor.equals(_reference(batch.actor, ACTOR_SCHEMA))
    assert critic.equals(_reference(batch.critic, CRITIC_SCHEMA))
    copy = _copy(batch)
    assert actor.equals(actor_table(copy.actor)) and critic.equals(critic_table(copy.critic))
    # each shared tuple was packed once: the buffer holds fewer ids than the tables
    stored = sum(len(r.prompt_ids) + len(r.completion_ids) for r in batch.actor)
    stored += sum(len(r.context_ids) for r in batch.critic)
    assert len(builder.tokens.values()) < stored * 0.8
    built = Batch.from_rows("c", 0, batch.actor, batch.critic, batch.stats)
    assert built.columnar and built.actor == batch.actor and built.critic == batch.critic
    assert built.summary() == batch.summary()


@pytest.mark.parametrize("overlap", [False, True])
def test_shared_tuples_write_the_same_bytes_as_copies_and_come_back(tmp_path, overlap):
    batch = _branching_batch(seed=1)
    a = BatchStore(tmp_path / "a", overlap=overlap, group_tokens=97)
    b = BatchStore(tmp_path / "b", overlap=not overlap, group_tokens=97)
    url = a.write(batch)
    assert a.manifest(url).fingerprint == b.manifest(b.write(_copy(batch))).fingerprint
    back = a.read(url)
    assert back.actor == batch.actor and back.critic == batch.critic


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("completion_ids", (5, 2.5), r"'completion_ids' has a value 2.5 \(float\) that is not int32"),
        ("prompt_ids", (1, 2**31), "'prompt_ids' has a value outside int32"),
        ("prompt_ids", (1, "7"), r"'prompt_ids' has a value '7' \(str\) that is not int32"),
        ("logprobs", (-0.5, None), r"'logprobs' has a value None \(NoneType\) that is not float64"),
        ("loss_mask", (1.0, 1.0), r"'loss_mask' has a value 1.0 \(float\) that is not int8"),
        ("loss_mask", (300, 1), "'loss_mask' has a value outside int8"),
        ("loss_mask", (2, 2), "loss_mask entries must be 0 or 1"),
    ],
)
def test_bad_values_are_refused_naming_column_and_value(tmp_path, field, value, match):
    good = ActorRow("c", 0, "t", "tr", 0, 0, 0, "v", (1, 2), (5, 6), (-0.1, -0.2), (1, 1), 0.0, 0.0, "stop")
    bad = ActorRow(**{**good.__dict__, field: value})
    store = BatchStore(tmp_path)
    with pytest.raises(SchemaError, match=match):
        store.write(Batch("c", 0, [good, bad], [], {}))
    assert store.list() == []


def test_files_use_the_documented_encodings_and_other_readers_agree(tmp_path):
    batch = _branching_batch(seed=2)
    url = BatchStore(tmp_path).write(batch)
    folder = url.removeprefix("file://")
    md = pq.ParquetFile(f"{folder}/actor/part-00000.parquet").metadata
    cols = {md.row_group(0).column(i).path_in_schema: md.row_group(0).column(i) for i in range(md.num_columns)}
    for name in ("prompt_ids.list.element", "completion_ids.list.element", "logprobs.list.element"):
        assert not cols[name].is_stats_set
    # byte-stream split on floats only: integer BYTE_STREAM_SPLIT (Parquet 2024) is unreadable
    # by DuckDB 1.0-1.4 ("only supported for FLOAT or DOUBLE data"), which most users have
    assert "BYTE_STREAM_SPLIT" in cols["logprobs.list.element"].encodings
    for name in ("prompt_ids.list.element", "completion_ids.list.element"):
        assert "BYTE_STREAM_SPLIT" not in cols[name].encodings
    critic = pq.ParquetFile(f"{folder}/critic/part-00000.parquet").metadata.row_group(0)
    context = [
        critic.column(i) for i in range(critic.num_columns) if critic.column(i).path_in_schema.startswith("context")
    ]
    assert context and all("BYTE_STREAM_SPLIT" not in c.encodings for c in context)
    assert cols["advantage"].is_stats_set and cols["task_id"].compression == "ZSTD"
    assert "RLE_DICTIONARY" in cols["task_id"].encodings
    tokens = sum(sum(r.prompt_ids) + sum(r.completion_ids) for r in batch.actor)
    lps = sum(sum(r.logprobs) for r in batch.actor)
    got = duckdb.sql(
        f"select sum(list_sum(prompt_ids)) + sum(list_sum(completion_ids)), sum(list_sum(logprobs)) "
        f"from read_parquet('{folder}/actor/*.parquet')"
    ).fetchall()[0]
    assert got[0] == tokens and got[1] == pytest.approx(lps, rel=1e-12)
    frame = pl.read_parquet(f"{folder}/critic/*.parquet")
    assert frame["context_ids"].to_list() == [list(r.context_ids) for r in batch.critic]


def test_row_groups_are_balanced_and_keep_every_row_in_order():
    batch = _branching_batch(seed=3)
    rows = batch.actor
    per_row = _tokens_per_row(batch.actor_table)
    assert per_row.tolist() == [len(r.prompt_ids) + len(r.completion_ids) for r in rows]
    total = int(per_row.sum())
    groups = _row_groups(per_row, total // 3 + 1)
    assert len(groups) == 3 and groups[0][0] == 0 and groups[-1][1] == len(rows)
    assert all(a[1] == b[0] for a, b in zip(groups, groups[1:], strict=False))  # consecutive, in order
    sizes = [int(per_row[a:b].sum()) for a, b in groups]
    assert max(sizes) - min(sizes) <= 2 * int(per_row.max())
    assert _row_groups(per_row, 10**9) == [(0, len(rows))] and _row_groups(per_row[:0], 10) == [(0, 0)]


def test_the_builder_refuses_bad_values_at_the_row_that_carries_them():
    b = BatchBuilder("c", 0)
    b.add_turn("t", "tr", 0, 0, 0, "v", "action", (1, 2), (5, 6), (-0.1, -0.2), 1, 0.5, 0.0, "stop")
    with pytest.raises(BatchError, match="'completion_ids' has a value outside int32: 2147483648"):
        b.add_turn("t", "tr", 0, 1, 0, "v", "action", (1,), (2**31,), (-0.1,), 1, 0.5, 0.0, "stop")
    with pytest.raises(BatchError, match="loss_mask entries must be 0 or 1, got 3"):
        b.add_turn("t", "tr", 0, 1, 0, "v", "action", (1,), (2,), (-0.1,), 3, 0.5, 0.0, "stop")
    with pytest.raises(BatchError, match="actor row 1 has 1 completion ids but 2 logprobs"):
        b.add_turn("t", "tr", 0, 1, 0, "v", "action", (1,), (2,), (-0.1, -0.2), 1, 0.5, 0.0, "stop")
    b.add_checkpoint("t", "tr", 0, (1, 2), 0.5, 1.0, None)
    with pytest.raises(BatchError, match="'context_ids' has a value '1'"):
        b.add_checkpoint("t", "tr", 1, ("1",), 0.5, 1.0, None)
    batch = b.build({"transitions": 1})
    assert len(batch.actor) == 1 and len(batch.critic) == 1  # the refused rows left nothing behind
    assert batch.actor[0].loss_mask == (1, 1) and batch.critic[0].context_ids == (1, 2)


def test_a_columnar_batch_keeps_rows_and_tables_apart_from_a_row_batch():
    batch = _branching_batch(seed=4)
    built = Batch.from_rows(batch.collection_id, batch.iteration, batch.actor, batch.critic, dict(batch.stats))
    assert built == batch and built.n_tokens == batch.n_tokens > 0
    assert built.actor_table is built.actor_table  # stored, not rebuilt
    again = Batch(batch.collection_id, batch.iteration, built.actor_table, built.critic_table, {})
    assert again.actor == batch.actor and again.summary()["tasks"] == batch.summary()["tasks"]
    with pytest.raises(BatchError, match="batch schema"):
        Batch("c", 0, built.critic_table, built.critic_table)
    empty = BatchBuilder("c", 0).build()
    assert empty.actor == [] and empty.critic == [] and empty.actor_table.num_rows == 0
