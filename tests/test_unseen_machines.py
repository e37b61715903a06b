"""``focus`` as a user runs it on machines unlike CI's (which runs as root, with a UTF-8
locale, a writable home and every descriptor open): each case works, or stops with one
line naming the cause, never a traceback.

- Standard output or error closed at the start (``focus collect >&-``, ``2>&-``; cron
  and some service managers start jobs so): every command did its work, then ended with
  ``AttributeError: 'NoneType' object has no attribute 'flush'`` and exit 1; and the
  first file it opened took descriptor 1, so what wrote to standard output wrote into it.
- A ``memory://`` store: the batch is gone when the command exits, and the command
  printed its URL and a ``rerun or resume`` line without a word of that.
- Another user (root only), umask 077, a far time zone, no home, no git, the C locale,
  a folder named with spaces and accents, together: it works (no defect found; kept so
  that it stays so).
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


NOBODY = 65534
#: What a Python needs of the environment to start at all (one that finds libpython through it).
LOADER = {k: os.environ[k] for k in ("LD_LIBRARY_PATH",) if k in os.environ}


def _as(uid: int | None):  # type: ignore[no-untyped-def]
    """What the child does before it runs: umask 077, and the user ``uid`` (root only)."""

    def setup() -> None:
        os.umask(0o077)
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)

    return setup


def _runs_as(uid: int) -> bool:
    """Whether the user ``uid`` can run this interpreter and import the checkout (a
    Python installed under root's home cannot: the test is then skipped)."""
    try:
        probe = subprocess.run(
            [sys.executable, "-c", "import cli.entry"],
            cwd="/",
            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", **LOADER},
            preexec_fn=_as(uid),  # noqa: PLW1509 - the child sets its own user
            capture_output=True,
            timeout=60,
        )
    except PermissionError:  # the interpreter itself
        return False
    return probe.returncode == 0


@pytest.mark.integration
@pytest.mark.parametrize("user", ["this", "nobody"])
def test_collect_as_another_user_with_umask_077_a_far_zone_no_home_no_git_and_odd_folders(user, tmp_path):
    """CI runs as root, with a home, git and a UTF-8 locale: here a collection runs with
    none of them - umask 077, TZ 14 hours ahead, HOME and the XDG folders unset, no git on
    PATH, the C locale (UTF-8 mode off), a working folder named with spaces and non-ASCII
    letters - as this user, and as ``nobody`` where the test runs as root. It finishes,
    its files are private, and its rerun finds it finished."""
    uid = None
    if user == "nobody":
        if os.geteuid() != 0:
            pytest.skip("only root can run a command as another user")
        if not _runs_as(NOBODY):
            pytest.skip("this Python cannot be run by another user (installed under a private folder)")
        uid = NOBODY
    import tempfile

    # not under the tests' temporary folder, private to this user (tests/conftest.py)
    top = Path(tempfile.mkdtemp(prefix="focus-unseen-", dir="/tmp" if os.path.isdir("/tmp") else None))
    try:
        top.chmod(0o777)
        work = top / "a project é ü"
        work.mkdir()
        work.chmod(0o777)
        env = {
            "PATH": "/usr/sbin:/sbin",  # no git (nor anything else of /usr/bin)
            "PYTHONPATH": str(ROOT),
            "TZ": "Pacific/Kiritimati",
            "LC_ALL": "C",
            "PYTHONCOERCECLOCALE": "0",
            "PYTHONUTF8": "0",
            **LOADER,
        }
        args = [sys.executable, "-m", "cli", "collect", "--tasks", "2", "--transitions", "6", "--collection-id", "u1"]
        runs = [
            subprocess.run(
                [*args, "--json"],
                cwd=work,
                env=env,
                preexec_fn=_as(uid),  # noqa: PLW1509
                capture_output=True,
                timeout=200,
            )
            for _ in range(2)
        ]
        for done in runs:
            err = done.stderr.decode("utf-8", "replace")
            assert done.returncode == 0 and "Traceback" not in err, err[-3000:]
        first, again = (json.loads(r.stdout.decode().splitlines()[-1]) for r in runs)
        assert first["stats"]["failed_rollouts"] == 0 and again.get("already_finished") is True
        saved = [p for p in (work / "runs").rglob("*") if p.is_file()]
        assert saved and all(p.stat().st_mode & 0o077 == 0 for p in saved)
        assert {p.stat().st_uid for p in saved} == {os.geteuid() if uid is None else uid}
    finally:
        import shutil

        shutil.rmtree(top, ignore_errors=True)
