"""A test session that ran a flow against its Prefect server ends without Prefect's
``--- Error logging to API ---``: the fixtures send what Prefect's log worker still holds
while the server is up (tests/fixtures/prefect.py, ``send_pending_prefect_logs``).

Before, a test whose flow run ended less than a batch interval (2 s) before the session's
end left the run's last lines to the worker's drain at interpreter exit, after the
server had been stopped: the output ended with ``--- Error logging to API ---`` and
``All connection attempts failed`` (``tests/test_run_parameters.py`` run alone, or as a
worker's last file)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[1]


def test_a_session_whose_last_test_ran_a_flow_ends_without_error_logging_to_api(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "FOCUS_", "PYTEST_"))}
    # the last test of the session ends right after its flow run, no pause, no flush
    test = "tests/test_run_parameters.py::test_the_workers_variables_may_complete_a_runs_config"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:randomly", test],
        cwd=ROOT,
        env={**env, "TMPDIR": str(tmp_path)},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=240,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "1 passed" in out, out[-3000:]
    assert "Error logging to API" not in out, out[-3000:]
