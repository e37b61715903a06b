"""The console of a command goes away while it works: a closed pipe, a terminal that
hangs up.

A collection writes progress to standard error and its result to standard output. A
reader that goes away (``focus collect 2>&1 | tee log`` whose ``tee`` is killed, ``| head
-1``, a log shipper that restarts) made the next write fail with EPIPE, on which rich
raises ``SystemExit(1)``: the collection stopped in its evidence, exit 1, no word on the
console or in the log file. Now the command goes on, says so in its log file, and exits
with its work's status. A terminal that closes sends SIGHUP, which killed the command
where it stood (no line, the write lease left behind); it now stops it as SIGTERM does,
exit 129, and the rerun writes the uninterrupted batch. Under ``nohup`` (SIGHUP ignored)
the command outlives its terminal and finishes.
"""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fixtures.prefect import base_env
from fixtures.resume import SLOW_DIGITS, mismatches

from storage import BatchStore, CheckpointStore

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

CONFIG = SLOW_DIGITS
CID = "gone"


def config_file(tmp: Path, root: Path, latency: float, execution: str = "local") -> Path:
    path = tmp / f"{root.name}.toml"
    path.write_text(CONFIG.format(cid=CID, root=root, latency=latency, execution=execution))
    return path


def command(cfg: Path, log: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "cli", "collect", "--config", str(cfg), "--log-file", str(log), *extra]


def batch(root: Path):  # type: ignore[no-untyped-def]
    store = BatchStore(str(root))
    return store.read(store.url_for(CID, 0))


def saved(root: Path) -> set[tuple[str, int]]:
    try:
        return {(str(p), w) for p, w in CheckpointStore(str(root)).list(CID)}
    except Exception:  # noqa: BLE001 - the store does not exist yet
        return set()


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> Path:  # type: ignore[no-untyped-def]
    """The uninterrupted collection's store."""
    tmp = tmp_path_factory.mktemp("clean")
    root = tmp / "store"
    cfg = config_file(tmp, root, latency=0.0)
    done = subprocess.run(
        command(cfg, tmp / "log"), env=base_env(tmp / "prefect"), capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return root


def test_a_closed_standard_error_does_not_stop_the_collection(clean, tmp_path):
    """Standard error is a pipe whose reader leaves after the first progress line."""
    root, log = tmp_path / "store", tmp_path / "focus.log"
    cfg = config_file(tmp_path, root, latency=0.05)
    read, write = os.pipe()
    with open(tmp_path / "stdout", "w") as out:
        proc = subprocess.Popen(command(cfg, log), env=base_env(tmp_path / "prefect"), stdout=out, stderr=write)
    os.close(write)
    with os.fdopen(read, "rb") as reader:
        first = reader.readline()  # the evidence's first line; then the reader is gone
    assert proc.wait(timeout=240) == 0, (first, log.read_text()[-3000:])
    got = batch(root)
    assert got.stats["failed_rollouts"] == 0 and mismatches(got, batch(clean)) == {"actor": 0, "critic": 0}
    assert "the console's standard error was closed (Broken pipe): the command goes on" in log.read_text()
    assert "batch: " in (tmp_path / "stdout").read_text()  # the result, on standard output


def test_a_closed_standard_output_leaves_the_exit_status_to_the_work(clean, tmp_path):
    """``focus collect --json | <a reader that is gone>``: the batch is written, exit 0 (it was 1)."""
    root, log = tmp_path / "store", tmp_path / "focus.log"
    cfg = config_file(tmp_path, root, latency=0.0)
    read, write = os.pipe()
    os.close(read)  # no reader at all
    proc = subprocess.Popen(
        command(cfg, log, "--json"), env=base_env(tmp_path / "prefect"), stdout=write, stderr=subprocess.DEVNULL
    )
    os.close(write)
    assert proc.wait(timeout=240) == 0, log.read_text()[-3000:]
    assert mismatches(batch(root), batch(clean)) == {"actor": 0, "critic": 0}
    assert "the console's standard output was closed (Broken pipe)" in log.read_text()


def _hup_default() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def in_terminal_then_close(argv: list[str], env: dict[str, str], root: Path, *, ignore_hup: bool) -> int:
    """Run ``argv`` as the session leader of a pseudo-terminal (as a login shell's job
    is), close the terminal once the first continuation wave is saved (the kernel then
    sends SIGHUP), and return the exit status."""
    pid, fd = pty.fork()
    if pid == 0:
        # as `nohup` leaves it, its output aside; else as a login shell's job has it, whatever
        # this test runs under (pytest started under nohup passes SIGHUP ignored on)
        signal.signal(signal.SIGHUP, signal.SIG_IGN if ignore_hup else signal.SIG_DFL)
        os.execve(argv[0], argv, env)
    try:
        while ("1.continue", 0) not in saved(root):
            ready, _, _ = select.select([fd], [], [], 0.02)
            if ready:
                try:
                    if not os.read(fd, 65536):
                        break
                except OSError:
                    break
            assert os.waitpid(pid, os.WNOHANG) == (0, 0), "the command ended before its terminal closed"
    finally:
        os.close(fd)  # the terminal hangs up
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_a_closed_terminal_stops_the_collection_cleanly(clean, tmp_path):
    """SIGHUP killed the command (exit status -1, the lease left); now: the line, 129,
    the lease released, and the rerun writes the uninterrupted batch."""
    root, log = tmp_path / "store", tmp_path / "focus.log"
    cfg = config_file(tmp_path, root, latency=0.1)
    env = base_env(tmp_path / "prefect")
    code = in_terminal_then_close(command(cfg, log), env, root, ignore_hup=False)
    assert code == 129, log.read_text()[-3000:]
    assert "interrupted (SIGHUP): finished steps are saved" in log.read_text()
    assert not list((root / "leases").glob("*")), "the write lease was left behind"
    done = subprocess.run(command(cfg, tmp_path / "rerun.log"), env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    got = batch(root)
    assert got.stats["failed_rollouts"] == 0 and mismatches(got, batch(clean)) == {"actor": 0, "critic": 0}


def group_gone(pgid: int, timeout_s: float = 60) -> None:
    """Wait until no process of the process group ``pgid`` is left (its children, Dask's
    workers and multiprocessing's resource tracker, exit after the command): then nothing
    more can reach the standard error they share. A fixed 1.5 s could miss a child slower
    than that on a loaded machine, and waited the whole time on a quiet one."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.02)


def test_a_hang_up_of_the_job_leaves_dask_quiet(clean, tmp_path):
    """A shell whose terminal hangs up (an ssh session that drops) sends SIGHUP to each of
    its jobs' process groups: on Dask that is the command, its worker processes and
    multiprocessing's resource tracker. Killed by it, the tracker was started again
    without the workers' records and printed a `KeyError` traceback for each (7-12 in
    probes) into the command's standard error; now only the command's line."""
    root, log, err = tmp_path / "store", tmp_path / "focus.log", tmp_path / "stderr"
    cfg = config_file(tmp_path, root, latency=0.1, execution="dask")
    with open(err, "w") as stderr:
        proc = subprocess.Popen(
            command(cfg, log), env=base_env(tmp_path / "prefect"), stdout=subprocess.DEVNULL, stderr=stderr,
            start_new_session=True,  # a job: its own process group
            preexec_fn=_hup_default,  # a job of a live shell, not of a nohup that started pytest
        )  # fmt: skip
    try:
        while ("1.continue", 0) not in saved(root):
            assert proc.poll() is None, err.read_text()[-3000:]
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGHUP)
        assert proc.wait(timeout=120) == 129, err.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    group_gone(proc.pid)  # what the command's children print after it ended, they printed
    lines = [ln for ln in err.read_text().splitlines() if ln.strip()]
    assert lines[-1].startswith("interrupted (SIGHUP): finished steps are saved"), lines[-20:]
    assert "Traceback" not in err.read_text(), err.read_text()[-3000:]


def test_under_nohup_the_collection_outlives_its_terminal(clean, tmp_path):
    """SIGHUP ignored, as ``nohup`` leaves it: the terminal closes (every write to it
    fails with EIO) and the collection finishes, exit 0."""
    root, log = tmp_path / "store", tmp_path / "focus.log"
    cfg = config_file(tmp_path, root, latency=0.05)
    t0 = time.monotonic()
    code = in_terminal_then_close(command(cfg, log), base_env(tmp_path / "prefect"), root, ignore_hup=True)
    assert code == 0, (time.monotonic() - t0, log.read_text()[-3000:])
    got = batch(root)
    assert got.stats["failed_rollouts"] == 0 and mismatches(got, batch(clean)) == {"actor": 0, "critic": 0}
