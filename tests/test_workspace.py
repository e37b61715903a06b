"""Both built-in workspaces keep the Workspace contract and survive a byte store."""

from __future__ import annotations

import pickle

import fsspec
import pytest

from focus.agent import BranchState
from focus.context import Segments
from focus.env import Message, Task
from focus.format import ByteCodec
from focus.testing import WorkspaceConformance
from focus.workspace import DirectoryWorkspace, MemoryWorkspace


class TestMemoryWorkspace(WorkspaceConformance):
    def make_workspace(self):
        return MemoryWorkspace()


class TestDirectoryWorkspace(WorkspaceConformance):
    def make_workspace(self):
        return DirectoryWorkspace()


def test_branch_state_round_trips_through_a_byte_store():
    ws = DirectoryWorkspace()
    ws.write_text("history.txt", "page 1\npage 2\n")
    ctx = Segments().start(ByteCodec(), [Message("user", "hello")])
    state = BranchState(Task("t", {"q": 1}), {"pos": 3}, ws, ctx, steps=2, transitions=2)
    fs = fsspec.filesystem("memory")
    with fs.open("/ckpt/state.pkl", "wb") as f:
        f.write(pickle.dumps(state))
    with fs.open("/ckpt/state.pkl", "rb") as f:
        restored = pickle.loads(f.read())
    assert restored.env_state == state.env_state and restored.context == state.context
    assert restored.workspace.read_text("history.txt") == "page 1\npage 2\n"
    assert restored.workspace.root != ws.root
    forked = restored.fork()
    forked.workspace.write_text("history.txt", "other")
    assert restored.workspace.read_text("history.txt") == "page 1\npage 2\n"


def test_a_directory_workspace_removes_the_temporary_folders_it_made(tmp_path):
    import gc

    ws = DirectoryWorkspace()
    ws.write_text("a.txt", "x")
    forked, copied = ws.fork(), pickle.loads(pickle.dumps(ws))
    made = [ws.root, forked.root, copied.root]
    assert all(p.is_dir() for p in made) and len(set(made)) == 3
    given = DirectoryWorkspace(tmp_path / "mine")
    given.write_text("b.txt", "y")
    del ws, forked, copied, given
    gc.collect()
    assert not any(p.exists() for p in made)
    assert (tmp_path / "mine" / "b.txt").read_text(encoding="utf-8") == "y"  # a folder it was given stays


class _ReadThrough(MemoryWorkspace):
    """A fork that reads its parent's live files under its own writes: writes to the
    fork never reach the parent, but the parent's later writes show in the fork."""

    def __init__(self, parent: MemoryWorkspace | None = None) -> None:
        super().__init__()
        self.parent = parent

    def read(self, path: str) -> bytes:
        try:
            return super().read(path)
        except FileNotFoundError:
            if self.parent is None:
                raise
            return self.parent.read(path)

    def list(self) -> list[str]:
        return sorted(set(super().list()) | set(self.parent.list() if self.parent else ()))

    def fork(self) -> _ReadThrough:
        return _ReadThrough(self)


def test_the_conformance_check_catches_a_fork_that_sees_its_parents_later_writes():
    # the agent keeps writing to the live branch's workspace after forking a checkpoint's
    # copy, so such a fork is a leak: a continuation from the checkpoint saw files written
    # after it (59 of 72 checkpoints of a 6-task collection, while every check passed)
    class Check(WorkspaceConformance):
        def make_workspace(self):
            return _ReadThrough()

    check = Check()
    failures = []
    for name in [n for n in dir(check) if n.startswith("test_")]:
        try:
            getattr(check, name)()
        except AssertionError:
            failures.append(name)
    assert failures == ["test_fork_is_independent"]


class _SharedFork(MemoryWorkspace):
    """A fork that shares its parent's dict: every branch writes the same files."""

    def fork(self) -> _SharedFork:
        new = _SharedFork()
        new._files = self._files
        return new


def test_the_conformance_check_names_a_fork_that_shares_its_parents_files():
    # the check failed with a bare AssertionError on a line of focus/testing
    class Check(WorkspaceConformance):
        def make_workspace(self):
            return _SharedFork()

    with pytest.raises(AssertionError, match=r"^writes to a fork showed in its parent: fork\(\) must copy the files"):
        Check().test_fork_is_independent()
