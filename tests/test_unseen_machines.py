"""``focus`` as a user runs it on machines unlike CI's (which runs as root, with a UTF-8
locale, a writable home and every descriptor open): each case works, or stops with one
line naming the cause, never a traceback.

- Standard output or error closed at the start (``focus collect >&-``, ``2>&-``; cron
  and some service managers start jobs so): every command did its work, then ended with
  ``AttributeError: 'NoneType' object has no attribute 'flush'`` and exit 1; and the
  first file it opened took descriptor 1, so what wrote to standard output wrote into it.
"""

from __future__ import annotations

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
