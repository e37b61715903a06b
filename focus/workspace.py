"""Mutable task data of one branch, forkable so sibling branches never interfere.

A workspace is a small file system: paths to bytes. ``fork()`` gives an independent
copy for a new branch. Both built-ins pickle to their full contents, so a workspace
survives a checkpoint to object storage and a restore on another worker.
"""

from __future__ import annotations

import abc
import io
import os
import shutil
import tarfile
import tempfile
import weakref
from pathlib import Path, PurePosixPath
from typing import Any


class WorkspaceError(RuntimeError):
    pass


def _clean(path: str) -> str:
    p = PurePosixPath("/" + path.lstrip("/"))
    parts: list[str] = []
    for part in p.parts[1:]:
        if part == "..":
            raise WorkspaceError(f"workspace path {path!r} leaves the workspace")
        if part not in (".", ""):
            parts.append(part)
    if not parts:
        raise WorkspaceError(f"workspace path {path!r} names no file")
    return "/".join(parts)


class Workspace(abc.ABC):
    """Files of one branch. Implement read/write/delete/list/fork; text helpers follow.

    A fork is independent both ways: the agent stores a fork as a checkpoint's copy and
    keeps writing to the original in the live branch, so a fork that reads through to
    its parent's live files leaks the branch's later writes into every continuation, and
    one that shares its parent's files gives every branch the same files. A path that
    leaves the workspace (``../x``) raises :class:`WorkspaceError`.
    ``focus.testing.WorkspaceConformance`` checks the contract."""

    @abc.abstractmethod
    def read(self, path: str) -> bytes:
        """Contents of ``path``; ``FileNotFoundError`` if absent."""

    @abc.abstractmethod
    def write(self, path: str, data: bytes) -> None: ...

    @abc.abstractmethod
    def delete(self, path: str) -> None: ...

    @abc.abstractmethod
    def list(self) -> list[str]:
        """All paths, sorted."""

    @abc.abstractmethod
    def fork(self) -> Workspace:
        """An independent copy: writes to either never show in the other."""

    def exists(self, path: str) -> bool:
        return _clean(path) in self.list()

    def read_text(self, path: str) -> str:
        return self.read(path).decode()

    def write_text(self, path: str, text: str) -> None:
        self.write(path, text.encode())

    def snapshot(self) -> dict[str, bytes]:
        return {p: self.read(p) for p in self.list()}


class MemoryWorkspace(Workspace):
    """Files in a dict; fork copies the dict (bytes are immutable, so that is cheap)."""

    def __init__(self, files: dict[str, bytes] | None = None) -> None:
        self._files: dict[str, bytes] = {_clean(k): bytes(v) for k, v in (files or {}).items()}

    def read(self, path: str) -> bytes:
        try:
            return self._files[_clean(path)]
        except KeyError:
            raise FileNotFoundError(path) from None

    def write(self, path: str, data: bytes) -> None:
        self._files[_clean(path)] = bytes(data)

    def delete(self, path: str) -> None:
        self._files.pop(_clean(path), None)

    def list(self) -> list[str]:
        return sorted(self._files)

    def fork(self) -> MemoryWorkspace:
        return MemoryWorkspace(dict(self._files))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Workspace) and self.snapshot() == other.snapshot()

    __hash__ = None  # type: ignore[assignment]


def _check_member(member: tarfile.TarInfo, root: str) -> None:
    """Refuse a member :class:`DirectoryWorkspace` never packs: anything but a regular file, a
    directory or a symbolic link to a relative path inside ``root`` (as tarfile's data filter
    takes them), an absolute path, a ``..`` component, a path that resolves outside ``root``."""
    name = member.name
    if member.issym():
        link = member.linkname
        if os.path.isabs(link):
            raise WorkspaceError(f"workspace archive member {name!r} is a symbolic link to the absolute path {link!r}")
        pointed = os.path.realpath(os.path.join(root, os.path.dirname(name), link))
        if os.path.commonpath([pointed, root]) != root:
            raise WorkspaceError(
                f"workspace archive member {name!r} is a symbolic link to {link!r}, outside the workspace"
            )
    elif not (member.isreg() or member.isdir()):
        raise WorkspaceError(f"workspace archive member {name!r} is not a regular file, a directory or a symbolic link")
    if os.path.isabs(name):
        raise WorkspaceError(f"workspace archive member {name!r} has an absolute path")
    if ".." in PurePosixPath(name).parts:
        raise WorkspaceError(f"workspace archive member {name!r} has a '..' component")
    target = os.path.realpath(os.path.join(root, name))
    if os.path.commonpath([target, root]) != root:
        raise WorkspaceError(f"workspace archive member {name!r} resolves outside the workspace")


def _unpack(tar: tarfile.TarFile, root: Path) -> None:
    """Extract a :class:`DirectoryWorkspace` archive into ``root``, every member checked first
    (the fallback checks each again as it extracts it: a link may pass through one before it).

    Python 3.11.4+ also extracts with ``filter="data"`` (PEP 706). Before 3.11.4 (Debian 12's
    python3 is 3.11.2) there is no filter: the checks above stand in for it, and each member's
    mode loses the bits the data filter clears (setuid, setgid, sticky, group/other write) and
    its owner is the current user's, so no version extracts what another refuses.
    """
    real = os.path.realpath(root)
    members = tar.getmembers()
    for member in members:
        _check_member(member, real)
    if hasattr(tarfile, "data_filter"):
        try:
            tar.extractall(root, filter="data")
        except tarfile.FilterError as e:  # a link through a link unpacked before it
            raise WorkspaceError(
                f"workspace archive member {e.tarinfo.name!r} resolves outside the workspace ({e})"
            ) from None
        return
    for member in members:
        _check_member(member, real)  # again, through the links unpacked before it (as the data filter does)
        mode = member.mode & 0o755
        member.mode = mode | (0o700 if member.isdir() else 0o600)
        member.uid, member.gid, member.uname, member.gname = os.getuid(), os.getgid(), "", ""
        tar.extract(member, root)


class _NoHardLinks(dict):  # type: ignore[type-arg]
    """``TarFile.inodes`` that remembers no file: tarfile packs a file whose inode it has
    packed before as a hard link to it, a member no unpacking takes; each is packed whole."""

    def __setitem__(self, key: Any, value: Any) -> None:
        pass


class DirectoryWorkspace(Workspace):
    """Files in a real directory, for tools that need paths. Fork copies the tree.

    Pickling packs the directory into a tar archive; unpickling unpacks it into a new
    temporary directory, so a restored workspace on another worker is a true copy. It
    holds regular files, directories and symbolic links to relative paths inside it; a
    link elsewhere is refused when the workspace is pickled.
    A temporary directory the workspace made itself (no ``root`` given, a fork, an
    unpickled copy) is removed when the workspace is garbage or the process exits, as
    :class:`tempfile.TemporaryDirectory` does; a ``root`` given is left alone.
    """

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        if root is None:
            self._own(Path(tempfile.mkdtemp(prefix="focus-ws-")))
        else:
            self.root = Path(root)
            self.root.mkdir(parents=True, exist_ok=True)

    def _own(self, root: Path) -> None:
        """Use ``root`` (a temporary directory this workspace made) and remove it with the workspace."""
        self.root = root
        weakref.finalize(self, shutil.rmtree, str(root), ignore_errors=True)

    def _path(self, path: str) -> Path:
        return self.root / _clean(path)

    def read(self, path: str) -> bytes:
        p = self._path(path)
        if not p.is_file():
            raise FileNotFoundError(path)
        return p.read_bytes()

    def write(self, path: str, data: bytes) -> None:
        p = self._path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(p.name + ".tmp-focus")
        tmp.write_bytes(data)
        tmp.replace(p)

    def delete(self, path: str) -> None:
        self._path(path).unlink(missing_ok=True)

    def list(self) -> list[str]:
        return sorted(p.relative_to(self.root).as_posix() for p in self.root.rglob("*") if p.is_file())

    def fork(self) -> DirectoryWorkspace:
        """A copy of the tree; a symbolic link is copied as the link (followed, it copied
        the file or folder it names, from outside the workspace too, and a dangling one
        failed the fork and so its rollout)."""
        new = DirectoryWorkspace()
        shutil.copytree(self.root, new.root, symlinks=True, dirs_exist_ok=True)
        return new

    def __getstate__(self) -> dict[str, bytes]:
        """The tree as a tar archive, every entry checked as unpacking checks it, so a
        workspace that cannot be restored fails here, naming the entry, and not at a
        resume or on a Dask worker (a symbolic link to an absolute path, such as a
        virtualenv's ``bin/python``, packed and was refused on unpacking)."""
        buf = io.BytesIO()
        real = os.path.realpath(self.root)

        def checked(member: tarfile.TarInfo) -> tarfile.TarInfo:
            try:
                _check_member(member, real)
            except WorkspaceError as e:
                raise WorkspaceError(f"the DirectoryWorkspace at {self.root} cannot be saved: {e}") from None
            return member

        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.inodes = _NoHardLinks()  # type: ignore[attr-defined]
            tar.add(self.root, arcname=".", filter=checked)
        return {"tar": buf.getvalue()}

    def __setstate__(self, state: dict[str, bytes]) -> None:
        self._own(Path(tempfile.mkdtemp(prefix="focus-ws-")))
        with tarfile.open(fileobj=io.BytesIO(state["tar"]), mode="r") as tar:
            _unpack(tar, self.root)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Workspace) and self.snapshot() == other.snapshot()

    __hash__ = None  # type: ignore[assignment]
