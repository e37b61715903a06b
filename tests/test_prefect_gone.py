"""The Prefect server goes away while ``focus collect`` runs as a flow, and comes back.

A cuttable TCP relay stands in front of the session's Prefect server (the relay, not
the server, goes away: the server is shared). The command must end with the one error
line naming the Prefect server, nothing else on the terminal but progress, and a rerun
once the server answers again finishes the collection from its saved steps.

Before: Prefect's API log handler wrote ``--- Error logging to API ---`` and the error,
unterminated, to stderr for every batch of records it could not send, glued to the
error line (``All connection attempts failed--- Error logging to API ---``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_errors import SMALL, error_line

from focus.testing.faults import TcpRelay

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]


def test_prefect_gone_mid_run_is_one_line_and_a_rerun_finishes(tmp_path, prefect_env, prefect_server):
    store = tmp_path / "store"
    args = [*SMALL, "--collection-id", "gone", "--store", str(store), "--transitions", "60"]
    args += ["--set", "search.phases.1.wave_size=2", "--set", 'model.options={"latency_s": 0.05}']
    port = int(prefect_server.rsplit(":", 1)[1].split("/")[0])
    with TcpRelay(port) as relay:
        # no retry of Prefect's client (5 by default: about 2.5 min before the run gives up)
        env = {**prefect_env, "PREFECT_API_URL": f"{relay.url}/api", "PREFECT_CLIENT_MAX_RETRIES": "0"}
        cmd = [sys.executable, "-m", "cli", "collect", *args]
        proc = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        evidence = store / "checkpoints" / "gone" / "n-evidence-w00000.manifest.json"
        deadline = time.monotonic() + 120
        while not evidence.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        relay.cut()
        out, err = proc.communicate(timeout=150)
        done = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
        line = error_line(done)  # the one line, nothing else but progress
        assert "Error logging to API" not in err
        assert f"the Prefect server at {relay.url}/api did not answer" in line and done.returncode == 1
        relay.restore()
        again = subprocess.run([*cmd, "--json"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=150)
    assert again.returncode == 0, again.stderr[-3000:]
    result = json.loads(again.stdout.splitlines()[-1])
    # the steps run without the server (a task run's states travel as events), so the
    # first run may have saved every step and failed reporting the flow's end only
    assert result.get("already_finished") or result["stats"]["steps_reused"] > 0, result
    assert Path(result["batch_url"].removeprefix("file://")).is_dir()
