"""The batch's Parquet schema and the conversions between rows and Arrow tables.

The schema is the contract with trainers and query tools (DuckDB, polars); every
column is documented in ``docs/batch-schema.md``. Token ids are ``int32`` (every
tokenizer in use has fewer than 2^31 ids), behaviour log-probs are ``float64`` so that
the values read back are exactly those the sampler returned, and loss masks are
``int8``. Rows become columns without a Python step per value: each row's numbers are
packed by one ``struct`` call, columns are assembled from numpy offsets and values, and a
token tuple shared by several rows is converted once (:class:`TokenPool`), because a batch
holds millions of token ids and converting them is most of a write.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from focus.batch import ActorRow, CriticRow
from storage.errors import SchemaError

#: 2: the actor table gained ``truncated``.
SCHEMA_VERSION = 2

_TOKEN = pa.int32()
_I32 = np.iinfo(np.int32)

ACTOR_SCHEMA = pa.schema(
    [
        pa.field("collection_id", pa.string(), nullable=False),
        pa.field("iteration", pa.int64(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("tree_id", pa.string(), nullable=False),
        pa.field("node_id", pa.int64(), nullable=False),
        pa.field("edge_id", pa.int64(), nullable=False),
        pa.field("turn_index", pa.int32(), nullable=False),
        pa.field("policy_version", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("prompt_ids", pa.list_(pa.field("item", _TOKEN, nullable=False)), nullable=False),
        pa.field("completion_ids", pa.list_(pa.field("item", _TOKEN, nullable=False)), nullable=False),
        pa.field("logprobs", pa.list_(pa.field("item", pa.float64(), nullable=False)), nullable=False),
        pa.field("loss_mask", pa.list_(pa.field("item", pa.int8(), nullable=False)), nullable=False),
        pa.field("advantage", pa.float64(), nullable=False),
        pa.field("reward", pa.float64(), nullable=False),
        pa.field("finish_reason", pa.string(), nullable=False),
        pa.field("truncated", pa.bool_(), nullable=False),
    ],
    metadata={"focus.table": "actor", "focus.schema_version": str(SCHEMA_VERSION)},
)

CRITIC_SCHEMA = pa.schema(
    [
        pa.field("collection_id", pa.string(), nullable=False),
        pa.field("iteration", pa.int64(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("tree_id", pa.string(), nullable=False),
        pa.field("node_id", pa.int64(), nullable=False),
        pa.field("context_ids", pa.list_(pa.field("item", _TOKEN, nullable=False)), nullable=False),
        pa.field("target", pa.float64(), nullable=False),
        pa.field("weight", pa.float64(), nullable=False),
        pa.field("prediction", pa.float64(), nullable=True),
    ],
    metadata={"focus.table": "critic", "focus.schema_version": str(SCHEMA_VERSION)},
)

SCHEMAS = {"actor": ACTOR_SCHEMA, "critic": CRITIC_SCHEMA}


#: struct codes of the list value types; struct packs a tuple of Python numbers faster than
#: ``np.fromiter`` (one C loop over an argument tuple instead of an iterator protocol per item).
_CODES = {np.dtype(np.int32): "i", np.dtype(np.float64): "d", np.dtype(np.int8): "b"}


def _offsets(seqs: Sequence[Sequence[Any]], column: str) -> np.ndarray:
    offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, seqs), dtype=np.int64, count=len(seqs)), out=offsets[1:])
    if int(offsets[-1]) > _I32.max:
        raise SchemaError(f"column {column!r} holds {int(offsets[-1])} values in one file; lower rows_per_file")
    return offsets


def _values(seqs: Sequence[Sequence[Any]], dtype: Any, column: str) -> np.ndarray:
    """The numbers of ``seqs`` back to back, as one numpy array of ``dtype``.

    Packed row by row with :mod:`struct`. If a row does not pack (a value out of range,
    not a number, a float among ints), :class:`SchemaError` names the column and the cause.
    """
    dt = np.dtype(dtype)
    code = _CODES[dt]
    # One compiled Struct per row length: struct's own cache holds 100 formats, fewer than
    # the lengths in a column, and recompiling a format costs more than packing a row.
    packers: dict[int, struct.Struct] = {}
    chunks: list[bytes] = []
    try:
        for s in seqs:
            packer = packers.get(len(s))
            if packer is None:
                packer = packers[len(s)] = struct.Struct(f"{len(s)}{code}")
            chunks.append(packer.pack(*s))
        return np.frombuffer(b"".join(chunks), dtype=dt)
    except (struct.error, TypeError, OverflowError):
        pass
    count = sum(map(len, seqs))
    try:
        np.fromiter(itertools.chain.from_iterable(seqs), dtype=dt, count=count)
    except OverflowError as e:
        raise SchemaError(f"column {column!r} has a value outside {dt.name}: {e}") from None
    except (TypeError, ValueError) as e:
        raise SchemaError(f"column {column!r} has a non-numeric value: {e}") from None
    # numpy converted what struct refused (it truncates floats to ints): name the value
    one = struct.Struct(code)
    for v in itertools.chain.from_iterable(seqs):
        try:
            one.pack(v)
        except (struct.error, TypeError, OverflowError) as e:
            raise SchemaError(
                f"column {column!r} has a value {v!r} ({type(v).__name__}) that is not {dt.name}: {e}"
            ) from None
    raise SchemaError(f"column {column!r} could not be converted to {dt.name}")


def _list_array(seqs: Sequence[Sequence[Any]], value_type: pa.DataType, dtype: Any, column: str) -> pa.Array:
    """A list column from Python sequences, built from numpy offsets and values in one pass."""
    offsets = _offsets(seqs, column)
    values = _values(seqs, dtype, column)
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values, type=value_type))


def _mask_array(seqs: Sequence[Sequence[int]], column: str) -> pa.Array:
    """A loss-mask list column. The collector gives every token of a turn the turn's one flag,
    so a row is usually one value repeated: ``tuple.count`` checks that at C speed (small
    ints are shared objects) and numpy repeats the flag, instead of converting each entry."""
    firsts = [s[0] if len(s) else 0 for s in seqs]
    uniform = all(type(s) is tuple for s in seqs) and all(type(f) in (int, bool) for f in firsts)
    if uniform and all(s.count(f) == len(s) for s, f in zip(seqs, firsts, strict=True)):
        try:
            flags = np.array(firsts, dtype=np.int8)
        except (OverflowError, TypeError, ValueError):
            pass  # _values names the bad entry
        else:
            offsets = _offsets(seqs, column)
            values = np.repeat(flags, np.diff(offsets))
            return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values, type=pa.int8()))
    return _list_array(seqs, pa.int8(), np.int8, column)


class TokenPool:
    """Token-id sequences already converted while building the tables of one batch.

    Converting Python ints is most of the cost of turning rows into Arrow columns, and the
    same id tuple object recurs: sibling branches send their checkpoint's very prefix, and a
    critic row's context is the tuple the first turn after that checkpoint was sent (pickling
    keeps that sharing). A sequence met again, by object identity, is copied inside numpy
    instead. Identity, not equality: looking an object up costs the same whatever its
    length, and the pool keeps every sequence it has seen alive, so ids stay unique.
    """

    def __init__(self) -> None:
        self._at: dict[int, tuple[np.ndarray, int]] = {}
        self._keep: list[Sequence[Sequence[int]]] = []

    def find(self, keys: list[int]) -> list[tuple[np.ndarray, int] | None]:
        """Where each sequence (by ``id()``) was converted before, ``None`` if it was not."""
        return list(map(self._at.get, keys))

    def add(self, seqs: Sequence[Sequence[int]], values: np.ndarray, starts: dict[int, int]) -> None:
        self._keep.append(seqs)
        for key, start in starts.items():
            self._at.setdefault(key, (values, start))


def _token_array(seqs: Sequence[Sequence[int]], column: str, pool: TokenPool | None) -> pa.Array:
    """A token-id list column; each distinct sequence object is converted once (see :class:`TokenPool`)."""
    offsets = _offsets(seqs, column)
    keys = list(map(id, seqs))
    hits = pool.find(keys) if pool is not None else [None] * len(seqs)
    if len(set(keys)) == len(keys) and not any(hits):  # nothing repeats: convert the column as it is
        values = _values(seqs, np.int32, column)
        if pool is not None:
            pool.add(seqs, values, dict(zip(keys, offsets[:-1].tolist(), strict=True)))
        return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values, type=_TOKEN))
    pieces: list[tuple[np.ndarray | None, int, int]] = []  # per row: source (None: this call's), start, length
    fresh: list[Sequence[int]] = []
    starts: dict[int, int] = {}  # id() of a sequence converted here -> its start in ``values``
    n = 0
    for s, key, hit in zip(seqs, keys, hits, strict=True):
        if hit is not None:
            pieces.append((hit[0], hit[1], len(s)))
            continue
        start = starts.get(key)
        if start is None:
            start = starts[key] = n
            fresh.append(s)
            n += len(s)
        pieces.append((None, start, len(s)))
    values = _values(fresh, np.int32, column)
    if pool is not None:
        pool.add(seqs, values, starts)
    values = np.concatenate([(values if a is None else a)[i : i + k] for a, i, k in pieces] or [values])
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values, type=_TOKEN))


def _check_actor_shapes(table: pa.Table, where: str) -> None:
    """Every row has one log-prob and one mask entry per completion token; masks are 0/1."""
    if not table.num_rows:
        return
    n = pc.list_value_length(table.column("completion_ids"))
    for other in ("logprobs", "loss_mask"):
        bad = pc.not_equal(n, pc.list_value_length(table.column(other)))
        if pc.any(bad).as_py():
            i = pc.index(bad, True).as_py()
            raise SchemaError(
                f"{where}: actor row {i} has {n[i].as_py()} completion ids but "
                f"{pc.list_value_length(table.column(other))[i].as_py()} {other} entries; they must match"
            )
    mask = pc.list_flatten(table.column("loss_mask"))
    if len(mask) and pc.any(pc.and_(pc.not_equal(mask, 0), pc.not_equal(mask, 1))).as_py():
        raise SchemaError(f"{where}: loss_mask entries must be 0 or 1")


def actor_table(rows: Sequence[ActorRow], pool: TokenPool | None = None) -> pa.Table:
    """The actor rows as a table of :data:`ACTOR_SCHEMA`; :class:`SchemaError` for bad shapes.

    Tables built with the same ``pool`` convert a shared token-id tuple once.
    """
    cols: dict[str, pa.Array] = {
        "collection_id": pa.array([r.collection_id for r in rows], pa.string()),
        "iteration": pa.array([r.iteration for r in rows], pa.int64()),
        "task_id": pa.array([r.task_id for r in rows], pa.string()),
        "tree_id": pa.array([r.tree_id for r in rows], pa.string()),
        "node_id": pa.array([r.node_id for r in rows], pa.int64()),
        "edge_id": pa.array([r.edge_id for r in rows], pa.int64()),
        "turn_index": pa.array([r.turn_index for r in rows], pa.int32()),
        "policy_version": pa.array([r.policy_version for r in rows], pa.string()),
        "kind": pa.array([r.kind for r in rows], pa.string()),
        "prompt_ids": _token_array([r.prompt_ids for r in rows], "prompt_ids", pool),
        "completion_ids": _token_array([r.completion_ids for r in rows], "completion_ids", pool),
        "logprobs": _list_array([r.logprobs for r in rows], pa.float64(), np.float64, "logprobs"),
        "loss_mask": _mask_array([r.loss_mask for r in rows], "loss_mask"),
        "advantage": pa.array([r.advantage for r in rows], pa.float64()),
        "reward": pa.array([r.reward for r in rows], pa.float64()),
        "finish_reason": pa.array([r.finish_reason for r in rows], pa.string()),
        "truncated": pa.array([r.truncated for r in rows], pa.bool_()),
    }
    table = pa.Table.from_arrays(list(cols.values()), schema=ACTOR_SCHEMA)
    _check_actor_shapes(table, "batch")
    return table


def critic_table(rows: Sequence[CriticRow], pool: TokenPool | None = None) -> pa.Table:
    cols = [
        pa.array([r.collection_id for r in rows], pa.string()),
        pa.array([r.iteration for r in rows], pa.int64()),
        pa.array([r.task_id for r in rows], pa.string()),
        pa.array([r.tree_id for r in rows], pa.string()),
        pa.array([r.node_id for r in rows], pa.int64()),
        _token_array([r.context_ids for r in rows], "context_ids", pool),
        pa.array([r.target for r in rows], pa.float64()),
        pa.array([r.weight for r in rows], pa.float64()),
        pa.array([r.prediction for r in rows], pa.float64()),
    ]
    return pa.Table.from_arrays(cols, schema=CRITIC_SCHEMA)


def validate(table: pa.Table, kind: str, where: str) -> pa.Table:
    """``table`` cast to the exact schema of ``kind``, or :class:`SchemaError` naming what differs.

    Column order and Parquet's nullability flags are not significant (other writers,
    e.g. polars or DuckDB, may drop them); names, types, nulls and per-row list lengths are.
    """
    schema = SCHEMAS[kind]
    names = set(table.schema.names)
    missing = [f.name for f in schema if f.name not in names]
    extra = sorted(names - set(schema.names))
    if missing or extra:
        raise SchemaError(
            f"{where}: {kind} table columns differ from schema v{SCHEMA_VERSION}: missing {missing}, unexpected {extra}"
        )
    version = (table.schema.metadata or {}).get(b"focus.schema_version")
    if version is not None and version.decode() != str(SCHEMA_VERSION):
        raise SchemaError(
            f"{where}: written with schema version {version.decode()}, this reader knows {SCHEMA_VERSION}"
        )
    cols = []
    for f in schema:
        col = table.column(f.name)
        got = col.type
        if not _same_type(got, f.type):
            raise SchemaError(f"{where}: {kind} column {f.name!r} has type {got}, expected {f.type}")
        if not f.nullable and col.null_count:
            raise SchemaError(f"{where}: {kind} column {f.name!r} has {col.null_count} null value(s)")
        if pa.types.is_list(f.type) and col.null_count == 0 and pc.sum(pc.list_value_length(col).is_null()).as_py():
            raise SchemaError(f"{where}: {kind} column {f.name!r} has null lists")
        cols.append(col.cast(f.type) if got != f.type else col)
    out = pa.Table.from_arrays(cols, schema=schema)
    if kind == "actor":
        _check_actor_shapes(out, where)
    return out


def _same_type(got: pa.DataType, want: pa.DataType) -> bool:
    if pa.types.is_list(want) or pa.types.is_large_list(want):
        return (pa.types.is_list(got) or pa.types.is_large_list(got)) and got.value_type == want.value_type
    return got == want or (pa.types.is_string(want) and (pa.types.is_large_string(got) or pa.types.is_dictionary(got)))


def _lists(col: pa.ChunkedArray, cast: type) -> list[tuple[Any, ...]]:
    arr = col.combine_chunks()
    if not len(arr):
        return []
    offsets = arr.offsets.to_numpy()
    flat = arr.values.slice(offsets[0], offsets[-1] - offsets[0]).to_numpy(zero_copy_only=False).tolist()
    base = offsets[0]
    o = (offsets - base).tolist()
    return [tuple(flat[o[i] : o[i + 1]]) for i in range(len(arr))]


def actor_rows(table: pa.Table) -> list[ActorRow]:
    """Typed rows of a validated actor table."""
    c = {name: table.column(name) for name in ACTOR_SCHEMA.names}
    scalars = {
        k: c[k].to_pylist()
        for k in (
            "collection_id",
            "iteration",
            "task_id",
            "tree_id",
            "node_id",
            "edge_id",
            "turn_index",
            "policy_version",
            "kind",
            "advantage",
            "reward",
            "finish_reason",
            "truncated",
        )
    }
    lists = {
        k: _lists(c[k], int if k != "logprobs" else float)
        for k in ("prompt_ids", "completion_ids", "logprobs", "loss_mask")
    }
    return [
        ActorRow(
            collection_id=scalars["collection_id"][i],
            iteration=scalars["iteration"][i],
            task_id=scalars["task_id"][i],
            tree_id=scalars["tree_id"][i],
            node_id=scalars["node_id"][i],
            edge_id=scalars["edge_id"][i],
            turn_index=scalars["turn_index"][i],
            policy_version=scalars["policy_version"][i],
            prompt_ids=lists["prompt_ids"][i],
            completion_ids=lists["completion_ids"][i],
            logprobs=lists["logprobs"][i],
            loss_mask=lists["loss_mask"][i],
            advantage=scalars["advantage"][i],
            reward=scalars["reward"][i],
            finish_reason=scalars["finish_reason"][i],
            kind=scalars["kind"][i],
            truncated=scalars["truncated"][i],
        )
        for i in range(table.num_rows)
    ]


def critic_rows(table: pa.Table) -> list[CriticRow]:
    """Typed rows of a validated critic table."""
    s = {k: table.column(k).to_pylist() for k in CRITIC_SCHEMA.names if k != "context_ids"}
    ctx = _lists(table.column("context_ids"), int)
    return [
        CriticRow(
            collection_id=s["collection_id"][i],
            iteration=s["iteration"][i],
            task_id=s["task_id"][i],
            tree_id=s["tree_id"][i],
            node_id=s["node_id"][i],
            context_ids=ctx[i],
            target=s["target"][i],
            weight=s["weight"][i],
            prediction=s["prediction"][i],
        )
        for i in range(table.num_rows)
    ]
