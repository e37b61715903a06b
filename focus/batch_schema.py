"""The batch's contract with trainers and query tools: the Arrow schemas of its two
tables, the typed rows most code reads, and the conversion from columns to rows.

The columns are documented in ``docs/batch-schema.md``; :data:`ACTOR_SCHEMA` and
:data:`CRITIC_SCHEMA` are what ``storage`` writes and checks. :mod:`focus.batch` holds
the batch itself and its builder.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from focus.reprs import short_repr

#: 2: the actor table gained ``truncated``.
SCHEMA_VERSION = 2

_TOKEN = pa.int32()


def _list(value: pa.DataType) -> pa.DataType:
    return pa.list_(pa.field("item", value, nullable=False))


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
        pa.field("prompt_ids", _list(_TOKEN), nullable=False),
        pa.field("completion_ids", _list(_TOKEN), nullable=False),
        pa.field("logprobs", _list(pa.float64()), nullable=False),
        pa.field("loss_mask", _list(pa.int8()), nullable=False),
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
        pa.field("context_ids", _list(_TOKEN), nullable=False),
        pa.field("target", pa.float64(), nullable=False),
        pa.field("weight", pa.float64(), nullable=False),
        pa.field("prediction", pa.float64(), nullable=True),
    ],
    metadata={"focus.table": "critic", "focus.schema_version": str(SCHEMA_VERSION)},
)


class BatchError(ValueError):
    """A value that does not fit the batch schema; the message names the column and the value."""


@dataclass(frozen=True)
class ActorRow:
    __repr__ = short_repr
    collection_id: str
    iteration: int
    task_id: str
    tree_id: str
    node_id: int  # the segment's parent checkpoint
    edge_id: int
    turn_index: int  # position of the turn inside its segment
    policy_version: str
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    loss_mask: tuple[int, ...]  # one per completion token
    advantage: float
    reward: float  # reward of the transition this turn caused
    finish_reason: str
    kind: str = "action"  # or "compaction"
    #: The segment ends in a truncated leaf (step or context limit): its advantage
    #: bootstraps from the critic there, or counts the leaf as terminal (the
    #: estimator's ``truncation``).
    truncated: bool = False


@dataclass(frozen=True)
class CriticRow:
    __repr__ = short_repr
    collection_id: str
    iteration: int
    task_id: str
    tree_id: str
    node_id: int
    context_ids: tuple[int, ...]
    target: float
    weight: float
    prediction: float | None


#: Arrow's fixed-width types read (:func:`numpy_of`) and built (focus.batch_columns) from
#: numpy buffers, with their dtypes.
_NUMPY: dict[pa.DataType, np.dtype] = {
    pa.int8(): np.dtype(np.int8),
    pa.int32(): np.dtype(np.int32),
    pa.int64(): np.dtype(np.int64),
    pa.float64(): np.dtype(np.float64),
}


def numpy_of(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """``values.to_numpy(zero_copy_only=False)`` for a column of int8, int32, int64 or
    float64 without nulls, read from its buffers (``to_numpy`` imports pandas the first
    time); any other column goes to ``to_numpy``."""
    chunks = values.chunks if isinstance(values, pa.ChunkedArray) else [values]
    dtype = _NUMPY.get(values.type)
    if dtype is None or any(c.null_count for c in chunks):
        return values.to_numpy(zero_copy_only=False)
    parts = [np.frombuffer(c.buffers()[1], dtype=dtype, count=len(c), offset=c.offset * dtype.itemsize) for c in chunks]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


def _lists(col: pa.ChunkedArray) -> list[tuple[Any, ...]]:
    # numpy_of, not to_numpy: to_numpy imports pandas on first use (0.2-0.3 CPU-s a process)
    out: list[tuple[Any, ...]] = []
    for arr in col.chunks:
        if not len(arr):
            continue
        offsets = numpy_of(arr.offsets)
        flat = numpy_of(arr.values.slice(offsets[0], offsets[-1] - offsets[0])).tolist()
        o = (offsets - offsets[0]).tolist()
        out += [tuple(flat[o[i] : o[i + 1]]) for i in range(len(arr))]
    return out


def actor_rows(table: pa.Table) -> list[ActorRow]:
    """Typed rows of an actor table of :data:`ACTOR_SCHEMA`."""
    names = [f.name for f in ACTOR_SCHEMA]
    cols = [
        _lists(table.column(k)) if pa.types.is_list(ACTOR_SCHEMA.field(k).type) else table.column(k).to_pylist()
        for k in names
    ]
    return [ActorRow(**dict(zip(names, values, strict=True))) for values in zip(*cols, strict=True)]


def critic_rows(table: pa.Table) -> list[CriticRow]:
    """Typed rows of a critic table of :data:`CRITIC_SCHEMA`."""
    names = [f.name for f in CRITIC_SCHEMA]
    cols = [_lists(table.column(k)) if k == "context_ids" else table.column(k).to_pylist() for k in names]
    return [CriticRow(**dict(zip(names, values, strict=True))) for values in zip(*cols, strict=True)]
