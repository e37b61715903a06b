"""Manifests: the small JSON document whose presence makes a batch or a checkpoint exist.

Data files are written first, the manifest last. A reader trusts nothing that the
manifest does not list, and checks each listed file's size and SHA-256, so a crash
between the two leaves either the previous state or nothing, never a half batch.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from storage.errors import ManifestError

FORMAT = "focus-manifest"
FORMAT_VERSION = 1
#: The version of a manifest written ``short`` (:meth:`Manifest.to_json`), which leaves
#: out each field that repeats another or holds its default: ``fingerprint`` when it is
#: the one file's SHA-256, an empty ``created_at``, ``schema_version`` 1, a file's
#: ``rows`` when null. A checkpoint's manifest is written so (two per wave, they were 30%
#: of a collection's checkpoint bytes); batches and weights keep version 1. Both load.
SHORT_VERSION = 2


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class FileEntry:
    """One data file: its path relative to the manifest's folder, size, checksum, rows."""

    path: str
    bytes: int
    sha256: str
    rows: int | None = None


@dataclass(frozen=True)
class Manifest:
    """What was written, listed completely enough to verify it on read."""

    kind: str  # "batch" or "checkpoint"
    collection_id: str
    files: tuple[FileEntry, ...]
    #: Identity of the content (batch: actor and critic files; checkpoint: the pickle).
    fingerprint: str
    schema_version: int = 1
    created_at: str = ""
    #: Kind-specific fields: iteration and summary for a batch; phase, wave and seq for a checkpoint.
    info: dict[str, Any] = field(default_factory=dict)

    def file(self, path: str) -> FileEntry:
        for f in self.files:
            if f.path == path:
                return f
        raise ManifestError(f"manifest lists no file {path!r}")

    def to_json(self, *, compact: bool = False, short: bool = False) -> bytes:
        """The manifest as JSON, one field a line; ``compact``: on one line, without
        spaces (12% smaller); ``short``: compact, and without the fields that repeat
        another or hold their default (:data:`SHORT_VERSION`; a checkpoint's 35% smaller)."""
        doc = {"format": FORMAT, "format_version": FORMAT_VERSION, **asdict(self)}
        if short:
            doc = _shorten(doc)
        if compact or short:
            return json.dumps(doc, separators=(",", ":"), sort_keys=True, default=_json_default).encode()
        return json.dumps(doc, indent=1, sort_keys=True, default=_json_default).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> Manifest:
        try:
            doc = json.loads(data.decode())
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ManifestError(f"{where}: manifest is not valid JSON ({e}); the write may have been cut short") from e
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ManifestError(
                f"{where}: not a FOCUS manifest (format field is {doc.get('format') if isinstance(doc, dict) else doc!r})"
            )
        version = doc.get("format_version")
        if version not in (FORMAT_VERSION, SHORT_VERSION) or isinstance(version, bool):
            raise ManifestError(
                f"{where}: manifest format version {version!r}, this reader knows {FORMAT_VERSION} and {SHORT_VERSION}"
            )
        if version == SHORT_VERSION:
            doc = {"created_at": "", "schema_version": 1, **doc}
            if "fingerprint" not in doc and isinstance(doc.get("files"), list) and len(doc["files"]) == 1:
                doc["fingerprint"] = doc["files"][0].get("sha256") if isinstance(doc["files"][0], dict) else None
        required = ("kind", "collection_id", "files", "fingerprint", "schema_version", "created_at", "info")
        missing = [k for k in required if k not in doc]
        if missing:
            raise ManifestError(f"{where}: manifest lacks field(s) {missing}")
        try:
            files = tuple(
                FileEntry(
                    str(f["path"]), int(f["bytes"]), str(f["sha256"]), None if f.get("rows") is None else int(f["rows"])
                )
                for f in doc["files"]
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ManifestError(f"{where}: manifest has a malformed file entry ({type(e).__name__}: {e})") from e
        for f in files:
            if f.path.startswith("/") or ".." in f.path.split("/"):
                raise ManifestError(f"{where}: manifest file path {f.path!r} leaves the manifest's folder")
        if not isinstance(doc["info"], dict):
            raise ManifestError(f"{where}: manifest field 'info' must be an object")
        return cls(
            kind=str(doc["kind"]),
            collection_id=str(doc["collection_id"]),
            files=files,
            fingerprint=str(doc["fingerprint"]),
            schema_version=int(doc["schema_version"]),
            created_at=str(doc["created_at"]),
            info=doc["info"],
        )


def _shorten(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` (a version 1 manifest's fields) as :data:`SHORT_VERSION` writes it."""
    files = [{k: v for k, v in f.items() if not (k == "rows" and v is None)} for f in doc["files"]]
    out = {**doc, "format_version": SHORT_VERSION, "files": files}
    if len(files) == 1 and doc["fingerprint"] == files[0]["sha256"]:
        del out["fingerprint"]
    if not doc["created_at"]:
        del out["created_at"]
    if doc["schema_version"] == 1:
        del out["schema_version"]
    return out


def _json_default(value: Any) -> Any:
    """JSON for numpy scalars and tuples in statistics; anything else is a clear error."""
    if hasattr(value, "item") and callable(value.item):
        return value.item()
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(f"statistics value {value!r} of type {type(value).__name__} is not JSON-serialisable")


def dumps_json(value: Any) -> bytes:
    """Statistics as JSON; non-finite floats are kept (Python's JSON extension) and typed errors name the value."""
    return json.dumps(value, indent=1, sort_keys=True, default=_json_default).encode()
