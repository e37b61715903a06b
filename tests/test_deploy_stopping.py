"""``focus deploy``'s stop (deployments/stopping.py), without a Prefect server: a second
signal while the runs in progress are being cancelled kills their processes at once,
and the stop line says so. The first signal's path - runs cancelled, one line, a Retry
that resumes - runs against a real server in tests/test_deploy_console.py."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from uuid import uuid4

from deployments.stopping import Stopped, stopping_runner


def test_a_second_signal_kills_the_runs_processes_at_once():
    from prefect.runner._process_manager import ProcessHandle

    runner = stopping_runner(1)
    run = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        asyncio.run(runner._process_manager.add(uuid4(), ProcessHandle(run)))
        runner.stopped, runner.stopping = Stopped("SIGINT", cancelled=["manual-1"]), True  # the first: stopping
        runner.handle_sigint()  # the second
        assert run.wait(timeout=10) == -9
    finally:
        run.kill()
        run.wait()
    assert runner.stopped.killed and runner.stopped.by == "SIGINT"
    assert runner.stopped.runs() == (
        "flow run 'manual-1' cancelled, then killed at once (a second signal) (finished steps saved: a Retry in the "
        "UI resumes it after its last finished step); "
    )


def test_a_signal_before_the_runner_serves_stops_it_once_it_does():
    """Before its loop is up, Prefect's handler exited 0 where it stood (no line, the
    deployments left unpaused): the stop is noted and happens once it serves; a second
    signal then unwinds at once."""
    import pytest

    runner = stopping_runner(1)
    runner.handle_sighup()
    assert runner.stopped == Stopped("SIGHUP") and not runner.stopping
    with pytest.raises(KeyboardInterrupt):
        runner.handle_sigint()
