"""docs/batch-schema.md against a batch written by the store: every column of the actor
and critic tables (name, order, type, nullability), the manifest's fields and the
tables' key-value metadata, as a trainer or a query tool reading the doc expects them."""

from __future__ import annotations

import json
import pathlib
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_storage import batch_from_trees, grow_tree

from focus.batch_schema import SCHEMA_VERSION
from storage import BatchStore

DOC = pathlib.Path(__file__).parent.parent / "docs" / "batch-schema.md"

#: The doc's words for Arrow types.
TYPES = {
    "string": pa.string(),
    "bool": pa.bool_(),
    "int8": pa.int8(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "float64": pa.float64(),
}


def doc_type(text: str) -> tuple[pa.DataType, bool]:
    """(type, nullable) from a type cell: ``list&lt;int32&gt;``, ``float64, nullable``."""
    text = text.replace("&lt;", "<").replace("&gt;", ">").strip()
    nullable = text.endswith(", nullable")
    text = text.removesuffix(", nullable")
    if m := re.fullmatch(r"list<(\w+)>", text):
        return pa.list_(pa.field("element", TYPES[m.group(1)], nullable=False)), nullable
    return TYPES[text], nullable


def section_rows(heading: str) -> list[list[str]]:
    """The cells of the table under ``heading`` (a ``## `` line of the doc), header left out."""
    text = DOC.read_text()
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    rows = []
    for line in text[start : end if end > 0 else None].splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows[1:]


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> tuple[str, BatchStore]:
    store = BatchStore(str(tmp_path_factory.mktemp("store")))
    return store.write(batch_from_trees([grow_tree("t1"), grow_tree("t2")], "c1", 3)), store


@pytest.mark.parametrize(
    ("table", "heading"),
    [("actor", "Actor table: one row per model turn"), ("critic", "Critic table: one row per checkpoint")],
)
def test_every_documented_column_is_the_written_one(written, table, heading):
    url, store = written
    (part,) = store.parquet_files(url, table)
    schema = pq.read_schema(part.removeprefix("file://"))
    documented = [(cells[0].strip("`"), *doc_type(cells[1])) for cells in section_rows(heading)]
    got = [(f.name, f.type, f.nullable) for f in schema]
    assert [d[0] for d in documented] == [g[0] for g in got], "columns and their order"
    for (name, dtype, nullable), (_, gtype, gnull) in zip(documented, got, strict=True):
        if pa.types.is_list(dtype):  # the item field's name differs by writer ("item", "element")
            assert pa.types.is_list(gtype) and gtype.value_type == dtype.value_type, (name, gtype, dtype)
            assert not gtype.value_field.nullable, f"{name}: null items allowed in the file"
        else:
            assert gtype == dtype, f"{name}: {gtype} in the file, {dtype} in the doc"
        assert gnull == nullable, f"{name}: nullable {gnull} in the file, {nullable} in the doc"
    meta = schema.metadata
    assert meta[b"focus.table"] == table.encode() and meta[b"focus.schema_version"] == str(SCHEMA_VERSION).encode()
    assert f"# Batch schema (version {SCHEMA_VERSION})" in DOC.read_text()


def test_every_documented_manifest_field_is_written(written):
    url, _ = written
    manifest = json.loads(pathlib.Path(url.removeprefix("file://"), "_manifest.json").read_text())
    fields = {name.strip("`") for cells in section_rows("`_manifest.json`") for name in cells[0].split(", ")}
    assert fields == set(manifest)
    assert (manifest["format"], manifest["format_version"], manifest["kind"]) == ("focus-manifest", 1, "batch")
    assert manifest["schema_version"] == SCHEMA_VERSION and set(manifest["info"]) == {"iteration", "summary"}
    assert manifest["info"]["iteration"] == 3
    for f in manifest["files"]:
        assert set(f) == {"path", "bytes", "sha256", "rows"}
    paths = sorted(f["path"] for f in manifest["files"])
    assert paths == ["actor/part-00000.parquet", "critic/part-00000.parquet", "stats.json"]
