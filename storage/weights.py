"""The weight store: each version a train loop publishes, beside its batches.

Layout under the store root (the same root as the batches and checkpoints)::

    weights/<run_id>/v<version:06d>/
        policy.pt        the policy weights (for the embedded model: the tiny model's file)
        critic.pt        a trainable critic's weights, when it has one
        optimizer.pt     trainer state needed to continue exactly (optimizer moments, ...)
        _manifest.json   written last; lists every file with size and SHA-256

Version ``v`` is what iteration ``v - 1`` trained (version 0 is the starting weights,
which are not copied). A version exists exactly when its manifest does; files left by
an interrupted write are overwritten by the next attempt. Readers check each file
against the manifest, so a half-written or corrupted file is never loaded.

A model server reads weights from its own disk: :meth:`WeightStore.local_copy` fetches
a stored file into a local cache named by its checksum, so the bytes the server loads
(and the policy version it computes from them) are exactly the stored ones.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from storage.errors import CorruptDataError, ManifestError
from storage.manifest import FileEntry, Manifest, sha256
from storage.temp import user_temp_folder
from storage.urls import Location, Retry, check_id

MANIFEST = "_manifest.json"


class WeightStore:
    """Writes and reads versioned weight files of one or more train loops under a root."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        storage_options: dict[str, Any] | None = None,
        retry: Retry | None = None,
    ) -> None:
        self.loc = Location(root, storage_options)
        self.retry = retry or Retry()

    @property
    def root(self) -> str:
        return self.loc.root

    def __repr__(self) -> str:
        return f"WeightStore({self.root!r})"

    def folder(self, run_id: str, version: int) -> str:
        """URL of version ``version`` of run ``run_id``."""
        check_id(run_id, "run id")
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise ValueError(f"version must be a non-negative int, got {version!r}")
        return self.loc.url("weights", run_id, f"v{version:06d}")

    def ref(self, url: str) -> str:
        """A stored file or version folder as a path relative to the root
        (``weights/<run>/v<n>[/<file>]``): what a record keeps, so the store can move."""
        return self.loc.relative(url.rstrip("/"))

    def locate(self, recorded: str) -> str:
        """The URL of what a record names (:meth:`ref`'s path, or an absolute URL in a
        record made before stores were relocatable), under this store's root."""
        return self.loc.locate(recorded, "weights")

    def run_file(self, run_id: str, name: str) -> str:
        """URL of a file about run ``run_id`` as a whole, beside its versions (its
        picture of success per version, say)."""
        check_id(run_id, "run id")
        check_id(name, "file name")
        return self.loc.url("weights", run_id, name)

    def put_run_file(self, run_id: str, name: str, data: bytes) -> str:
        """Write (replace) :meth:`run_file` ``name`` of run ``run_id``; its URL."""
        url = self.run_file(run_id, name)
        self.loc.put_bytes(url, data, self.retry, atomic=True)
        return url

    def run_file_exists(self, run_id: str, name: str) -> bool:
        return self.loc.exists(self.run_file(run_id, name), self.retry)

    def put(self, folder: str, files: dict[str, bytes], info: dict[str, Any] | None = None) -> str:
        """Write ``files`` (name -> bytes) into version folder ``folder`` (from
        :meth:`folder`), manifest last; returns the folder URL.

        Writing a version again replaces it (a trainer that was interrupted before it
        recorded its result computes the same files again).
        """
        folder = folder.rstrip("/")
        run_id, version = self._parse_folder(folder)
        entries = []
        for name, data in sorted(files.items()):
            check_id(name, "weight file name")
            if name == MANIFEST:
                raise ValueError(f"{MANIFEST!r} is reserved for the manifest")
            self.loc.put_bytes(f"{folder}/{name}", data, self.retry, atomic=True)
            entries.append(FileEntry(name, len(data), sha256(data)))
        manifest = Manifest(
            kind="weights",
            collection_id=run_id,
            files=tuple(entries),
            fingerprint=sha256("".join(f"{e.path}:{e.sha256};" for e in entries).encode()),
            created_at=datetime.now(UTC).isoformat(),
            info={"version": version, **(info or {})},
        )
        self.loc.put_bytes(f"{folder}/{MANIFEST}", manifest.to_json(), self.retry, atomic=True)
        return folder

    def _parse_folder(self, folder: str) -> tuple[str, int]:
        parts = self.loc.relative(folder).split("/")
        if len(parts) != 3 or parts[0] != "weights" or not parts[2].startswith("v") or not parts[2][1:].isdigit():
            raise ValueError(f"{folder!r} is not a weights version folder (<root>/weights/<run>/v<NNNNNN>)")
        return check_id(parts[1], "run id"), int(parts[2][1:])

    def exists(self, run_id: str, version: int) -> bool:
        return self.loc.exists(f"{self.folder(run_id, version)}/{MANIFEST}", self.retry)

    def manifest(self, folder: str) -> Manifest:
        url = f"{folder.rstrip('/')}/{MANIFEST}"
        try:
            m = Manifest.from_json(self.loc.cat(url, self.retry), url)
        except FileNotFoundError:
            raise CorruptDataError(f"no weights at {folder} (no manifest: never written, or cut short)") from None
        if m.kind != "weights":
            raise ManifestError(f"{url}: not a weights manifest (kind {m.kind!r})")
        return m

    def read(self, url: str) -> bytes:
        """The bytes of one stored file (``<folder>/<name>``), checked against its manifest."""
        folder, _, name = url.rstrip("/").rpartition("/")
        entry = self.manifest(folder).file(name)
        try:
            data = self.loc.cat(url, self.retry, entry.bytes)
        except FileNotFoundError:
            raise CorruptDataError(f"{url}: listed by its manifest but missing") from None
        if len(data) != entry.bytes or sha256(data) != entry.sha256:
            raise CorruptDataError(f"{url}: {len(data)} bytes whose checksum differs from the manifest")
        return data

    def local_copy(self, url: str, cache: str | os.PathLike[str] | None = None) -> Path:
        """A local file with the bytes of stored file ``url`` (checked), for readers
        that need a path. Cached by checksum: fetching the same bytes again is free."""
        folder, _, name = url.rstrip("/").rpartition("/")
        entry = self.manifest(folder).file(name)
        base = Path(cache) if cache is not None else user_temp_folder("focus-weights")
        path = base / f"{entry.sha256[:32]}-{name}"
        if path.is_file() and path.stat().st_size == entry.bytes:
            return path
        data = self.read(url)
        base.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
        tmp.write_bytes(data)
        os.replace(tmp, path)
        return path
