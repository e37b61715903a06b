"""An example's ``--out`` that cannot be written is one line before anything runs.

``python -m examples.math.run --out <a read-only file system>`` collected all its
problems and then failed as the batch was written, saying to "rerun with the same
collection id to resume", which an example does not; ``examples.browse.run``,
``examples.train_tinker.run --collect-toy`` and ``examples.train_local.run`` the same.
They now ask the store's root first (``examples.common.check_out``: the check
``focus collect`` makes of ``--store``). Real file systems: a read-only and a full tmpfs
in a private mount namespace (``unshare``; skipped where there is none).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from fixtures.mounts import private_mounts

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.integration  # subprocesses in a mount namespace


@pytest.fixture(scope="module")
def prefix() -> list[str]:
    found = private_mounts()
    if found is None:
        pytest.skip("no private mount namespace here (unshare -m / -rm)")
    return found


def _in_tmpfs(prefix: list[str], disk: Path, opts: str, args: list[str]) -> subprocess.CompletedProcess[str]:
    script = f'mount -t tmpfs -o {opts} tmpfs "{disk}" && exec "$@"'
    cmd = [*prefix, "sh", "-c", script, "sh", sys.executable, "-m", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    "example",
    [
        ["examples.math.run", "--problems", "2"],
        ["examples.browse.run", "--questions", "1"],
        ["examples.train_tinker.run", "--collect-toy"],
        ["examples.train_local.run", "--seeds", "0"],
    ],
    ids=lambda a: a[0].split(".")[1],
)
def test_a_read_only_out_is_one_line_before_the_run(prefix, tmp_path, example):
    disk = tmp_path / "ro"
    disk.mkdir()
    done = _in_tmpfs(prefix, disk, "ro,size=64k", [*example, "--out", str(disk / "store")])
    assert done.returncode == 1 and done.stdout == "", done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stderr.splitlines() == [
        f"error: storage root {disk / 'store'}: {disk} is on a read-only file system; give --out a folder you can write"
    ], done.stderr[-2000:]  # no progress line: nothing ran


def test_a_full_out_is_one_line_before_the_run(prefix, tmp_path):
    disk = tmp_path / "full"
    disk.mkdir()
    done = _in_tmpfs(prefix, disk, "size=64k", ["examples.math.run", "--problems", "2", "--out", str(disk)])
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stderr.splitlines() == [f"error: storage root {disk}: no space left on the device of {disk}"]
