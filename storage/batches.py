"""The batch store: one collection iteration as Parquet tables under a URL.

Layout under the store root::

    batches/<collection_id>/iter-<iteration:06d>/
        actor/part-00000.parquet ...   one row per model turn
        critic/part-00000.parquet ...  one row per checkpoint
        stats.json                     the collection's statistics
        _manifest.json                 written last; lists every file with size and SHA-256

A batch exists exactly when its manifest does. Writing is idempotent: the same actor
and critic content written again is a no-op (statistics such as wall time may differ
between reruns and do not count), and different content at the same URL is refused
unless ``overwrite=True``, so a finished batch is never silently replaced. Part files
left by an interrupted write are replaced or removed before the manifest goes out.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from focus.batch import ActorRow, Batch, CriticRow
from storage.errors import (
    BatchExistsError,
    BatchNotFound,
    CorruptDataError,
    ManifestError,
    SchemaError,
)
from storage.manifest import FileEntry, Manifest, dumps_json, sha256
from storage.schema import (
    SCHEMA_VERSION,
    actor_rows,
    actor_table,
    check_rows,
    critic_rows,
    critic_table,
    validate,
)
from storage.urls import Location, Retry, check_id

MANIFEST = "_manifest.json"
STATS = "stats.json"
#: Parquet settings of every table the store writes (the benchmark's yardstick uses the same).
PARQUET_OPTIONS: dict[str, Any] = {"compression": "zstd", "compression_level": 3, "use_dictionary": True}


@dataclass(frozen=True)
class BatchTables:
    """A batch as Arrow tables (for query engines and trainers that want columns)."""

    url: str
    manifest: Manifest
    actor: pa.Table
    critic: pa.Table
    stats: dict[str, Any]


class BatchStore:
    """Writes and reads training batches under ``root`` (any fsspec URL or a plain path).

    ``storage_options`` go to fsspec (for s3: ``endpoint_url``, ``key`` ...; by default
    s3fs reads the ``AWS_*`` environment variables). ``retry`` bounds every network call.
    ``rows_per_file`` splits large tables into several Parquet files.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        storage_options: dict[str, Any] | None = None,
        retry: Retry | None = None,
        rows_per_file: int = 100_000,
    ) -> None:
        if rows_per_file < 1:
            raise ValueError("rows_per_file must be at least 1")
        self.loc = Location(root, storage_options)
        self.retry = retry or Retry()
        self.rows_per_file = rows_per_file

    @property
    def root(self) -> str:
        return self.loc.root

    def __repr__(self) -> str:
        return f"BatchStore({self.root!r})"

    def url_for(self, collection_id: str, iteration: int) -> str:
        check_id(collection_id, "collection id")
        if not isinstance(iteration, int) or iteration < 0:
            raise ValueError(f"iteration must be a non-negative int, got {iteration!r}")
        return self.loc.url("batches", collection_id, f"iter-{iteration:06d}")

    # --- writing ----------------------------------------------------------------------

    def encode(self, batch: Batch) -> list[tuple[str, bytes, int | None]]:
        """The files of ``batch`` as (relative path, bytes, rows), without writing anything."""
        rows: list[ActorRow | CriticRow] = [*batch.actor, *batch.critic]
        for i, r in enumerate(rows):
            if r.collection_id != batch.collection_id or r.iteration != batch.iteration:
                what = "actor" if i < len(batch.actor) else "critic"
                index = i if i < len(batch.actor) else i - len(batch.actor)
                raise SchemaError(
                    f"{what} row {index} belongs to collection {r.collection_id!r} iteration {r.iteration}, "
                    f"but the batch is {batch.collection_id!r} iteration {batch.iteration}"
                )
        check_rows(batch.actor, batch.critic)
        n = self.rows_per_file
        files: list[tuple[str, bytes, int | None]] = []
        actor_parts = [batch.actor[i : i + n] for i in range(0, len(batch.actor), n)] or [[]]
        critic_parts = [batch.critic[i : i + n] for i in range(0, len(batch.critic), n)] or [[]]
        for k, a in enumerate(actor_parts):
            files.append((f"actor/part-{k:05d}.parquet", parquet_bytes(actor_table(a)), len(a)))
        for k, c in enumerate(critic_parts):
            files.append((f"critic/part-{k:05d}.parquet", parquet_bytes(critic_table(c)), len(c)))
        files.append((STATS, dumps_json(batch.stats), None))
        return files

    def write(self, batch: Batch, *, overwrite: bool = False) -> str:
        """Write ``batch``; return its URL. Idempotent; see the module docstring."""
        url = self.url_for(batch.collection_id, batch.iteration)
        files = self.encode(batch)
        entries = tuple(FileEntry(path, len(data), sha256(data), rows) for path, data, rows in files)
        fingerprint = sha256("\n".join(f"{e.path}:{e.sha256}" for e in entries if e.path != STATS).encode())
        manifest_url = f"{url}/{MANIFEST}"
        try:
            existing = self.manifest(url)
        except BatchNotFound:
            existing = None
        except ManifestError as e:
            if not overwrite:
                raise ManifestError(f"{e}; refusing to write over it (pass overwrite=True to replace it)") from e
            existing = None
        if existing is not None:
            if existing.fingerprint == fingerprint:
                return url
            if not overwrite:
                raise BatchExistsError(
                    f"{url} already holds a different batch ({existing.info.get('summary', {}).get('actor_rows')} actor rows, "
                    f"written {existing.created_at}); pass overwrite=True to replace it"
                )
        if existing is not None or overwrite:
            self.loc.remove(manifest_url, self.retry)  # the old batch stops existing before its files change
        for path, data, _ in files:
            self.loc.put_bytes(f"{url}/{path}", data, self.retry)
        keep = {f"{url}/{path}" for path, _, _ in files} | {manifest_url}
        for stale in self.loc.list_files(url, self.retry):
            if stale not in keep:
                self.loc.remove(stale, self.retry)
        manifest = Manifest(
            kind="batch",
            collection_id=batch.collection_id,
            files=entries,
            fingerprint=fingerprint,
            schema_version=SCHEMA_VERSION,
            created_at=datetime.now(UTC).isoformat(),
            info={"iteration": batch.iteration, "summary": batch.summary()},
        )
        self.loc.put_bytes(manifest_url, manifest.to_json(), self.retry, atomic=True)
        return url

    # --- reading ----------------------------------------------------------------------

    def manifest(self, url: str) -> Manifest:
        """The manifest of the batch at ``url``; :class:`BatchNotFound` if there is none."""
        url = url.rstrip("/")
        try:
            data = self.loc.cat(f"{url}/{MANIFEST}", self.retry)
        except FileNotFoundError:
            leftovers = self.loc.list_files(url, self.retry)
            hint = (
                f"; {len(leftovers)} file(s) without a manifest are there: a write was interrupted, write the batch again"
                if leftovers
                else ""
            )
            raise BatchNotFound(f"no batch at {url}: {MANIFEST} is missing{hint}") from None
        m = Manifest.from_json(data, f"{url}/{MANIFEST}")
        if m.kind != "batch":
            raise ManifestError(f"{url}/{MANIFEST}: describes a {m.kind!r}, not a batch")
        return m

    def exists(self, url: str) -> bool:
        return self.loc.exists(f"{url.rstrip('/')}/{MANIFEST}", self.retry)

    def read_tables(self, url: str) -> BatchTables:
        """The batch at ``url`` as validated Arrow tables; verifies every file's checksum."""
        url = url.rstrip("/")
        m = self.manifest(url)
        if m.schema_version != SCHEMA_VERSION:
            raise SchemaError(
                f"{url}: batch written with schema version {m.schema_version}, this reader knows {SCHEMA_VERSION}"
            )
        try:
            blobs = self.loc.cat_many([f"{url}/{f.path}" for f in m.files], self.retry)
        except FileNotFoundError as e:
            raise CorruptDataError(f"{url}: the manifest lists {e} but the file is missing") from None
        tables: dict[str, list[pa.Table]] = {"actor": [], "critic": []}
        stats: dict[str, Any] = {}
        for f, data in zip(m.files, blobs, strict=True):
            where = f"{url}/{f.path}"
            if len(data) != f.bytes or sha256(data) != f.sha256:
                raise CorruptDataError(
                    f"{where}: {len(data)} bytes with a checksum that differs from the manifest ({f.bytes} bytes)"
                )
            if f.path == STATS:
                stats = json.loads(data)
                continue
            kind = f.path.split("/", 1)[0]
            if kind not in tables:
                raise ManifestError(f"{url}/{MANIFEST}: unknown data file {f.path!r}")
            try:
                t = pq.read_table(pa.BufferReader(data))
            except (pa.ArrowInvalid, OSError) as e:
                raise CorruptDataError(f"{where}: not a readable Parquet file ({e})") from e
            tables[kind].append(validate(t, kind, where))
        actor = pa.concat_tables(tables["actor"]) if tables["actor"] else actor_table([])
        critic = pa.concat_tables(tables["critic"]) if tables["critic"] else critic_table([])
        return BatchTables(url, m, actor, critic, stats)

    def read(self, url: str) -> Batch:
        """The batch at ``url`` as typed rows (:class:`focus.batch.Batch`)."""
        t = self.read_tables(url)
        iteration = t.manifest.info.get("iteration")
        if not isinstance(iteration, int):
            raise ManifestError(f"{url}/{MANIFEST}: 'info.iteration' must be an int, got {iteration!r}")
        return Batch(t.manifest.collection_id, iteration, actor_rows(t.actor), critic_rows(t.critic), t.stats)

    def list(self, collection_id: str | None = None) -> list[str]:
        """URLs of every finished batch (with a manifest), optionally of one collection."""
        base = (
            self.loc.url("batches", check_id(collection_id, "collection id"))
            if collection_id
            else self.loc.url("batches")
        )
        return sorted(f.rsplit("/", 1)[0] for f in self.loc.list_files(base, self.retry) if f.endswith("/" + MANIFEST))


def parquet_bytes(table: pa.Table) -> bytes:
    """``table`` as one Parquet file in memory, with the store's settings."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, **PARQUET_OPTIONS)
    return sink.getvalue().to_pybytes()
