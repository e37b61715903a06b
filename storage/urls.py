"""Addressing by URL: a store root, names under it, and bounded retries around I/O.

Every store is configured with one root URL (``file://``, a plain path, ``s3://``,
``memory://`` or any fsspec protocol). All names a store builds or accepts must stay
under that root: ids are checked against a strict pattern and URLs handed back to a
store are normalised and compared with the root, so a stray ``..`` can never read or
overwrite another collection's data.

Every call goes through :func:`storage.retry.retrying` (re-exported here with
:class:`~storage.retry.Retry` and the rest of that module's names), so that one policy
bounds every call and an unreachable bucket fails after a known time with
:class:`StorageUnavailable` instead of hanging or retrying inside three layers of clients.
"""

from __future__ import annotations

import inspect
import os
import posixpath
import re
import threading
import uuid
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from storage.errors import PathOutsideRoot, RootNotFound, StorageUnsupported
from storage.retry import AGAIN, Retry, http_answer, is_transient, refused, retrying

__all__ = [
    "AGAIN",
    "TEMP_MARK",
    "Location",
    "Retry",
    "check_id",
    "http_answer",
    "is_transient",
    "refused",
    "retrying",
    "temp_name",
    "typo_in_root",
]

#: Ids that become one path component: no separators, no dot-only names.
_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.=-]{0,199}$")

#: "s3:/bucket", "gs:bucket": a protocol with a missing slash, not a relative path.
_SCHEME_LIKE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:(?!//)")


def check_id(value: str, what: str) -> str:
    """``value`` if it is safe as one path component, else :class:`PathOutsideRoot`."""
    if not isinstance(value, str) or not _ID.match(value) or value in (".", ".."):
        raise PathOutsideRoot(
            f"{what} {value!r} is not a valid storage name: use letters, digits, '_', '-', '.', '=' "
            "(at most 200, not starting with '.' or '-'), so it cannot leave the store's root"
        )
    return value


#: "s3//bucket": a known protocol whose ':' is missing, which would be a local folder "s3".
_COLON_MISSING = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)//+(.*)$")
#: Protocols whose root is a folder of this machine: no bucket or host needed.
_NO_BUCKET = {"file", "local"}


def typo_in_root(text: str) -> str | None:
    """Why ``text`` cannot be meant as a storage root although it parses, or ``None``: a
    URL of an object store without a bucket (``s3://``, ``memory://``, which then failed
    deep in the run with a path 'outside the store's root'), or a known protocol missing its ':'
    (``s3//bucket``, which became the local folder ``./s3/bucket`` without a word)."""
    from fsspec.registry import known_implementations

    if "://" in text:
        protocol, _, rest = text.partition("://")
        if protocol not in _NO_BUCKET and not rest.strip("/"):
            return f"{text!r} names no bucket (or folder): write it as '{protocol}://bucket/prefix'"
        if protocol not in _NO_BUCKET and rest.startswith("/"):
            return f"{text!r} names no bucket (a '/' too many?): write it as '{protocol}://{rest.lstrip('/')}'"
        return None
    typo = _COLON_MISSING.match(text)
    if typo and typo.group(1) in known_implementations:
        return (
            f"{text!r} looks like a URL missing its ':' (did you mean '{typo.group(1)}://{typo.group(2)}'?); "
            f"for a local folder of that name write './{text}'"
        )
    return None


def _normalise_root(root: str | os.PathLike[str]) -> str:
    text = os.fspath(root)
    if not text:
        raise ValueError("storage root is empty: give a URL such as file:///data/focus or s3://bucket/prefix")
    if (typo := typo_in_root(text)) is not None:
        raise ValueError(f"storage root {typo}")
    if "://" not in text:
        if _SCHEME_LIKE.match(text):
            raise ValueError(f"storage root {text!r} is not a valid URL: write the protocol as 'scheme://...'")
        text = "file://" + os.path.abspath(os.path.expanduser(text))
    protocol, _, rest = text.partition("://")
    try:
        fsspec.get_filesystem_class(protocol)
    except ValueError:
        raise ValueError(
            f"storage root {text!r}: unknown protocol {protocol!r} (no fsspec filesystem for it)"
        ) from None
    except ImportError as e:
        from focus.extras import protocol_hint

        why = f"needs a package that is missing: {e}{protocol_hint(protocol)}"
        raise ValueError(f"storage root {text!r}: protocol {protocol!r} {why}") from None
    rest = posixpath.normpath("/" + rest).lstrip("/") if protocol != "file" else posixpath.normpath(rest)
    if protocol == "file" and not rest.startswith("/"):
        rest = os.path.abspath(rest)
    return f"{protocol}://{rest}".rstrip("/")


class Location:
    """A root URL and its fsspec filesystem; builds and checks URLs under the root.

    The filesystem is created on first use and dropped when pickled, so a store can be
    shipped to a worker process that opens its own connection.
    """

    #: Defaults for s3fs: one attempt inside botocore and s3fs, since :func:`retrying`
    #: owns the retry budget; a short connect timeout so an unreachable endpoint is fast.
    #: (botocore's ``max_attempts`` counts retries after the first attempt, each after a
    #: random wait of up to a second; ``total_max_attempts = 1`` is one attempt.)
    S3_DEFAULTS: dict[str, Any] = {"config_kwargs": {"connect_timeout": 5, "retries": {"total_max_attempts": 1}}}

    def __init__(self, root: str | os.PathLike[str], storage_options: dict[str, Any] | None = None) -> None:
        self.root = _normalise_root(root)
        self.protocol = self.root.partition("://")[0]
        self.storage_options = dict(storage_options or {})
        self._fs: fsspec.AbstractFileSystem | None = None
        #: Local folders this object made or found (a write then skips ``makedirs``).
        self._folders: set[str] = set()

    def __getstate__(self) -> dict[str, Any]:
        return {
            "root": self.root,
            "protocol": self.protocol,
            "storage_options": self.storage_options,
            "_fs": None,
            "_folders": set(),
        }

    def _folder_of(self, path: str) -> None:
        """Make sure the local folder of ``path`` exists (once per folder and object)."""
        folder = os.path.dirname(path)
        if folder not in self._folders:
            os.makedirs(folder, exist_ok=True)
            self._folders.add(folder)

    def __repr__(self) -> str:
        return f"Location({self.root!r})"

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        if self._fs is None:
            options = dict(self.storage_options)
            if self.protocol in ("s3", "s3a"):
                for k, v in self.S3_DEFAULTS.items():
                    options.setdefault(k, v)
            fs, _ = fsspec.core.url_to_fs(self.root, **options)
            if self.protocol in ("s3", "s3a") and "retries" not in self.storage_options:
                fs.retries = 1  # s3fs's own retry loop; ours bounds the total
            self._fs = fs
        return self._fs

    @property
    def is_local(self) -> bool:
        return isinstance(self.fs, LocalFileSystem)

    def url(self, *parts: str) -> str:
        """URL of ``parts`` under the root (each part already checked by the caller)."""
        return "/".join([self.root, *parts])

    def path(self, url: str) -> str:
        """The filesystem path of ``url``; :class:`PathOutsideRoot` unless it lies under the root."""
        text = url
        if "://" not in text:
            text = "file://" + os.path.abspath(text)
        protocol, _, rest = text.partition("://")
        norm = f"{protocol}://{posixpath.normpath('/' + rest).lstrip('/') if protocol != 'file' else posixpath.normpath(rest)}"
        if norm != self.root and not norm.startswith(self.root + "/"):
            raise PathOutsideRoot(f"{url!r} is outside the store's root {self.root!r}")
        return self.fs._strip_protocol(norm)

    def relative(self, url: str) -> str:
        """``url``'s parts below the root, joined by '/' ('' for the root itself)."""
        self.path(url)
        return url.rstrip("/")[len(self.root) :].lstrip("/")

    def locate(self, recorded: str, top: str) -> str:
        """The URL of what a record about this store names, under this root.

        Records keep locations relative to the root (``top/...``, from :meth:`relative`),
        so a store copied or moved elsewhere - another folder, a bucket - still finds its
        own files. Records written before that kept absolute URLs: for one of those the
        part from its last ``/<top>/`` on is taken under this root (the store may have
        moved since; the part is checked, so it cannot leave the root).
        """
        rest = recorded
        if "://" in recorded:
            try:
                rest = self.relative(recorded)
            except PathOutsideRoot:
                _, sep, tail = recorded.rpartition(f"/{top}/")
                if not sep:
                    raise
                rest = f"{top}/{tail}"
        parts = rest.strip("/").split("/")
        if parts[0] != top or len(parts) < 2 or any(p in ("", ".", "..") for p in parts):
            raise PathOutsideRoot(f"recorded location {recorded!r} is not a path under {top}/ in the store")
        return self.url(*parts)

    def cat(self, url: str, retry: Retry, size: int | None = None) -> bytes:
        path = self.path(url)  # size, where known, lets a large S3 object come in parallel ranges
        return retrying(lambda: self.fs.cat_file(path, **self.one_get(size)), f"read {url}", retry)

    def one_get(self, size: int | None = None) -> dict[str, Any]:
        """s3fs (2025.x) sizes a file before reading it (a HEAD; for a missing one a LIST too): one GET will do."""
        one = self.is_s3 and (size or 0) <= self.fs.default_block_size
        one = one and "max_concurrency" in inspect.signature(self.fs._cat_file).parameters
        return {"max_concurrency": 1} if one else {}

    def cat_many(self, urls: list[str], retry: Retry) -> list[bytes]:
        """Contents of several files, fetched concurrently where the filesystem is async."""
        paths = [self.path(u) for u in urls]
        if not paths:
            return []

        def fetch() -> list[bytes]:
            got = self.fs.cat(paths, on_error="return", **self.one_get())
            out: list[bytes] = []
            for u, p in zip(urls, paths, strict=True):
                v = got.get(p) if isinstance(got, dict) else got
                if v is None or isinstance(v, FileNotFoundError):
                    raise FileNotFoundError(u)
                if isinstance(v, BaseException):
                    raise v
                out.append(bytes(v))
            return out

        return retrying(fetch, f"read {len(urls)} file(s) under {self.root}", retry)

    def put_bytes(self, url: str, data: bytes, retry: Retry, *, atomic: bool = False, exclusive: bool = False) -> bool:
        """Write ``data`` at ``url``; return whether it was written.

        ``atomic``: readers see the old content or the new, never part of it (on a local
        disk: written under a unique temporary name, then renamed; object stores make a
        single PUT visible all at once). ``exclusive``: create ``url`` only if nothing is
        there, and return ``False`` if something is (implies ``atomic``). That create is
        atomic where the store allows it: on a local disk the complete temporary file is
        hard-linked to the name (``link`` fails if the name exists, like
        ``O_CREAT|O_EXCL``); on S3 a conditional PUT (``If-None-Match: *``). Other fsspec
        stores get a check then a write under a process-wide lock: atomic for in-process
        stores (``memory://``), not between processes sharing a remote store.
        """
        path = self.path(url)

        def put() -> bool:
            try:
                return write()
            except FileNotFoundError:
                if not self.is_local or os.path.dirname(path) not in self._folders:
                    raise
                self._folders.clear()  # a folder was removed behind our back: make it again
                return write()

        def write() -> bool:
            if self.is_local:
                self._folder_of(path)
                if atomic or exclusive:
                    tmp = _write_temp(path, data)
                    try:
                        if not exclusive:
                            os.replace(tmp, path)
                            return True
                        try:
                            os.link(tmp, path)
                            return True
                        except FileExistsError:
                            return False
                    finally:
                        _unlink(tmp)
            elif exclusive and self.is_s3:
                try:
                    self.fs.pipe_file(path, data, mode="create")
                except FileExistsError:
                    return False
                except OSError as e:
                    if (http_answer(e) or (0, ""))[0] == 501:
                        raise StorageUnsupported(
                            f"write {url}: the store does not support conditional writes (it answered 501 to a PUT "
                            "with If-None-Match: *), which the collection's write lease needs so that two runs never "
                            "write one collection; use a store that does (AWS S3 does; check the S3-compatible "
                            f"server's release): {e}"
                        ) from e
                    raise
                return True
            elif exclusive:
                with _PLAIN_CREATE:
                    self.fs.invalidate_cache(path)
                    if self.fs.exists(path):
                        return False
                    self.fs.pipe_file(path, data)
                    return True
            self.fs.pipe_file(path, data)
            return True

        try:
            return retrying(put, f"write {url}", retry)
        except FileNotFoundError as e:
            raise RootNotFound(
                f"write {url}: {e}; create the bucket or check the store's root {self.root!r}, then {AGAIN}"
            ) from e

    @property
    def is_s3(self) -> bool:
        return self.protocol in ("s3", "s3a")

    def exists(self, url: str, retry: Retry) -> bool:
        path = self.path(url)
        return retrying(lambda: bool(self.fs.exists(path)), f"stat {url}", retry)

    def list_files(self, url: str, retry: Retry) -> list[str]:
        """URLs of every file under ``url`` (recursively); empty if there is none."""
        path = self.path(url)

        def find() -> list[str]:
            self.fs.invalidate_cache(path)
            try:
                return sorted(self.fs.find(path))
            except FileNotFoundError:
                return []

        base = self.fs._strip_protocol(self.root)
        return [
            self.url(p[len(base) :].lstrip("/")) if p.startswith(base) else p
            for p in retrying(find, f"list {url}", retry)
        ]

    def remove(self, url: str, retry: Retry) -> None:
        """Remove the file ``url``; a missing one is no error."""
        self.remove_many([url], retry)

    def copy(self, source: str, target: str, retry: Retry) -> None:
        """Copy one file to another name under the root (on S3 a server-side copy: the
        bytes do not travel through this process)."""
        src, dst = self.path(source), self.path(target)
        retrying(lambda: self.fs.cp_file(src, dst), f"copy {source} to {target}", retry)

    def remove_many(self, urls: list[str], retry: Retry) -> None:
        """Remove the files ``urls`` (S3: one bulk request per 1,000); missing ones are no error."""
        paths = [self.path(u) for u in urls]

        def rm() -> None:
            for batch in [paths] if self.is_s3 else [[p] for p in paths]:  # elsewhere one missing file stops a list
                try:
                    self.fs.rm(batch)
                except FileNotFoundError:
                    pass

        if paths:
            retrying(
                rm, f"delete {urls[0]}" if len(urls) == 1 else f"delete {len(urls)} files under {self.root}", retry
            )

    def rename_folder(self, source: str, target: str) -> None:
        """Rename a local folder in one step (``rename(2)``): readers see it under the old
        name or the new one, never half moved. ``target`` must not exist; local disks only."""
        if not self.is_local:
            raise ValueError(f"{self.root}: renaming a folder in one step needs a local disk")
        src, dst = self.path(source), self.path(target)
        try:
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            os.rename(src, dst)
        except OSError as e:
            typed = refused(e, f"rename {source} to {target}")
            if typed is not None:
                raise typed from e
            raise

    def remove_empty(self, *urls: str) -> None:
        """Remove each local folder in ``urls`` that is empty, in order (a folder a
        concurrent writer has just put something in stays)."""
        for url in urls:
            try:
                os.rmdir(self.path(url))
            except OSError:
                return

    def remove_folder(self, url: str, retry: Retry) -> None:
        """Remove ``url`` and everything under it; nothing happens if it does not exist."""
        path = self.path(url)

        def rm() -> None:
            self.fs.invalidate_cache(path)
            if self.fs.exists(path):
                self.fs.rm(path, recursive=True)

        retrying(rm, f"delete {url}", retry)


#: Serialises check-then-write creation on stores without an atomic create (see ``put_bytes``).
_PLAIN_CREATE = threading.Lock()

#: Marks temporary files of writes in progress; a leftover with it is an interrupted write.
TEMP_MARK = ".tmp-"


def temp_name(path: str) -> str:
    """A name next to ``path`` that no other writer (process or thread) picks."""
    return f"{path}{TEMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:12]}"


def _write_temp(path: str, data: bytes) -> str:
    """``data`` in a fresh temporary file next to ``path``, flushed to disk; its name."""
    tmp = temp_name(path)
    try:
        with open(tmp, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        _unlink(tmp)
        raise
    return tmp


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
