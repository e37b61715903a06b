"""A DirectoryWorkspace archive unpacks only regular files and directories inside the new root.

Python 3.11.4+ extracts with tarfile's ``filter="data"``; before 3.11.4 (Debian 12's python3 is
3.11.2) there is no ``tarfile.data_filter`` and focus/workspace.py checks each member itself. Both
paths run here: the fallback by removing ``tarfile.data_filter``, as on 3.11.0-3.11.3.
"""

from __future__ import annotations

import io
import pickle
import stat
import tarfile

import pytest

from focus.workspace import DirectoryWorkspace, WorkspaceError

PATHS = ["data_filter", "fallback"]


@pytest.fixture(params=PATHS)
def unpack_path(request, monkeypatch):
    if request.param == "data_filter" and not hasattr(tarfile, "data_filter"):
        pytest.skip("this Python has no tarfile.data_filter (before 3.11.4)")
    if request.param == "fallback":
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    return request.param


def _archive(*members: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _file(name: str, data: bytes = b"x", mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.mode = mode
    return info, data


def _symlink(name: str, target: str) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, target
    return info, None


def _unpickle(tar: bytes) -> DirectoryWorkspace:
    ws = DirectoryWorkspace.__new__(DirectoryWorkspace)
    ws.__setstate__({"tar": tar})
    return ws


def test_a_workspace_round_trips_on_both_paths(unpack_path):
    ws = DirectoryWorkspace()
    ws.write_text("notes.txt", "a")
    ws.write("sub/deep/data.bin", bytes(range(256)))
    copy = pickle.loads(pickle.dumps(ws))
    assert copy.root != ws.root and copy == ws
    assert copy.list() == ["notes.txt", "sub/deep/data.bin"]
    assert copy.read("sub/deep/data.bin") == bytes(range(256))


def _up(outside) -> str:
    """``outside`` as a path relative to a root made under the temporary folder, by ``..`` steps."""
    return "../" * 40 + str(outside).lstrip("/")


MALICIOUS = {
    "absolute": lambda out: [_file("ok.txt"), _file(f"{out}/abs.txt")],
    "dotdot": lambda out: [_file("ok.txt"), _file(f"{_up(out)}/dotdot.txt")],
    "dotdot-inner": lambda out: [_file(f"./a/../{_up(out)}/inner.txt")],
    "symlink-out": lambda out: [_symlink("link", str(out)), _file("link/through.txt")],
    "symlink-up": lambda out: [_symlink("link", _up(out)), _file("link/through.txt")],
    # each link inside when read alone ('b/..' is the root), outside once 'b' is the root itself
    "symlink-chain": lambda out: [_symlink("b", "."), _symlink("a", "b/.."), _file(f"a/{out.name}/chain.txt")],
}
SAYS = {
    "absolute": "absolute path",
    "dotdot": "'..' component",
    "dotdot-inner": "'..' component",
    "symlink-out": "symbolic link to the absolute path",
    "symlink-up": "outside the workspace",
    "symlink-chain": "outside the workspace",
}


@pytest.mark.parametrize("case", list(MALICIOUS))
def test_a_malicious_archive_is_refused_on_both_paths(unpack_path, tmp_path, case):
    outside = tmp_path / "outside"
    outside.mkdir()
    members = MALICIOUS[case](outside)
    with pytest.raises(WorkspaceError, match=SAYS[case]) as caught:
        _unpickle(_archive(*members))
    bad = next(info.name for info, _ in members if info.name not in ("ok.txt", "b"))
    assert repr(bad) in str(caught.value)  # the error names the member
    assert list(outside.iterdir()) == []  # nothing was written outside the new root


def test_a_hard_link_and_a_device_are_refused_on_both_paths(unpack_path):
    link = tarfile.TarInfo("hard")
    link.type, link.linkname = tarfile.LNKTYPE, "ok.txt"
    with pytest.raises(WorkspaceError, match="'hard' is not a regular file, a directory or a symbolic link"):
        _unpickle(_archive(_file("ok.txt"), (link, None)))
    dev = tarfile.TarInfo("dev")
    dev.type = tarfile.CHRTYPE
    with pytest.raises(WorkspaceError, match="'dev' is not a regular file"):
        _unpickle(_archive((dev, None)))


def test_the_fallback_clears_the_mode_bits_the_data_filter_clears(monkeypatch):
    monkeypatch.delattr(tarfile, "data_filter", raising=False)
    ws = _unpickle(_archive(_file("run.sh", b"#!/bin/sh\n", mode=0o6777), _file("ro.txt", mode=0o400)))
    assert stat.S_IMODE((ws.root / "run.sh").stat().st_mode) == 0o755
    assert stat.S_IMODE((ws.root / "ro.txt").stat().st_mode) == 0o600


def test_a_workspace_with_symbolic_links_and_hard_links_forks_and_round_trips(unpack_path):
    """A repository's or a package manager's links: a fork followed them (copying what
    they name, from outside the workspace too) and failed on a dangling one, failing
    its rollout; a pickle packed them and the unpickling refused the archive (a resume,
    a Dask worker), and a hard link within the workspace alike. A link inside is kept as
    a link; one to an absolute path is refused when the workspace is pickled, naming it."""
    import os

    ws = DirectoryWorkspace()
    ws.write_text("src/a.txt", "a")
    os.symlink("src/a.txt", ws.root / "link.txt")
    (ws.root / "bin").mkdir()
    os.symlink("../src", ws.root / "bin" / "src")
    os.symlink("missing.txt", ws.root / "dangling")
    os.link(ws.root / "src/a.txt", ws.root / "hard.txt")
    for copy in (ws.fork(), pickle.loads(pickle.dumps(ws))):
        assert copy.list() == ["hard.txt", "link.txt", "src/a.txt"] and copy == ws  # a linked folder is not listed
        assert (
            os.readlink(copy.root / "link.txt") == "src/a.txt" and os.readlink(copy.root / "dangling") == "missing.txt"
        )
        copy.write_text("src/a.txt", "changed")  # the copy's link reads the copy's file, not the original's
        assert copy.read_text("link.txt") == "changed" and ws.read_text("link.txt") == "a"
    os.symlink("/usr/bin/env", ws.root / "python")
    with pytest.raises(
        WorkspaceError, match=r"cannot be saved: .*'./python' is a symbolic link to the absolute path '/usr/bin/env'"
    ):
        pickle.dumps(ws)
