"""The batch store: one collection iteration as Parquet tables under a URL.

Layout under the store root::

    batches/<collection_id>/iter-<iteration:06d>/
        actor/part-00000.parquet ...   one row per model turn
        critic/part-00000.parquet ...  one row per checkpoint
        stats.json                     the collection's statistics
        _manifest.json                 lists every file with size and SHA-256
    _staging/<collection_id>/iter-<iteration:06d>/w-<random>/
        ...                            the same files while a write is in progress

A batch exists exactly when its manifest does, and its folder never holds a file of an
unfinished write: files are staged outside ``batches/`` and published once all are
written (:meth:`BatchStore._publish`), so a reader that globs the batch folder, as
DuckDB, polars and ``datasets`` users do, does not meet half a batch. Writing is
idempotent: the same actor and critic content written again is a no-op (statistics
such as wall time may differ between reruns and do not count), and different content
at the same URL is refused unless ``overwrite=True``, so a finished batch is never
silently replaced. What an interrupted write left is removed by the next write of the
batch; each write stages in a folder of its own, so a write never touches the files of
another (a run that lost its write lease, still writing beside the run that took it
over), and removes its folder when it fails. The batch comes as Arrow columns (:mod:`focus.batch`; the collector builds them
as it prepares the batch), so writing is Parquet encoding, checksums and the manifest.
Records about a store name its batches relative to its root (:meth:`BatchStore.ref`,
:meth:`BatchStore.locate`), so a store can be copied or moved.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import secrets
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from focus.batch import Batch, BatchError
from focus.batch_columns import arrow_scalar
from focus.batch_schema import numpy_of
from storage.errors import (
    BatchExistsError,
    BatchNotFound,
    CorruptDataError,
    ManifestError,
    SchemaError,
    StorageUnavailable,
)
from storage.lease import check_writer
from storage.manifest import FileEntry, Manifest, dumps_json, sha256
from storage.schema import ACTOR_SCHEMA, CRITIC_SCHEMA, SCHEMA_VERSION, SCHEMAS, validate, version_refused
from storage.urls import Location, Retry, check_id

T = TypeVar("T")
log = logging.getLogger(__name__)

MANIFEST = "_manifest.json"
STATS = "stats.json"
#: The folder under the root where writes stage their files (outside ``batches/``).
STAGING = "_staging"
#: Suffix of the staging name an overwritten local batch is renamed to before it is deleted.
_REPLACED = ".replaced"
_ID_STRINGS = ["collection_id", "task_id", "tree_id", "policy_version", "kind", "finish_reason"]
#: The only list of floats: the one column whose values BYTE_STREAM_SPLIT encodes.
_FLOAT_VALUES = ["logprobs.list.element"]
#: Parquet settings of every table the store writes (documented in docs/batch-schema.md).
#: - zstd level 1: on token ids and log-probs level 3 saves under 0.3% and costs ~40% more time.
#: - Dictionary encoding only for the id strings: on token-id lists it costs a dictionary per
#:   row group and loses to plain zstd.
#: - BYTE_STREAM_SPLIT for log-probs only (floats: every Parquet reader of the last years
#:   knows it). On the integer token ids it saved 10% on the benchmark's synthetic batch
#:   (uniform ids: 1.54 against 1.72 bytes per token) but cost 6-10% on a real one (the
#:   tiny model's), and integer BYTE_STREAM_SPLIT is a 2024 addition to the format that
#:   DuckDB before 2.0 cannot read ("BYTE_STREAM_SPLIT encoding is only supported for
#:   FLOAT or DOUBLE data", DuckDB 1.0-1.4; 2.0 can): a batch must open in the reader a
#:   user already has.
#: - Statistics only for the scalar columns: min/max over every token of a list say nothing
#:   a query can use.
PARQUET_OPTIONS: dict[str, Any] = {
    "compression": "zstd",
    "compression_level": 1,
    "use_dictionary": _ID_STRINGS,
    "use_byte_stream_split": _FLOAT_VALUES,
    "write_statistics": [
        *_ID_STRINGS,
        "iteration",
        "node_id",
        "edge_id",
        "turn_index",
        "advantage",
        "reward",
        "target",
        "weight",
        "prediction",
    ],
}


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
    ``rows_per_file`` splits large tables into several Parquet files; ``threads`` bounds
    the concurrent requests to an object store; ``group_tokens`` bounds the token ids per
    row group. The batch arrives as Arrow columns (``focus.batch``), so a write is
    slicing, Parquet encoding and hashing. ``overlap`` encodes the files on threads of
    their own, in parallel (encoding releases the GIL): faster with a free core, slower
    on a saturated one (each hand-over then waits for the scheduler), so off by default;
    a write is a small part of an iteration either way (benchmarks/README.md).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        storage_options: dict[str, Any] | None = None,
        retry: Retry | None = None,
        rows_per_file: int = 100_000,
        threads: int = 4,
        group_tokens: int = 1 << 20,
        overlap: bool = False,
    ) -> None:
        if rows_per_file < 1:
            raise ValueError("rows_per_file must be at least 1")
        self.loc = Location(root, storage_options)
        self.retry = retry or Retry()
        self.rows_per_file = rows_per_file
        self.threads = max(1, threads)
        self.group_tokens = max(1, group_tokens)
        self.overlap = overlap

    @property
    def root(self) -> str:
        return self.loc.root

    def __repr__(self) -> str:
        return f"BatchStore({self.root!r})"

    def url_for(self, collection_id: str, iteration: int) -> str:
        check_id(collection_id, "collection id")
        if isinstance(iteration, bool) or not isinstance(iteration, int) or iteration < 0:
            raise ValueError(f"iteration must be a non-negative int, got {iteration!r}")
        return self.loc.url("batches", collection_id, f"iter-{iteration:06d}")

    def ref(self, url: str) -> str:
        """The batch at ``url`` as a path relative to the root (``batches/<id>/iter-<n>``):
        what a record about this store keeps, so that the store can be copied or moved."""
        return self.loc.relative(url.rstrip("/"))

    def locate(self, recorded: str) -> str:
        """The URL of a batch a record names (:meth:`ref`'s path, or an absolute URL in a
        record made before stores were relocatable), under this store's root."""
        return self.loc.locate(recorded, "batches")

    # --- writing ----------------------------------------------------------------------

    def encode(self, batch: Batch) -> list[tuple[str, bytes, int | None]]:
        """The files of ``batch`` as (relative path, bytes, rows), without writing anything."""
        return [(path, data, rows) for path, data, rows, _ in self._encode(batch)]

    def _encode(self, batch: Batch) -> list[tuple[str, bytes, int | None, str]]:
        """The files of ``batch`` as (relative path, bytes, rows, SHA-256).

        The batch is already columnar (``focus.batch``: the collector fills Arrow columns
        as it prepares it), so this is slicing and Parquet encoding. A batch made of typed
        rows is converted first. With ``overlap`` each file is encoded and hashed on its
        own thread (both release the GIL), so files encode in parallel.
        """
        try:
            actor, critic = batch.tables()
        except BatchError as e:
            raise SchemaError(str(e)) from None
        actor, critic = validate(actor, "actor", "batch"), validate(critic, "critic", "batch")
        for what, table in (("actor", actor), ("critic", critic)):
            _check_same_batch(table, what, batch.collection_id, batch.iteration)
        stats = dumps_json(batch.stats)
        parts = [
            *((f"actor/part-{k:05d}.parquet", ACTOR_SCHEMA, t) for k, t in enumerate(self._parts(actor))),
            *((f"critic/part-{k:05d}.parquet", CRITIC_SCHEMA, t) for k, t in enumerate(self._parts(critic))),
        ]
        pending: list[tuple[str, Future[tuple[bytes, str]], int]] = []
        try:
            for path, schema, table in parts:
                encoder = _Encoder(schema, threaded=self.overlap)
                try:
                    for start, end in _row_groups(_tokens_per_row(table), self.group_tokens):
                        encoder.add(table.slice(start, end - start))
                finally:
                    pending.append((path, encoder.finish(), table.num_rows))
            files: list[tuple[str, bytes, int | None, str]] = []
            for path, f, n_rows in pending:
                data, digest = f.result()
                files.append((path, data, n_rows, digest))
        finally:
            for _, f, _ in pending:
                f.cancel()
        return [*files, (STATS, stats, None, sha256(stats))]

    def _parts(self, table: pa.Table) -> list[pa.Table]:
        """``table`` in slices of at most ``rows_per_file`` rows (one, maybe empty, at least)."""
        n = self.rows_per_file
        return [table.slice(k, n) for k in range(0, table.num_rows, n)] or [table]

    def write(self, batch: Batch, *, overwrite: bool = False) -> str:
        """Write ``batch``; return its URL. Idempotent; see the module docstring.

        The files go to the batch's staging folder first (:meth:`staging_for`, outside
        ``batches/``), and are published only once every one of them is written: see
        :meth:`_publish`. A crash before that leaves nothing in the batch folder.
        """
        url = self.url_for(batch.collection_id, batch.iteration)
        staging = self.staging_for(batch.collection_id, batch.iteration)
        stage = f"{staging}/w-{secrets.token_hex(6)}"  # this write's own folder
        # Object stores answer in milliseconds, so their requests overlap with encoding; a
        # local disk answers in microseconds, less than handing work to a thread costs.
        io: Executor = (
            _Inline()
            if self.loc.is_local
            else ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="focus-batch")
        )
        with io as pool:
            existing_f = pool.submit(self._existing, url, overwrite)
            listed_f = pool.submit(self.loc.list_files, url, self.retry)  # leftovers of an interrupted write
            staged_f = pool.submit(self._staged, batch.collection_id, batch.iteration)
            files = self._encode(batch)
            existing = existing_f.result()
            entries = tuple(FileEntry(path, len(data), digest, rows) for path, data, rows, digest in files)
            fingerprint = sha256("\n".join(f"{e.path}:{e.sha256}" for e in entries if e.path != STATS).encode())
            self._remove_leftovers(batch.collection_id, staging, staged_f.result())
            if existing is not None:
                if existing.fingerprint == fingerprint and not overwrite:
                    return url  # the same batch (with overwrite: rewrite it, e.g. to repair damaged files)
                if not overwrite:
                    raise BatchExistsError(
                        f"{url} already holds a different batch "
                        f"({existing.info.get('summary', {}).get('actor_rows')} actor rows, written {existing.created_at}); "
                        "pass overwrite=True to replace it"
                    )
            manifest = Manifest(
                kind="batch",
                collection_id=batch.collection_id,
                files=entries,
                fingerprint=fingerprint,
                schema_version=SCHEMA_VERSION,
                created_at=datetime.now(UTC).isoformat(),
                info={"iteration": batch.iteration, "summary": batch.summary()},
            )
            try:
                list(pool.map(lambda f: self.loc.put_bytes(f"{stage}/{f[0]}", f[1], self.retry), files))
                self._publish(pool, batch.collection_id, stage, url, manifest, replace=bool(listed_f.result()))
            except Exception as e:  # an interrupt (no Exception) leaves the folder to the next write, as a kill does
                if not isinstance(e, StorageUnavailable):  # unreachable: a removal would wait out its timeouts too
                    self._abandon(stage)
                raise
        return url

    def _remove_leftovers(self, collection_id: str, staging: str, staged: list[str]) -> None:
        """Remove what interrupted writes of the batch left in its staging area, once this
        run is known to hold the collection's lease (one read of the lease object): a run
        that lost it must not remove the staged files of the run that took it over."""
        if not staged:
            return
        check_writer(self.root, collection_id, confirm=True)
        self.loc.remove_folder(staging, self.retry)
        self.loc.remove_folder(staging + _REPLACED, self.retry)  # an older version's name
        log.info("collection %s: removed %d file(s) an interrupted batch write left in %s", collection_id, len(staged), staging)  # fmt: skip

    def _abandon(self, stage: str) -> None:
        """Remove this write's own staging folder after it failed (a lost lease, a full
        disk), leaving other writes' folders be; a failure to remove it is
        logged, not raised over the write's own error. On an object store, files already
        copied into the batch folder stay: another writer may be copying the same names
        there, and readers that go through the manifest never see them."""
        try:
            self.loc.remove_folder(stage, Retry(attempts=1))
            if self.loc.is_local:
                parent = stage.rsplit("/", 1)[0]
                self.loc.remove_empty(parent, parent.rsplit("/", 1)[0], self.loc.url(STAGING))
        except Exception as e:  # noqa: BLE001 - the write's own error is the one to report
            log.warning("cannot remove the staging folder %s of a failed batch write: %s", stage, e)

    def _publish(
        self, pool: Executor, collection_id: str, stage: str, url: str, manifest: Manifest, *, replace: bool
    ) -> None:
        """Make the staged files at ``stage`` the batch at ``url``, manifest last.

        On a local disk the staging folder, manifest included, is renamed to the batch
        folder: the batch appears whole in one step (what was at ``url`` - an old batch
        being overwritten, or the leftovers of a write by an older version - is renamed
        away first, then deleted). Object stores have no such rename: the files are
        copied (server-side) into the batch folder, files no longer listed are deleted,
        the manifest is written, and the staging copies are deleted; a crash during the
        copies leaves files without a manifest in the batch folder, which readers that go
        through the manifest (:meth:`parquet_files`) never see and the next write replaces.
        ``replace``: something is at ``url`` already.
        """
        manifest_url = f"{url}/{MANIFEST}"
        if self.loc.is_local:
            self.loc.put_bytes(f"{stage}/{MANIFEST}", manifest.to_json(), self.retry)
            check_writer(self.root, collection_id, confirm=True)
            if replace:
                old = f"{stage}{_REPLACED}"
                self.loc.rename_folder(url, old)  # the old batch stops existing in one step
                self.loc.rename_folder(stage, url)
                self.loc.remove_folder(old, self.retry)
            else:
                self.loc.rename_folder(stage, url)
            staging = stage.rsplit("/", 1)[0]
            self.loc.remove_empty(staging, staging.rsplit("/", 1)[0], self.loc.url(STAGING))
            return
        if replace:
            self.loc.remove(manifest_url, self.retry)  # the old batch stops existing before its files change
        keep = {f"{url}/{f.path}" for f in manifest.files}
        list(pool.map(lambda f: self.loc.copy(f"{stage}/{f.path}", f"{url}/{f.path}", self.retry), manifest.files))
        if replace:
            self.loc.remove_many(sorted(set(self.loc.list_files(url, self.retry)) - keep - {manifest_url}), self.retry)
        check_writer(self.root, collection_id, confirm=True)
        self.loc.put_bytes(manifest_url, manifest.to_json(), self.retry, atomic=True)
        self.loc.remove_many([f"{stage}/{f.path}" for f in manifest.files], self.retry)

    def staging_for(self, collection_id: str, iteration: int) -> str:
        """The staging area of (collection, iteration), where a write puts its files until
        they are all written: ``<root>/_staging/<collection_id>/iter-<n>``, outside
        ``batches/``, so a reader that globs the batch folder never meets an unfinished
        batch. Each write stages in a folder of its own there (``w-<random>``)."""
        check_id(collection_id, "collection id")
        return self.loc.url(STAGING, collection_id, self.url_for(collection_id, iteration).rsplit("/", 1)[1])

    def _staging_of(self, url: str) -> str | None:
        """The staging folder of the batch at ``url``; ``None`` if ``url`` is not a batch folder."""
        parts = self.loc.relative(url).split("/")
        if len(parts) != 3 or parts[0] != "batches" or not parts[2].startswith("iter-"):
            return None
        return self.loc.url(STAGING, parts[1], parts[2])

    def _staged(self, collection_id: str, iteration: int) -> list[str]:
        """Files interrupted writes of (collection, iteration) left in its staging area
        (their folders, and an old batch renamed away during an overwrite)."""
        stage = self.staging_for(collection_id, iteration)
        name = stage.rsplit("/", 1)[1]
        folder = stage.rsplit("/", 1)[0]
        return [
            u
            for u in self.loc.list_files(folder, self.retry)
            if u[len(folder) + 1 :].split("/", 1)[0] in (name, name + _REPLACED)
        ]

    def _existing(self, url: str, overwrite: bool) -> Manifest | None:
        """The manifest already at ``url``, ``None`` if there is none (or it is damaged and
        ``overwrite`` is set); a damaged one without ``overwrite`` is an error."""
        try:
            return self.manifest(url, hint=False)
        except BatchNotFound:
            return None
        except ManifestError as e:
            if not overwrite:
                raise ManifestError(f"{e}; refusing to write over it (pass overwrite=True to replace it)") from e
            return None

    # --- reading ----------------------------------------------------------------------

    def manifest(self, url: str, *, hint: bool = True) -> Manifest:
        """The manifest of the batch at ``url``; :class:`BatchNotFound` if there is none
        (with ``hint``, the error says whether files of an interrupted write are there)."""
        url = url.rstrip("/")
        try:
            data = self.loc.cat(f"{url}/{MANIFEST}", self.retry)
        except FileNotFoundError:
            note = ""
            if hint:
                for where in (url, self._staging_of(url)):
                    leftovers = self.loc.list_files(where, self.retry) if where else []
                    if leftovers:
                        note = (
                            f"; {len(leftovers)} file(s) without a manifest are in {where}: "
                            "a write was interrupted, write the batch again"
                        )
                        break
            raise BatchNotFound(f"no batch at {url}: {MANIFEST} is missing{note}") from None
        m = Manifest.from_json(data, f"{url}/{MANIFEST}")
        if m.kind != "batch":
            raise ManifestError(f"{url}/{MANIFEST}: describes a {m.kind!r}, not a batch")
        return m

    def parquet_files(self, url: str, table: str = "actor") -> list[str]:
        """URLs of the Parquet files of ``table`` (``actor`` or ``critic``) in the batch at
        ``url``, in row order, as its manifest lists them: the file list to hand DuckDB,
        polars or ``datasets``, which then never read a file the batch does not own.
        :class:`BatchNotFound` while the batch is unfinished."""
        if table not in ("actor", "critic"):
            raise ValueError(f"table must be 'actor' or 'critic', got {table!r}")
        url = url.rstrip("/")
        return [f"{url}/{f.path}" for f in self.manifest(url).files if f.path.startswith(table + "/")]

    def exists(self, url: str) -> bool:
        return self.loc.exists(f"{url.rstrip('/')}/{MANIFEST}", self.retry)

    def _verified(self, url: str) -> tuple[Manifest, list[bytes]]:
        """The manifest at ``url`` and its files' bytes, each checked against the manifest."""
        m = self.manifest(url)
        if m.schema_version != SCHEMA_VERSION:
            raise version_refused(url, m.schema_version)
        try:
            blobs = self.loc.cat_many([f"{url}/{f.path}" for f in m.files], self.retry)
        except FileNotFoundError as e:
            raise CorruptDataError(f"{url}: the manifest lists {e} but the file is missing") from None
        for f, data in zip(m.files, blobs, strict=True):
            if len(data) != f.bytes or sha256(data) != f.sha256:
                raise CorruptDataError(
                    f"{url}/{f.path}: {len(data)} bytes with a checksum that differs from the manifest ({f.bytes} bytes)"
                )
        return m, blobs

    def verify(self, url: str) -> Manifest:
        """The manifest of the batch at ``url`` once every file it lists has the listed size
        and SHA-256; :class:`BatchNotFound`, :class:`CorruptDataError` or :class:`ManifestError` if not."""
        return self._verified(url.rstrip("/"))[0]

    def read_tables(self, url: str, columns: dict[str, list[str]] | None = None) -> BatchTables:
        """The batch at ``url`` as validated Arrow tables; verifies every file's checksum.

        ``columns`` (``{"actor": [...], "critic": [...]}``) decodes only those columns of
        each table, once every file's schema is checked: a summary's means need three of
        the actor's 15 columns, and the token-id lists, most of a batch in memory, none
        (``focus inspect`` of 120k actor rows: 140 MB more than the imports, all of it
        decoded lists). The per-row checks of the columns not read are then skipped."""
        url = url.rstrip("/")
        m, blobs = self._verified(url)
        tables: dict[str, list[pa.Table]] = {"actor": [], "critic": []}
        stats: dict[str, Any] = {}
        for f, data in zip(m.files, blobs, strict=True):
            where = f"{url}/{f.path}"
            if f.path == STATS:
                stats = json.loads(data)
                continue
            kind = f.path.split("/", 1)[0]
            if kind not in tables:
                raise ManifestError(f"{url}/{MANIFEST}: unknown data file {f.path!r}")
            try:
                # ParquetFile, not pq.read_table: read_table goes through pyarrow.dataset,
                # whose import imports pandas (0.2-0.3 CPU-s a process); same table. No
                # Arrow thread pools: a process that read a batch with them aborted at exit
                # now and then ('terminate called without an active exception', SIGABRT;
                # apache/arrow#34314): 2 of 40 reading processes before, 0 of 60 after
                pf = pq.ParquetFile(pa.BufferReader(data), pre_buffer=False)
                if columns is not None:
                    # names and types, no rows decoded (Schema.empty_table() imports pandas: 0.2 s)
                    validate(pa.Table.from_batches([], schema=pf.schema_arrow), kind, where)
                    tables[kind].append(pf.read(columns[kind], use_threads=False))
                    continue
                t = pf.read(use_threads=False)
            except (pa.ArrowInvalid, OSError) as e:
                raise CorruptDataError(f"{where}: not a readable Parquet file ({e})") from e
            tables[kind].append(validate(t, kind, where))
        empty = {k: s if columns is None else pa.schema([s.field(c) for c in columns[k]]) for k, s in SCHEMAS.items()}
        actor = pa.concat_tables(tables["actor"]) if tables["actor"] else empty["actor"].empty_table()
        critic = pa.concat_tables(tables["critic"]) if tables["critic"] else empty["critic"].empty_table()
        return BatchTables(url, m, actor, critic, stats)

    def read(self, url: str) -> Batch:
        """The batch at ``url`` (:class:`focus.batch.Batch`: columns, with typed rows on demand)."""
        t = self.read_tables(url)
        iteration = t.manifest.info.get("iteration")
        if not isinstance(iteration, int):
            raise ManifestError(f"{url}/{MANIFEST}: 'info.iteration' must be an int, got {iteration!r}")
        return Batch(t.manifest.collection_id, iteration, t.actor, t.critic, t.stats)

    def list(self, collection_id: str | None = None) -> list[str]:
        """URLs of every finished batch (with a manifest), optionally of one collection."""
        base = (
            self.loc.url("batches", check_id(collection_id, "collection id"))
            if collection_id
            else self.loc.url("batches")
        )
        return sorted(f.rsplit("/", 1)[0] for f in self.loc.list_files(base, self.retry) if f.endswith("/" + MANIFEST))


def _tokens_per_row(table: pa.Table) -> np.ndarray:
    """Token ids stored per row: prompt + completion (actor), context (critic)."""
    cols = ["prompt_ids", "completion_ids"] if "prompt_ids" in table.column_names else ["context_ids"]
    out = np.zeros(table.num_rows, dtype=np.int64)
    for c in cols:
        out += numpy_of(pc.list_value_length(table.column(c))).astype(np.int64)
    return out


def _row_groups(sizes: np.ndarray, group_tokens: int) -> list[tuple[int, int]]:
    """Consecutive row ranges [start, end) of about equal token counts, at most about
    ``group_tokens`` each (``sizes``: tokens per row); one range, maybe empty, at least.

    Equal groups, rather than full ones and a small remainder, keep the row groups alike
    for readers that fetch one group at a time.
    """
    total = int(sizes.sum())
    k = max(1, -(-total // group_tokens))
    if k == 1 or len(sizes) <= 1:
        return [(0, len(sizes))]
    # group g ends at the first row where the running total reaches g/k of all tokens
    cum = np.cumsum(sizes)
    cuts = np.searchsorted(cum * k, total * np.arange(1, k), side="left") + 1
    bounds = [0, *sorted({int(c) for c in cuts if 0 < c < len(sizes)}), len(sizes)]
    return list(itertools.pairwise(bounds))


def _check_same_batch(table: pa.Table, what: str, collection_id: str, iteration: int) -> None:
    """Every row belongs to the batch's collection and iteration, or :class:`SchemaError` names the first that does not."""
    if not table.num_rows:
        return
    bad = pc.or_(
        pc.not_equal(table.column("collection_id"), arrow_scalar(collection_id, pa.string())),
        pc.not_equal(table.column("iteration"), arrow_scalar(iteration, pa.int64())),
    )
    if pc.any(bad).as_py():
        i = pc.index(bad, True).as_py()
        raise SchemaError(
            f"{what} row {i} belongs to collection {table.column('collection_id')[i].as_py()!r} iteration "
            f"{table.column('iteration')[i].as_py()}, but the batch is {collection_id!r} iteration {iteration}"
        )


class _Inline(Executor):
    """Runs each call at once in the caller's thread (an executor without threads)."""

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        done: Future[T] = Future()
        try:
            done.set_result(fn(*args, **kwargs))
        except BaseException as e:  # noqa: BLE001 - handed to the caller through the future
            done.set_exception(e)
        return done


class _Encoder:
    """One Parquet file in memory, fed row groups in order; encodes on its own thread if asked.

    A single worker thread per file keeps its row groups in order; Parquet encoding
    releases the GIL, so the files of a batch encode in parallel.
    """

    def __init__(self, schema: pa.Schema, *, threaded: bool) -> None:
        self.sink = pa.BufferOutputStream()
        self.writer = pq.ParquetWriter(self.sink, schema, **PARQUET_OPTIONS)
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="focus-parquet") if threaded else None
        self.futures: list[Future[None]] = []

    def add(self, table: pa.Table) -> None:
        if not table.num_rows:
            # an empty table is a file with the schema and no row group: a row group of 0
            # rows stops HF ``datasets``, which reads in batches of the first group's size
            return
        if self.executor is None:
            self.writer.write_table(table)
        else:
            self.futures.append(self.executor.submit(self.writer.write_table, table))

    def _close(self) -> tuple[bytes, str]:
        """The file's bytes and their SHA-256 (hashing releases the GIL too)."""
        try:
            for f in self.futures:
                f.result()
        finally:
            self.writer.close()
        data = self.sink.getvalue().to_pybytes()
        return data, sha256(data)

    def finish(self) -> Future[tuple[bytes, str]]:
        if self.executor is None:
            done: Future[tuple[bytes, str]] = Future()
            try:
                done.set_result(self._close())
            except BaseException as e:  # noqa: BLE001 - handed to the caller through the future
                done.set_exception(e)
            return done
        f = self.executor.submit(self._close)
        self.executor.shutdown(wait=False)
        return f
