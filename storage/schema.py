"""The batch's Parquet schema on the storage side: checking tables read from files.

The schema itself - :data:`ACTOR_SCHEMA`, :data:`CRITIC_SCHEMA`, documented column by
column in ``docs/batch-schema.md`` - lives with the batch in :mod:`focus.batch`, which
builds the columns (the collector fills them as it prepares a batch); this module
re-exports it and checks what other writers may have produced: :func:`validate` casts a
table read back to the exact schema, or names what differs. Token ids are ``int32``
(every tokenizer in use has fewer than 2^31 ids), behaviour log-probs ``float64`` so
that the values read back are exactly those the sampler returned, loss masks ``int8``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from focus.batch import (
    ACTOR_SCHEMA,
    CRITIC_SCHEMA,
    SCHEMA_VERSION,
    ActorRow,
    BatchBuilder,
    BatchError,
    CriticRow,
    actor_rows,
    critic_rows,
)
from storage.errors import SchemaError

__all__ = [
    "ACTOR_SCHEMA",
    "CRITIC_SCHEMA",
    "SCHEMAS",
    "SCHEMA_VERSION",
    "actor_rows",
    "actor_table",
    "critic_rows",
    "critic_table",
    "validate",
]

SCHEMAS = {"actor": ACTOR_SCHEMA, "critic": CRITIC_SCHEMA}


def actor_table(rows: Sequence[ActorRow]) -> pa.Table:
    """Typed actor rows as a table of :data:`ACTOR_SCHEMA`; :class:`SchemaError` for bad values."""
    return _tables(rows, [])[0]


def critic_table(rows: Sequence[CriticRow]) -> pa.Table:
    """Typed critic rows as a table of :data:`CRITIC_SCHEMA`; :class:`SchemaError` for bad values."""
    return _tables([], rows)[1]


def _tables(actor: Sequence[ActorRow], critic: Sequence[CriticRow]) -> tuple[pa.Table, pa.Table]:
    first = actor[0] if actor else critic[0] if critic else None
    builder = BatchBuilder(first.collection_id, first.iteration) if first else BatchBuilder("", 0)
    try:
        return builder.add_rows(actor, critic).tables()
    except BatchError as e:
        raise SchemaError(str(e)) from None


#: 0 and 1 as Arrow int8 scalars, made from a buffer: a Python 0 given to a compute
#: function is converted with ``pa.scalar``, which imports pandas the first time
#: (pyarrow's pandas shim, 0.2-0.3 CPU-s a process that writes a batch).
_ZERO, _ONE = pa.Array.from_buffers(pa.int8(), 2, [None, pa.py_buffer(np.array([0, 1], dtype=np.int8))])


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
    if len(mask) and pc.any(pc.and_(pc.not_equal(mask, _ZERO), pc.not_equal(mask, _ONE))).as_py():
        raise SchemaError(f"{where}: loss_mask entries must be 0 or 1")


#: What each earlier schema version lacks, for the refusal of a batch it wrote.
OLDER_VERSIONS = {1: "version 1 has no actor column 'truncated'"}


def version_refused(where: str, version: object) -> SchemaError:
    """The refusal of a batch of another schema version: what differs, and that its
    Parquet files still read with the query tools (docs/batch-schema.md)."""
    differs = OLDER_VERSIONS.get(int(str(version))) if str(version).isdigit() else None
    return SchemaError(
        f"{where}: batch written with schema version {version}, this reader knows {SCHEMA_VERSION}"
        + (f" ({differs}); its Parquet files read as they are with DuckDB, polars or datasets" if differs else "")
    )


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
        raise version_refused(where, version.decode())
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
