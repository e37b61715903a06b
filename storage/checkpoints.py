"""The checkpoint store: search state saved after every wave, so a rerun resumes.

Any picklable object can be stored, so the store does not depend on the shape of ``focus.search.SearchState``: trees, branch states and
workspaces travel as they are (a ``DirectoryWorkspace`` pickles to a tar of its files).
Objects are serialised with the standard pickler, which is about twice as fast as
cloudpickle on a search state (cloudpickle consults a Python hook for every object);
what the standard pickler cannot restore in another process - lambdas, local classes,
anything defined in ``__main__`` - is serialised with cloudpickle instead (see
:func:`dumps`). Both load with ``pickle.loads``.

Layout under the store root::

    checkpoints/<collection_id>/<phase>-w<wave:05d>.pkl
    checkpoints/<collection_id>/<phase>-w<wave:05d>.manifest.json   written last

``phase`` is a phase index (int) or a phase name (str). A checkpoint exists when its
manifest does. Saving a (collection, phase, wave) that already exists keeps the first
copy and writes nothing: a wave's state is a pure function of its inputs and the seed,
and later waves may already have been computed from the first copy. ``latest`` returns
the checkpoint saved last, by a sequence number kept in each manifest: the wall clock
in nanoseconds when the save started (raised above the last number this store object
gave, so two saves through one object never tie). Numbering reads nothing, so a save
costs the same with 5 checkpoints in the collection or 500; counting the manifests
already written, as an earlier version did, made each save O(checkpoints).
"""

from __future__ import annotations

import os
import pickle
import time
from datetime import UTC, datetime
from typing import Any

import cloudpickle

from storage.errors import CheckpointNotFound, CorruptDataError, ManifestError
from storage.manifest import FileEntry, Manifest, sha256
from storage.urls import Location, Retry, check_id

_SUFFIX = ".manifest.json"


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


def _phase_key(phase: int | str) -> str:
    if isinstance(phase, bool) or not isinstance(phase, (int, str)):
        raise TypeError(f"phase must be an int index or a str name, got {phase!r}")
    if isinstance(phase, int):
        if phase < 0:
            raise ValueError(f"phase index must be non-negative, got {phase}")
        return f"p{phase:03d}"
    return "n-" + check_id(phase, "phase name")


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

    @property
    def root(self) -> str:
        return self.loc.root

    def __repr__(self) -> str:
        return f"CheckpointStore({self.root!r})"

    def url_for(self, collection_id: str, phase: int | str, wave: int) -> str:
        """URL of the pickled state of (collection, phase, wave)."""
        check_id(collection_id, "collection id")
        if isinstance(wave, bool) or not isinstance(wave, int) or wave < 0:
            raise ValueError(f"wave must be a non-negative int, got {wave!r}")
        return self.loc.url("checkpoints", collection_id, f"{_phase_key(phase)}-w{wave:05d}.pkl")

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
        """Store ``obj``; return its URL. An existing checkpoint is kept (see module docs)."""
        url = self.url_for(collection_id, phase, wave)
        manifest_url = url.removesuffix(".pkl") + _SUFFIX
        if self.loc.exists(manifest_url, self.retry):
            return url
        try:
            data = dumps(obj)
        except Exception as e:
            raise TypeError(
                f"checkpoint {collection_id}/{phase}/{wave}: state cannot be pickled: {type(e).__name__}: {e}"
            ) from e
        seq = self._last_seq = max(time.time_ns(), self._last_seq + 1)
        self.loc.put_bytes(url, data, self.retry)
        digest = sha256(data)
        manifest = Manifest(
            kind="checkpoint",
            collection_id=collection_id,
            files=(FileEntry(url.rsplit("/", 1)[1], len(data), digest),),
            fingerprint=digest,
            created_at=datetime.now(UTC).isoformat(),
            info={"phase": phase, "wave": wave, "seq": seq, "type": f"{type(obj).__module__}.{type(obj).__qualname__}"},
        )
        self.loc.put_bytes(manifest_url, manifest.to_json(), self.retry, atomic=True)
        return url

    def exists(self, collection_id: str, phase: int | str, wave: int) -> bool:
        url = self.url_for(collection_id, phase, wave)
        return self.loc.exists(url.removesuffix(".pkl") + _SUFFIX, self.retry)

    def load(self, collection_id: str, phase: int | str, wave: int) -> Any:
        """The object saved for (collection, phase, wave), checked against its manifest."""
        url = self.url_for(collection_id, phase, wave)
        manifest_url = url.removesuffix(".pkl") + _SUFFIX
        try:
            m = self._parse(self.loc.cat(manifest_url, self.retry), manifest_url)
        except FileNotFoundError:
            half = self.loc.exists(url, self.retry)
            raise CheckpointNotFound(
                f"no checkpoint for collection {collection_id!r} phase {phase!r} wave {wave}"
                + (" (its data file exists without a manifest: the save was interrupted)" if half else "")
            ) from None
        entry = m.files[0]
        try:
            data = self.loc.cat(url, self.retry)
        except FileNotFoundError:
            raise CorruptDataError(f"{url}: listed by its manifest but missing") from None
        if len(data) != entry.bytes or sha256(data) != entry.sha256:
            raise CorruptDataError(
                f"{url}: {len(data)} bytes whose checksum differs from the manifest ({entry.bytes} bytes)"
            )
        try:
            return pickle.loads(data)
        except Exception as e:
            raise CorruptDataError(f"{url}: checksum matches but unpickling failed: {type(e).__name__}: {e}") from e

    def list(self, collection_id: str) -> list[tuple[int | str, int]]:
        """(phase, wave) of every finished checkpoint, in the order they were saved."""
        return [(m.info["phase"], int(m.info["wave"])) for m in self._manifests(collection_id)]

    def latest(self, collection_id: str) -> tuple[int | str, int] | None:
        """(phase, wave) of the checkpoint saved last, or ``None`` if there is none."""
        saved = self.list(collection_id)
        return saved[-1] if saved else None
