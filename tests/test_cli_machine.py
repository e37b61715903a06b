"""The focus command on machines set up unlike the developer's: a home it cannot write
(a read-only or missing home, a container's), a temporary folder elsewhere, paths with
spaces, the C locale, no terminal, an HTTP proxy in the environment.

A home that cannot be written used to stop ``focus collect`` before anything ran:
``error: permission denied on <home>/.local: Read-only file system`` (the default log
file's folder), and with ``--prefect`` the temporary Prefect server exited with status 3
(no ``~/.prefect`` for its database). With ``HTTP_PROXY`` set and no ``NO_PROXY``
(many clusters), it stopped with ``the embedded model server on port N never answered
/health``: httpx sent the loopback health check to the proxy.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import typer
from fixtures.prefect import base_env

from cli.common import writable_log_file, writable_prefect_home
from cli.entry import home_or_temporary, loopback_without_proxy

pytestmark = pytest.mark.timeout(240)


def test_a_log_file_that_cannot_be_made_moves_to_the_temporary_folder(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "home"
    blocker.write_text("a file where a folder should be")  # what a read-only home gives: mkdir fails
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    wanted = blocker / ".local" / "state" / "focus" / "logs" / "collect-1.log"
    got = writable_log_file(wanted)
    assert got == tmp_path / "tmp" / f"focus-logs-{os.getuid()}" / "collect-1.log" and got.exists()
    err = capsys.readouterr().err
    assert f"cannot write the log file {wanted} ({blocker} is a file, not a folder)" in err
    assert f"logging to {got} instead" in err
    ok = tmp_path / "logs" / "x.log"
    assert writable_log_file(ok) == ok  # a writable one is kept, silently
    assert capsys.readouterr().err == ""
    monkeypatch.setattr("tempfile.tempdir", str(blocker / "tmp"))
    assert writable_log_file(wanted) == Path(os.devnull)  # nowhere to write: no log, still no crash


@pytest.mark.parametrize("under", ["x.log", "sub/x.log"])
def test_a_log_file_option_under_a_file_is_one_line_naming_the_file_and_exit_2(tmp_path, under):
    """``--log-file`` whose folder is a file: the OS says only "File exists" (or "Not a
    directory"), and the command went on logging somewhere else. A path the user named
    is not moved: one line naming the file in the way, exit 2, before anything starts."""
    blocker = tmp_path / "afile"
    blocker.write_text("")
    wanted = blocker / under
    done = subprocess.run(
        [sys.executable, "-m", "cli", "collect", "--tasks", "1", "--log-file", str(wanted), "--store", str(tmp_path)],
        cwd=tmp_path,
        env=base_env(tmp_path / "prefect"),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [
        f"error: --log-file {wanted}: cannot write it ({blocker} is a file, not a folder)"
    ]
    assert done.stdout == ""
    with pytest.raises(typer.Exit):  # the function itself, as the command calls it
        writable_log_file(wanted, chosen=True)


def test_the_log_file_fallback_is_not_a_folder_others_can_write(tmp_path, monkeypatch, capsys):
    """``/tmp`` is shared: a ``focus-logs-<uid>`` folder that others can write into (made
    by another user, who could put a link named like the log file there) is not used;
    the log goes to a fresh folder only this user can open. It was used as found."""
    blocker = tmp_path / "home"
    blocker.write_text("")
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    shared = tmp_path / f"focus-logs-{os.getuid()}"
    shared.mkdir()
    os.chmod(shared, 0o777)
    got = writable_log_file(blocker / "logs" / "collect-1.log")
    assert got.exists() and got.parent != shared and not list(shared.iterdir())
    assert got.parent.name.startswith(f"focus-logs-{os.getuid()}-") and got.parent.stat().st_mode & 0o077 == 0
    assert f"logging to {got} instead" in capsys.readouterr().err


def test_prefect_home_moves_to_the_temporary_folder_only_when_home_cannot_hold_it(tmp_path, monkeypatch):
    blocker = tmp_path / "home"
    blocker.write_text("")
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    monkeypatch.setenv("HOME", str(blocker / "h"))
    env: dict[str, str] = {}
    writable_prefect_home(env)
    assert env["PREFECT_HOME"].startswith(str(tmp_path / "tmp" / "focus-prefect-"))
    mine = {"PREFECT_HOME": "/somewhere/else"}
    writable_prefect_home(mine)
    assert mine == {"PREFECT_HOME": "/somewhere/else"}  # the user's choice stays
    monkeypatch.setenv("HOME", str(tmp_path / "fine"))
    fine: dict[str, str] = {}
    writable_prefect_home(fine)
    assert fine == {} and (tmp_path / "fine" / ".prefect").is_dir()


def test_no_home_at_all_gives_the_temporary_folder(tmp_path, monkeypatch):
    """``HOME`` unset under a user id with no password entry: ``Path.home()`` raises,
    and with it the default log file (``flows.logs.default_log_file``)."""
    from unittest import mock

    from flows.logs import default_log_file

    monkeypatch.setenv("HOME", "")  # then removed: the HOME home_or_temporary() sets is undone after the test
    monkeypatch.delenv("HOME")
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)  # set, it names the log's folder without a home
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    with mock.patch("pwd.getpwuid", side_effect=KeyError("uid 12345")):
        with pytest.raises(RuntimeError, match="Could not determine home directory"):
            default_log_file()
        home_or_temporary()
        assert os.environ["HOME"] == str(tmp_path)
        assert default_log_file().is_relative_to(tmp_path)
    mine = {"HOME": "/home/me"}
    home_or_temporary(mine)
    assert mine == {"HOME": "/home/me"}
    known: dict[str, str] = {}
    with mock.patch("pwd.getpwuid", return_value=SimpleNamespace(pw_dir="/home/known")):
        home_or_temporary(known)  # no HOME, but this user id has an entry: Path.home() finds it
    assert known == {}


def test_a_proxy_in_the_environment_leaves_loopback_alone():
    env = {"HTTPS_PROXY": "http://proxy:3128", "no_proxy": "internal.example, localhost"}
    loopback_without_proxy(env)
    assert env["NO_PROXY"] == "127.0.0.1,localhost,::1"
    assert env["no_proxy"] == "internal.example,localhost,127.0.0.1,::1"  # the user's hosts stay
    quiet: dict[str, str] = {}
    loopback_without_proxy(quiet)
    assert quiet == {}  # no proxy: nothing to do


@pytest.mark.integration
def test_the_embedded_server_starts_and_answers_with_a_proxy_set(monkeypatch):
    """The library alone (no command to set ``NO_PROXY``): its loopback checks ignore
    proxies, as the model client (aiohttp) always did."""
    from focus.backends import LocalModelServer

    for key in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    with LocalModelServer() as server:
        assert server.policy_version


@pytest.mark.integration
@pytest.mark.slow
def test_collect_runs_with_an_unwritable_home_spaces_the_c_locale_and_no_terminal(tmp_path):
    """One collection on the embedded model: home under a file (nothing can be made
    there), working folder, store and TMPDIR with spaces, ``LC_ALL=C``, standard input
    closed, no terminal, a proxy that nothing answers set and no ``NO_PROXY``. It
    finishes, says where the log went, and the log is there."""
    work = tmp_path / "a folder"
    tmp = tmp_path / "tmp dir"
    work.mkdir()
    tmp.mkdir()
    (tmp_path / "homefile").write_text("")
    env = base_env(tmp_path / "prefect")
    for key in ("XDG_STATE_HOME", "NO_PROXY", "no_proxy"):
        env.pop(key, None)
    env.update(HTTP_PROXY="http://127.0.0.1:9", http_proxy="http://127.0.0.1:9")
    env.update(HOME=str(tmp_path / "homefile" / "h"), LANG="C", LC_ALL="C", TMPDIR=str(tmp), TERM="dumb")
    args = ["collect", "--tasks", "2", "--transitions", "6", "--collection-id", "c1", "--store", str(work / "runs x")]
    done = subprocess.run(
        [sys.executable, "-m", "cli", *args, "--json"],
        cwd=work,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["stats"]["failed_rollouts"] == 0 and " " in result["batch_url"]
    assert "Traceback" not in done.stderr
    logs = list((tmp / f"focus-logs-{os.getuid()}").glob("collect-*.log"))
    assert len(logs) == 1 and f"logging to {logs[0]} instead" in done.stderr
    assert "collection c1: batch at" in logs[0].read_text(encoding="utf-8")


def test_the_suite_imports_prefect_quietly_where_home_cannot_hold_its_folder(tmp_path):
    """The test process (tests/conftest.py) under a ``HOME`` where ``~/.prefect`` cannot be
    made (here a file; a read-only or missing home for a CI user): Prefect, imported by
    the tests, warned "Failed to create the Prefect home directory" into the summary. The
    conftest points ``PREFECT_HOME`` at the temporary folder, as the command does."""
    home = tmp_path / "home-is-a-file"
    home.write_text("", encoding="utf-8")
    code = (
        "import sys, warnings; sys.path.insert(0, 'tests'); import conftest; "
        "warnings.simplefilter('error'); import prefect.settings; "
        "print(prefect.settings.get_current_settings().home)"
    )
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_HOME"}
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=Path(__file__).resolve().parents[1],
        env={**env, "HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert not done.stdout.strip().startswith(str(home)), done.stdout


def test_the_command_raises_its_soft_limit_on_open_files_to_the_hard_one():
    """A soft limit of 64 under a hard one of 4096 (``ulimit -Sn 64``; a laptop's 256):
    64 rollouts in flight, a connection each, stopped the collection with ``Too many open
    files``. The command takes what the hard limit allows (up to 10240); a hard limit
    stays as it is."""
    code = (
        "import resource, sys; R = resource.RLIMIT_NOFILE; resource.setrlimit(R, tuple(map(int, sys.argv[1:]))); "
        "from cli.entry import more_open_files; more_open_files(); print(*resource.getrlimit(R))"
    )
    import resource

    top = resource.getrlimit(resource.RLIMIT_NOFILE)[1]  # a limit may be lowered, not raised
    top = 1 << 20 if top == resource.RLIM_INFINITY else top
    wanted = {(64, min(4096, top)): [min(4096, top)] * 2, (64, 64): [64, 64]}
    if top > 10240:
        wanted[128, top] = [10240, top]
    got = {}
    for soft, hard in wanted:
        done = subprocess.run(
            [sys.executable, "-c", code, str(soft), str(hard)],
            cwd=Path(__file__).resolve().parents[1],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        got[soft, hard] = [int(x) for x in done.stdout.split()]
    assert got == wanted


@pytest.mark.integration
@pytest.mark.slow
def test_a_collection_past_the_limit_on_open_files_stops_in_one_line_naming_it(tmp_path):
    """64 rollouts in flight (the default) under ``prlimit --nofile=48:4096``: it finishes
    (the soft limit is raised); under 48:48 it stops in one line naming the limit and
    what to change, not ``OSError: [Errno 24] Too many open files: <a file>``, and no
    thread's traceback reaches the terminal.

    Where the limit is met is known: at its peak the command holds about 70 files, 63 of
    them sockets (a connection per rollout in flight), so under 48 the first wave's model
    connections run out of descriptors, before any file of the store. It was a race: the
    client retried that ``EMFILE`` as a connection failure, and the run stopped only where
    a file open met the limit first, else it finished with exit 0 (under load, now and
    then). Now the first connection this process cannot open stops it."""
    import resource
    import shutil

    if shutil.which("prlimit") is None:
        pytest.skip("needs prlimit (util-linux)")
    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 4096:
        pytest.skip("needs a hard limit on open files of 4096 or more (a limit may be lowered, not raised)")
    env = base_env(tmp_path / "prefect")
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    # the evidence's 128 rollouts (2 a task), 64 in flight, then three continuation waves
    # and the export (300 transitions added nine more waves, about 8 s at load 12; the
    # default 4 rollouts a task, 256, held no more files at once, in twice the time)
    args = ["collect", "--tasks", "64", "--transitions", "60", "--collection-id", "c1"]
    args += ["--set", "search.phases.0.rollouts_per_task=2"]
    for limit in ("48:4096", "48:48"):
        done = subprocess.run(
            ["prlimit", f"--nofile={limit}", sys.executable, "-m", "cli", *args, "--store", str(tmp_path / limit)],
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=200,
        )
        if limit == "48:4096":
            assert done.returncode == 0, done.stderr[-3000:]
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("error:")]
    assert line.startswith("error: too many open files connecting to the model service at http://127.0.0.1:"), line
    assert "this process reached its limit on open files, 48 (`ulimit -n`; hard limit 48)" in line
    assert "execution.max_concurrency" in line


@pytest.mark.parametrize("tz", ["Pacific/Kiritimati", "America/St_Johns", "UTC"])
def test_log_file_name_and_lines_are_in_utc_as_collection_ids(tmp_path, tz):
    """Collection ids name their time in UTC; the default log file's name and its lines
    were local time: under ``TZ=Pacific/Kiritimati`` (UTC+14) a run's log was named a day
    after its collection's id (``collect-20261208-...log`` beside ``collect-20261207-...``)
    and its lines said ``+14:00``. Both are UTC now, the lines with their day and
    ``+00:00`` (before that, lines named neither day nor zone: ``09:26:07.123``)."""
    import re
    from datetime import UTC, datetime, timedelta

    code = (
        "import io, logging, sys; from pathlib import Path; from rich.console import Console; "
        "from flows.logs import default_log_file, setup; from flows.preflight import new_collection_id; "
        "print(new_collection_id('collect', token='abcdef')); print(default_log_file('collect').name); "
        "setup(Console(file=io.StringIO()), log_file=Path(sys.argv[1])); "
        "logging.getLogger('focus.collect').info('one line')"
    )
    log = tmp_path / "x.log"
    done = subprocess.run(
        [sys.executable, "-c", code, str(log)],
        cwd=Path(__file__).resolve().parents[1],
        env={**os.environ, "TZ": tz},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    cid, name = done.stdout.splitlines()[-2:]
    line = log.read_text(encoding="utf-8").splitlines()[-1]
    got = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\.\d{3}\+00:00 \| INFO    \| focus.collect - one line", line)
    assert got, line
    named = re.fullmatch(r"collect-(\d{8}-\d{6})-\d+\.log", name)
    assert named, name
    utc = {
        "id": datetime.strptime(cid[len("collect-") : -len("-abcdef")], "%Y%m%d-%H%M%S").replace(tzinfo=UTC),
        "name": datetime.strptime(named[1], "%Y%m%d-%H%M%S").replace(tzinfo=UTC),
        "line": datetime.fromisoformat(got[1]).replace(tzinfo=UTC),
    }
    assert max(utc.values()) - min(utc.values()) < timedelta(seconds=30), utc  # moments apart, not hours
    assert abs(datetime.now(UTC) - utc["id"]) < timedelta(minutes=2), utc


def test_dask_workers_log_lines_in_utc(tmp_path):
    """The logging configuration Dask worker processes get
    (``flows.logs.dask_workers_log_to``) under ``TZ=Pacific/Kiritimati``: their lines
    said local time with its offset (``2026-12-08T00:56:38+1400``) beside the command's
    own, in UTC."""
    import re
    from datetime import UTC, datetime, timedelta

    code = (
        "import sys; from pathlib import Path; from flows.logs import dask_workers_log_to; "
        "dask_workers_log_to(Path(sys.argv[1])); import logging, distributed; "
        "logging.getLogger('distributed.worker').warning('a worker line')"
    )
    log = tmp_path / "w.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DASK_")}
    done = subprocess.run(
        [sys.executable, "-c", code, str(log)],
        cwd=Path(__file__).resolve().parents[1],
        env={**env, "TZ": "Pacific/Kiritimati"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    line = log.read_text(encoding="utf-8").splitlines()[-1]
    got = re.fullmatch(r"(\S+)\.\d{3}\+00:00 \| WARNING \| distributed.worker - a worker line", line)
    assert got, line
    assert abs(datetime.now(UTC) - datetime.fromisoformat(got[1]).replace(tzinfo=UTC)) < timedelta(minutes=2), line


def test_a_prefect_home_that_cannot_be_written_is_named_before_the_server_starts(tmp_path):
    from flows.server import PrefectHomeUnwritable, check_prefect_home

    (tmp_path / "file").write_text("", encoding="utf-8")
    bad = str(tmp_path / "file" / "prefect")
    with pytest.raises(PrefectHomeUnwritable) as e:
        check_prefect_home({"PREFECT_HOME": bad})
    assert str(e.value).startswith(f"PREFECT_HOME={bad} cannot be written (Not a directory): the temporary Prefect")
    check_prefect_home({"PREFECT_HOME": bad, "PREFECT_SERVER_DATABASE_CONNECTION_URL": "postgresql://db/p"})
    check_prefect_home({"PREFECT_HOME": str(tmp_path / "new")})  # made, as Prefect would
    assert (tmp_path / "new").is_dir()
    check_prefect_home({})  # unset: the command moved it where it can be written


@pytest.mark.integration
@pytest.mark.slow
def test_collect_under_prefect_with_a_prefect_home_it_cannot_write_says_so(tmp_path):
    """``PREFECT_HOME`` set to a folder this user cannot write (here under a file): the
    temporary server exited with status 3 and the line said ``RuntimeError: the temporary
    Prefect server exited with status 3 while starting (see the log file)``."""
    (tmp_path / "file").write_text("", encoding="utf-8")
    env = base_env(tmp_path / "file" / "prefect")
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    args = ["collect", "--prefect", "--tasks", "2", "--transitions", "6", "--store", str(tmp_path / "runs")]
    done = subprocess.run(
        [sys.executable, "-m", "cli", *args],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: PREFECT_HOME={tmp_path / 'file' / 'prefect'} cannot be written (Not a directory): the temporary "
        "Prefect server keeps its database there; set PREFECT_HOME to a folder you can write (or unset it), or "
        "PREFECT_API_URL to a running server"
    )


def test_a_relative_xdg_state_home_is_ignored(tmp_path, monkeypatch):
    """``XDG_STATE_HOME=state`` (relative, which the XDG specification says to ignore): the
    default log file went under ``./state`` of whatever folder the command ran in."""
    from flows.logs import default_log_file

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_STATE_HOME", "state")
    assert default_log_file().parent == tmp_path / "home" / ".local" / "state" / "focus" / "logs"
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert default_log_file().parent == tmp_path / "xdg" / "focus" / "logs"


def test_a_dask_workers_tornado_errors_go_to_the_log_file(tmp_path):
    """A Dask worker's callback that raised (its memory monitor under ``ulimit -n 64``:
    ``Too many open files``) is logged by tornado: ``Exception in callback`` and a
    traceback reached the terminal, as the command's own tornado records do not."""
    log = tmp_path / "x.log"
    code = (
        "import sys; from pathlib import Path; from flows.logs import dask_workers_log_to; "
        "dask_workers_log_to(Path(sys.argv[1])); import logging, distributed; "
        "logging.getLogger('tornado.application').error('Exception in callback', exc_info=OSError(24, 'x'))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("DASK_")}
    done = subprocess.run(
        [sys.executable, "-c", code, str(log)],
        cwd=Path(__file__).resolve().parents[1],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and "Exception in callback" not in done.stderr, done.stderr[-2000:]
    assert "Exception in callback" in log.read_text(encoding="utf-8")
