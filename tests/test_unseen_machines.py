"""``focus`` as a user runs it on machines unlike CI's (which runs as root, with a UTF-8
locale, a writable home and every descriptor open): each case works, or stops with one
line naming the cause, never a traceback.

- Standard output or error closed at the start (``focus collect >&-``, ``2>&-``; cron
  and some service managers start jobs so): every command did its work, then ended with
  ``AttributeError: 'NoneType' object has no attribute 'flush'`` and exit 1; and the
  first file it opened took descriptor 1, so what wrote to standard output wrote into it.
- A ``memory://`` store: the batch is gone when the command exits, and the command
  printed its URL and a ``rerun or resume`` line without a word of that.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def focus(tmp_path: Path, *args: str, shell: str = "", **env: str) -> subprocess.CompletedProcess[str]:
    """``focus <args>`` from ``tmp_path``, its descriptors redirected by ``shell`` (``>&-``)."""
    argv = shlex.join([sys.executable, "-m", "cli", *args])
    return subprocess.run(
        ["sh", "-c", f"exec {argv} {shell}"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT), "XDG_STATE_HOME": str(tmp_path / "state"), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("shell", [">&-", "2>&-", ">&- 2>&-", "<&-"])
def test_a_command_started_with_a_descriptor_closed_ends_with_its_status(shell, tmp_path):
    shown = focus(tmp_path, "config", "show", shell=shell)
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, (shown.returncode, shown.stderr)
    assert ("progress" in shown.stdout) == (">&-" not in shell.split()), shown.stdout
    refused = focus(tmp_path, "inspect", str(tmp_path / "nothing"), shell=shell)  # an error keeps its status
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, (refused.returncode, refused.stderr)


def test_a_closed_standard_output_is_not_taken_by_the_next_file(tmp_path):
    """The null device holds descriptor 1: the command's first file is not written by
    what writes to its standard output (a subprocess that inherits it, C code)."""
    child = (
        "import os, sys; from cli.streams import install; install(); "
        "f = open(sys.argv[1], 'w'); os.write(1, b'to standard output'); f.close(); print('printed')"
    )
    path = tmp_path / "first-file"
    proc = subprocess.run(
        ["sh", "-c", f"exec {shlex.quote(sys.executable)} -c {shlex.quote(child)} {shlex.quote(str(path))} >&-"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert path.read_text() == ""


@pytest.mark.integration
def test_a_store_in_the_process_memory_is_said_to_be_gone_at_exit(tmp_path):
    done = focus(tmp_path, "collect", "--store", "memory://t", "--tasks", "2", "--transitions", "6", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    warning = [ln for ln in done.stderr.splitlines() if ln.startswith("warning: ")]
    assert warning == [
        "warning: storage root memory://t is this process's memory: what this command saves is gone when it "
        "exits (a rerun starts over); give --store a folder or an object store to keep it"
    ], done.stderr
    assert json.loads(done.stdout)["batch_url"].startswith("memory://t/")
    kept = focus(tmp_path, "collect", "--store", str(tmp_path / "runs"), "--tasks", "2", "--transitions", "6")
    assert kept.returncode == 0 and "warning" not in kept.stderr, kept.stderr[-3000:]
