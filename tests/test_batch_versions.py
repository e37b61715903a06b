"""A batch of schema version 1 (no ``truncated`` column) as today's readers see it: FOCUS
refuses it naming what differs and where its files still read; the query tools read it,
alone or next to a version-2 batch, as docs/batch-schema.md says."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import duckdb
import polars as pl
import pyarrow.parquet as pq
import pytest
from test_exporters import multi_turn_tree
from test_storage import batch_from_trees

from storage import BatchStore, SchemaError
from storage.batches import MANIFEST
from storage.manifest import Manifest, sha256


def as_version_1(url: str) -> list[str]:
    """Rewrite the batch at ``url`` as version 1 wrote it: no ``truncated`` column, version 1
    in the files' metadata and the manifest, checksums to match. Returns its actor files."""
    root = Path(url.removeprefix("file://"))
    m = Manifest.from_json((root / MANIFEST).read_bytes(), "test")
    files = []
    for f in m.files:
        path = root / f.path
        if f.path.endswith(".parquet"):
            t = pq.read_table(path)
            t = t.drop([c for c in ("truncated",) if c in t.column_names])
            pq.write_table(t.replace_schema_metadata({**t.schema.metadata, b"focus.schema_version": b"1"}), path)
        data = path.read_bytes()
        files.append(dataclasses.replace(f, bytes=len(data), sha256=sha256(data)))
    (root / MANIFEST).write_bytes(dataclasses.replace(m, files=tuple(files), schema_version=1).to_json())
    return [str(root / f.path) for f in m.files if f.path.startswith("actor/")]


def test_a_version_1_batch_is_refused_naming_the_difference_and_read_by_the_query_tools(tmp_path):
    """The refusal said only "batch written with schema version 1, this reader knows 2":
    not what differs, nor that the files read as they are with the query tools."""
    store = BatchStore(tmp_path)
    old = as_version_1(store.write(batch_from_trees([multi_turn_tree("a")], "c1", 0)))
    new = [
        f.removeprefix("file://")
        for f in store.parquet_files(store.write(batch_from_trees([multi_turn_tree("b")], "c1", 1)), "actor")
    ]
    with pytest.raises(
        SchemaError,
        match=r"schema version 1, this reader knows 2 \(version 1 has no actor column 'truncated'\).*DuckDB",
    ):
        store.read(f"file://{tmp_path}/batches/c1/iter-000000")
    n_old, n_new = pl.read_parquet(old).height, pl.read_parquet(new).height
    with pytest.raises(pl.exceptions.SchemaError):  # polars reads one schema: the first file's
        pl.read_parquet(old + new)
    both = pl.concat([pl.read_parquet(old), pl.read_parquet(new)], how="diagonal")
    assert both.height == n_old + n_new and both["truncated"].null_count() == n_old
    got = duckdb.sql(
        "select count(*), count(truncated) from read_parquet($f, union_by_name=true)", params={"f": old + new}
    ).fetchall()
    assert got == [(n_old + n_new, n_new)]
