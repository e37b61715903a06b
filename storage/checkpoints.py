"""The checkpoint store: search state saved after every wave, so a rerun resumes.

Any picklable object can be stored, so the store does not depend on the shape of ``focus.search.SearchState``: trees, branch states and
workspaces travel as they are (a ``DirectoryWorkspace`` pickles to a tar of its files).
Objects are serialised with the standard pickler, which is about twice as fast as
cloudpickle on a search state (cloudpickle consults a Python hook for every object);
what the standard pickler cannot restore in another process - lambdas, local classes,
anything defined in ``__main__`` - is serialised with cloudpickle instead (see
:func:`dumps`). Both load with ``pickle.loads``. The pickle is stored compressed with
zstd (level 1, pyarrow's codec) behind a 14-byte header (:func:`encode`), unless that is
no smaller (a phase end, a critic's identity): a collection's pickles are mostly the
repeated structure of dataclass instances and prompts that extend each other, which
compresses about 5x (benchmarks/README.md, "Checkpoint size"). A data file that starts
with the header is decompressed on load; any other is a bare pickle, as every version
before wrote, and loads as it is.

Layout under the store root::

    checkpoints/<collection_id>/<phase>-w<wave:05d>.<sha256[:16]>.pkl
    checkpoints/<collection_id>/<phase>-w<wave:05d>.manifest.json   written last

``phase`` is a phase index (int) or a phase name (str). A checkpoint exists when its
manifest does. Saving a (collection, phase, wave) that already exists keeps the first
copy: a wave's state is a pure function of its inputs and the seed, and later waves may
already have been computed from the first copy. A save does not look first (a journal
saves only the steps it did not find, so the look was a request per save that always
missed): it writes its data file, finds the manifest there when it creates its own, and
removes its data file unless it is the first copy's (the same bytes, the same name). A
resume that must compute a saved step again (one after a missing checkpoint,
:mod:`tasks.gaps`) removes it first (:meth:`CheckpointStore.discard`). A manifest is
written short (:data:`storage.manifest.SHORT_VERSION`); the longer version 1 loads too.

A checkpoint's data can never disagree with its manifest, even with two writers racing
(the pipeline also keeps a second writer out with a lease, :mod:`storage.lease`): the
data file is named by its content's digest, so two writers never write one name with
different bytes; it is complete before the manifest goes out (a local file is written
under a unique temporary name and renamed); and the manifest is created only if none
exists (``Location.put_bytes(exclusive=True)``: a hard link locally, ``If-None-Match: *`` on S3), so the
first save wins and a later one removes its own data file. ``load`` checks size and
SHA-256 against the manifest. What an interrupted save leaves (temporary files, data
without a manifest) is removed by :meth:`CheckpointStore.sweep`, which the pipeline
runs when it takes the collection's lease. Checkpoints written before data files were
named by digest (``<phase>-w<wave>.pkl``) load the same: the manifest names the file. ``latest`` returns
the checkpoint saved last, by a sequence number kept in each manifest: the wall clock
in nanoseconds when the save started (raised above the last number this store object
gave, so two saves through one object never tie). Numbering reads nothing, so a save
costs the same with 5 checkpoints in the collection or 500; counting the manifests
already written, as an earlier version did, made each save O(checkpoints).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import struct
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import cloudpickle
import pyarrow as pa

from storage.errors import CheckpointNotFound, CorruptDataError, ManifestError
from storage.lease import DEFAULT_TTL_S, Lease, check_writer
from storage.manifest import FileEntry, Manifest, sha256
from storage.urls import TEMP_MARK, Location, Retry, check_id

if TYPE_CHECKING:
    from storage.read_ahead import ReadAhead

_SUFFIX = ".manifest.json"
log = logging.getLogger(__name__)


def dumps(obj: Any) -> bytes:
    """``obj`` pickled so that a fresh process can load it.

    The standard pickler stores classes and functions by reference (module and name). A
    reference into ``__main__`` would not resolve in another process (a resumed run, a
    Dask worker), and lambdas or local classes cannot be pickled that way at all: for
    those cloudpickle stores them by value.
    """
    try:
        data = pickle.dumps(obj, protocol=5)
    except (pickle.PicklingError, AttributeError, TypeError):
        return cloudpickle.dumps(obj, protocol=5)
    # a module name in the stream is a string: a quick look finds the __main__ case
    return cloudpickle.dumps(obj, protocol=5) if b"__main__" in data else data


#: The header of a compressed data file: this, then the pickle's size (8 bytes, little
#: endian), then one zstd frame. A pickle (protocol 2 and later) starts with 0x80 instead.
ZSTD_HEADER = b"FZSTD\x01"
_SIZE = struct.Struct("<Q")
_ZSTD = pa.Codec("zstd", compression_level=1) if pa.Codec.is_available("zstd") else None


def encode(obj: Any) -> bytes:
    """``obj`` as a checkpoint's data file holds it: :func:`dumps`, compressed when that
    makes it smaller (and pyarrow was built with zstd; without it, bare)."""
    data = dumps(obj)
    if _ZSTD is None:
        return data
    packed = ZSTD_HEADER + _SIZE.pack(len(data)) + _ZSTD.compress(data, asbytes=True)
    return packed if len(packed) < len(data) else data


def decode(data: bytes) -> Any:
    """The object a data file holds (:func:`encode`'s, or a bare pickle)."""
    if data.startswith(ZSTD_HEADER):
        if _ZSTD is None:
            raise ValueError("the file is zstd-compressed and this pyarrow was built without zstd")
        start = len(ZSTD_HEADER) + _SIZE.size
        (size,) = _SIZE.unpack_from(data, len(ZSTD_HEADER))
        data = _ZSTD.decompress(memoryview(data)[start:], decompressed_size=size, asbytes=True)
    return pickle.loads(data)


def _todo(manifest_url: str) -> str:
    """What to do about a damaged checkpoint (its files are kept for a look)."""
    return f"remove {manifest_url} and rerun to compute it again"


def _phase_key(phase: int | str) -> str:
    if isinstance(phase, bool) or not isinstance(phase, (int, str)):
        raise TypeError(f"phase must be an int index or a str name, got {phase!r}")
    if isinstance(phase, int):
        if phase < 0:
            raise ValueError(f"phase index must be non-negative, got {phase}")
        return f"p{phase:03d}"
    return "n-" + check_id(phase, "phase name")


def _data_stem(name: str) -> str | None:
    """The checkpoint a data file belongs to (``<phase>-w<wave>``), from its name
    (``<stem>.<digest[:16]>.pkl``, or ``<stem>.pkl`` as older versions wrote); ``None``
    for anything else (a manifest, a temporary file)."""
    if not name.endswith(".pkl") or TEMP_MARK in name:
        return None
    rest = name[: -len(".pkl")]
    head, dot, digest = rest.rpartition(".")
    return head if dot and len(digest) == 16 and all(c in "0123456789abcdef" for c in digest) else rest


class CheckpointStore:
    """Saves and loads picklable search state per (collection id, phase, wave)."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        storage_options: dict[str, Any] | None = None,
        retry: Retry | None = None,
    ) -> None:
        self.loc = Location(root, storage_options)
        self.retry = retry or Retry()
        self._last_seq = 0
        self._ahead: ReadAhead | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_ahead": None}  # a read-ahead's threads stay in this process

    @property
    def root(self) -> str:
        return self.loc.root

    def __repr__(self) -> str:
        return f"CheckpointStore({self.root!r})"

    def url_for(self, collection_id: str, phase: int | str, wave: int) -> str:
        """URL of (collection, phase, wave) without suffix: the manifest is this plus
        ``.manifest.json``, the data file this plus ``.<digest>.pkl``."""
        check_id(collection_id, "collection id")
        if isinstance(wave, bool) or not isinstance(wave, int) or wave < 0:
            raise ValueError(f"wave must be a non-negative int, got {wave!r}")
        return self.loc.url("checkpoints", collection_id, f"{_phase_key(phase)}-w{wave:05d}")

    def _manifests(self, collection_id: str) -> list[Manifest]:
        base = self.loc.url("checkpoints", check_id(collection_id, "collection id"))
        urls = [u for u in self.loc.list_files(base, self.retry) if u.endswith(_SUFFIX)]
        out = []
        for u, data in zip(urls, self.loc.cat_many(urls, self.retry), strict=True):
            out.append(self._parse(data, u))
        return sorted(out, key=lambda m: int(m.info["seq"]))

    @staticmethod
    def _parse(data: bytes, where: str) -> Manifest:
        m = Manifest.from_json(data, where)
        if m.kind != "checkpoint" or not {"phase", "wave", "seq"} <= set(m.info) or len(m.files) != 1:
            raise ManifestError(f"{where}: not a checkpoint manifest (needs one file and phase, wave, seq)")
        return m

    def save(self, collection_id: str, phase: int | str, wave: int, obj: Any) -> str:
        """Store ``obj``; return its data file's URL. An existing checkpoint is kept (see module docs)."""
        base = self.url_for(collection_id, phase, wave)
        manifest_url = base + _SUFFIX
        folder = base.rsplit("/", 1)[0]
        try:
            data = encode(obj)
        except Exception as e:
            from focus.pickling import REMEDY, unpicklable_in

            part = unpicklable_in(getattr(obj, "trees", ()))
            why = f"{part} does not pickle: {REMEDY}" if part is not None else f"{type(e).__name__}: {e}"
            raise TypeError(f"checkpoint {collection_id}/{phase}/{wave}: state cannot be pickled: {why}") from e
        seq = self._last_seq = max(time.time_ns(), self._last_seq + 1)
        digest = sha256(data)
        name = f"{base.rsplit('/', 1)[1]}.{digest[:16]}.pkl"
        url = f"{folder}/{name}"
        check_writer(self.root, collection_id)
        self.loc.put_bytes(url, data, self.retry, atomic=True)  # complete before the manifest
        # written short (storage.manifest.SHORT_VERSION): seq is the save's time, the fingerprint the file's digest
        entry, info = FileEntry(name, len(data), digest), {"phase": phase, "wave": wave, "seq": seq}
        manifest = Manifest("checkpoint", collection_id, (entry,), fingerprint=digest, info=info)
        check_writer(self.root, collection_id)
        if self.loc.put_bytes(manifest_url, manifest.to_json(short=True), self.retry, exclusive=True):
            return url
        # another writer saved this checkpoint first: keep its copy, drop ours unless it is the same file
        first = self._read_manifest(manifest_url).files[0].path
        if first != name:
            self.loc.remove(url, self.retry)
        return f"{folder}/{first}"

    def _read_manifest(self, manifest_url: str) -> Manifest:
        """The checkpoint manifest at ``manifest_url``; ``FileNotFoundError`` if there is none."""
        return self._parse(self.loc.cat(manifest_url, self.retry), manifest_url)

    def exists(self, collection_id: str, phase: int | str, wave: int) -> bool:
        return self.loc.exists(self.url_for(collection_id, phase, wave) + _SUFFIX, self.retry)

    def load(self, collection_id: str, phase: int | str, wave: int, *, explain: bool = True) -> Any:
        """The object saved for (collection, phase, wave), checked against its manifest;
        taken from the read-ahead (:meth:`reading_ahead`) if it is the next key there.
        ``explain``: see :meth:`manifest_of`."""
        ahead = self._ahead
        if ahead is not None and ahead.cid == collection_id:
            found, value = ahead.take((phase, wave))
            if found:
                return value
        return self.read(collection_id, phase, wave, explain=explain)

    def read(self, collection_id: str, phase: int | str, wave: int, *, explain: bool = True) -> Any:
        """:meth:`load` without the read-ahead: a manifest, then its data file."""
        base, m = self.manifest_of(collection_id, phase, wave, explain=explain)
        return self.unpickle(*self.fetch(base, m))

    def manifest_of(
        self, collection_id: str, phase: int | str, wave: int, *, explain: bool = True
    ) -> tuple[str, Manifest]:
        """(URL without suffix, manifest) of (collection, phase, wave): the first half of
        :meth:`load`. :class:`CheckpointNotFound` without a manifest (saying, with
        ``explain``, whether its data file is there: a listing of the collection, which a
        caller that takes the miss for "not saved yet" goes without, as a journal asking
        for each step does), :class:`CorruptDataError` for a manifest that cannot be read."""
        base = self.url_for(collection_id, phase, wave)
        manifest_url = base + _SUFFIX
        try:
            return base, self._read_manifest(manifest_url)
        except ManifestError as e:  # garbled or cut short (a disk's damage): the same remedy as a bad data file
            raise CorruptDataError(f"{e}; {_todo(manifest_url)}") from e
        except FileNotFoundError:
            stem = base.rsplit("/", 1)[1] + "."
            half = explain and any(
                u.rsplit("/", 1)[1].startswith(stem) and ".pkl" in u
                for u in self.loc.list_files(base.rsplit("/", 1)[0], self.retry)
            )
            raise CheckpointNotFound(
                f"no checkpoint for collection {collection_id!r} phase {phase!r} wave {wave}"
                + (" (its data file exists without a manifest: the save was interrupted)" if half else "")
            ) from None

    def fetch(self, base: str, m: Manifest) -> tuple[str, bytes]:
        """(URL, bytes) of the data file manifest ``m`` of checkpoint ``base`` lists, its size
        and SHA-256 checked (:class:`CorruptDataError` if they differ or it is missing)."""
        entry = m.files[0]
        url = f"{base.rsplit('/', 1)[0]}/{entry.path}"
        try:
            data = self.loc.cat(url, self.retry, entry.bytes)
        except FileNotFoundError:
            raise CorruptDataError(f"{url}: listed by its manifest but missing; {_todo(base + _SUFFIX)}") from None
        if len(data) != entry.bytes or sha256(data) != entry.sha256:
            raise CorruptDataError(
                f"{url}: {len(data)} bytes whose checksum differs from the manifest ({entry.bytes} bytes); "
                + _todo(base + _SUFFIX)
            )
        return url, data

    @staticmethod
    def unpickle(url: str, data: bytes) -> Any:
        """The object in checked ``data`` read from ``url``: the last part of :meth:`load`."""
        try:
            return decode(data)
        except Exception as e:
            raise CorruptDataError(f"{url}: checksum matches but unpickling failed: {type(e).__name__}: {e}") from e

    @contextlib.contextmanager
    def reading_ahead(
        self,
        collection_id: str,
        keys: Sequence[tuple[int | str, int]],
        known: Mapping[tuple[int | str, int], Any] | None = None,
        **window: Any,
    ) -> Iterator[None]:
        """For the block, :meth:`load` of the checkpoints ``keys`` of ``collection_id``, in
        this order, from loads run ahead in a few threads (:class:`storage.read_ahead.ReadAhead`;
        ``window``: its options): the steps a resume replays (:func:`tasks.gaps.repairing`).
        ``known``: checkpoints among ``keys`` the caller loaded already, not read again."""
        from storage.read_ahead import ReadAhead

        with ReadAhead(self, collection_id, keys, known=known, **window) as ahead:
            self._ahead = ahead
            try:
                yield
            finally:
                self._ahead = None

    def sweep(self, collection_id: str) -> list[str]:
        """Remove what interrupted saves of ``collection_id`` left; return the URLs removed.

        Temporary files of unfinished writes, and data files that no manifest lists (a
        save cut short before its manifest, or the loser of a race). Run it only while
        nobody else writes the collection (the pipeline does, holding the lease): a
        concurrent save's data file has no manifest yet either. A data file is named after
        its checkpoint (``<phase>-w<wave>.<digest>.pkl``), so the listing alone tells the
        ones without a manifest; only a checkpoint with two data files (a race's loser
        left) has its manifest read, and if it cannot be read both are kept. Reading every
        manifest cost a resume as many requests as checkpoints (735 GETs on S3 at 20k
        transitions, a third of what the resume read). Also removes temporary files under
        the collection's batches and, on a local disk, under the weights of the train
        loop of that id.
        """
        folder = self.loc.url("checkpoints", check_id(collection_id, "collection id"))
        files = self.loc.list_files(folder, self.retry)
        doomed = [u for u in files if TEMP_MARK in u.rsplit("/", 1)[1]]
        manifests = {u.rsplit("/", 1)[1][: -len(_SUFFIX)]: u for u in files if u.endswith(_SUFFIX)}
        data: dict[str, list[str]] = {}
        for u in files:
            if (stem := _data_stem(u.rsplit("/", 1)[1])) is not None:
                data.setdefault(stem, []).append(u)
        doomed += [u for stem, urls in data.items() if stem not in manifests for u in urls]
        contested = [(manifests[stem], urls) for stem, urls in data.items() if stem in manifests and len(urls) > 1]
        for manifest_url, urls in contested:
            try:
                listed = f"{folder}/{self._read_manifest(manifest_url).files[0].path}"
            except (ManifestError, FileNotFoundError):
                continue
            doomed += [u for u in urls if u != listed]
        batches = self.loc.url("batches", collection_id)
        doomed += [u for u in self.loc.list_files(batches, self.retry) if TEMP_MARK in u.rsplit("/", 1)[1]]
        if self.loc.is_local:  # an object store's single PUT leaves no temporary file
            # a train loop's weights: its trainer writes them in a thread the interrupted
            # command does not wait for, so a Ctrl-C cut a file short there for good
            weights = self.loc.url("weights", collection_id)
            doomed += [u for u in self.loc.list_files(weights, self.retry) if TEMP_MARK in u.rsplit("/", 1)[1]]
        for u in doomed:
            self.loc.remove(u, self.retry)
        return doomed

    def saved(self, collection_id: str) -> dict[tuple[int | str, int], bool]:
        """Every (phase, wave) of ``collection_id`` with a manifest, and whether a data
        file of it is there too; from one listing, no manifest read (run it after
        :meth:`sweep`, which removes data files that no manifest lists, as the pipeline
        does when it takes the lease)."""
        folder = self.loc.url("checkpoints", check_id(collection_id, "collection id"))
        names = [u.rsplit("/", 1)[1] for u in self.loc.list_files(folder, self.retry)]
        data = {_data_stem(n) for n in names}
        out: dict[tuple[int | str, int], bool] = {}
        for n in names:
            stem = n[: -len(_SUFFIX)] if n.endswith(_SUFFIX) else ""
            key, _, wave = stem.rpartition("-w")
            if key and wave.isdigit():
                phase: int | str = int(key[1:]) if key[:1] == "p" and key[1:].isdigit() else key.removeprefix("n-")
                out[(phase, int(wave))] = stem in data
        return out

    def discard(self, collection_id: str, keys: Sequence[tuple[int | str, int]]) -> None:
        """Remove the checkpoints (phase, wave) ``keys`` of ``collection_id``: their
        manifests first, in the order given (so each stops existing in one step), then
        their data files. For a resume that computes those steps again
        (:func:`tasks.gaps.find_gap`): a save keeps a checkpoint's first copy, so one that
        no longer follows from the steps before it must go before its step is saved. One
        listing and two bulk deletes, however many go (one at a time, 500 took 10 s on a
        local disk and 280 s on moto's S3: each listed the whole collection)."""
        if not keys:
            return
        bases = [self.url_for(collection_id, phase, wave) for phase, wave in keys]
        check_writer(self.root, collection_id)
        self.loc.remove_many([b + _SUFFIX for b in bases], self.retry)
        stems = {b.rsplit("/", 1)[1] for b in bases}
        files = self.loc.list_files(bases[0].rsplit("/", 1)[0], self.retry)
        self.loc.remove_many([u for u in files if _data_stem(u.rsplit("/", 1)[1]) in stems], self.retry)

    def list(self, collection_id: str) -> list[tuple[int | str, int]]:
        """(phase, wave) of every finished checkpoint, in the order they were saved."""
        return [(m.info["phase"], int(m.info["wave"])) for m in self._manifests(collection_id)]

    def latest(self, collection_id: str) -> tuple[int | str, int] | None:
        """(phase, wave) of the checkpoint saved last, or ``None`` if there is none."""
        saved = self.list(collection_id)
        return saved[-1] if saved else None


@contextlib.contextmanager
def collection_lease(
    root: str | os.PathLike[str],
    collection_id: str,
    *,
    ttl_s: float = DEFAULT_TTL_S,
    storage_options: dict[str, Any] | None = None,
) -> Iterator[Lease]:
    """Hold the write lease of ``collection_id`` for the block, renewed in the background.

    On entry, after taking the lease, removes what interrupted writes of the collection
    left behind (temporary files, checkpoint data without a manifest). Raises
    :class:`LeaseHeld` if another live run holds it. In a coroutine use
    :func:`held_lease`, which keeps the event loop (and Ctrl-C) running meanwhile.
    """
    lease = Lease(root, collection_id, ttl_s=ttl_s, storage_options=storage_options)
    _take(lease, root, storage_options)
    try:
        yield lease
    finally:
        lease.release()


@contextlib.asynccontextmanager
async def held_lease(
    root: str | os.PathLike[str],
    collection_id: str,
    *,
    ttl_s: float = DEFAULT_TTL_S,
    storage_options: dict[str, Any] | None = None,
) -> AsyncIterator[Lease]:
    """:func:`collection_lease` for a coroutine: the lease is taken (and the leftovers
    swept) in a worker thread, and a cancellation (a command's first Ctrl-C or SIGTERM)
    ends a wait for another host's lease at once, the lease not taken.

    Taken on the event loop, the wait of up to ``ttl_s`` for a lease that looks abandoned
    held the loop: the first signal took effect only once the lease was taken, 28 s
    after it came (`focus collect` against a lease of another host).
    """
    lease = Lease(root, collection_id, ttl_s=ttl_s, storage_options=storage_options)
    taking = asyncio.ensure_future(asyncio.to_thread(_take, lease, root, storage_options))
    try:
        await asyncio.shield(taking)
    except asyncio.CancelledError:
        lease.abort()
        with contextlib.suppress(BaseException):  # ends at once: the wait sleeps on the abort
            await taking
        await asyncio.to_thread(lease.release)  # taken all the same just before the abort
        raise
    try:
        yield lease
    finally:
        await asyncio.to_thread(lease.release)


def _take(lease: Lease, root: str | os.PathLike[str], storage_options: dict[str, Any] | None) -> None:
    """Acquire ``lease``, start its renewer, sweep what interrupted writes left."""
    lease.acquire()
    lease.start_renewing()
    try:
        removed = CheckpointStore(root, storage_options=storage_options).sweep(lease.collection_id)
    except BaseException:
        lease.release()
        raise
    if removed:
        log.info("collection %s: removed %d leftover(s) of interrupted writes", lease.collection_id, len(removed))
