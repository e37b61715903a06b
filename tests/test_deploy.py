"""Deployments against a real Prefect server: the UI's Run button (create_flow_run)
completes a run, and its Retry button (set_state AwaitingRetry) resumes a failed run."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import pytest
from fixtures.prefect import kill_tree

pytestmark = pytest.mark.timeout(240)

CONFIG = """
seed = 3
progress = false
[model]
kind = "factory"
factory = "fixtures.prefect:digit_policy"
[env]
n_tasks = 2
[[search.phases]]
name = "evidence"
rollouts_per_task = 2
[[search.phases]]
name = "continue"
transitions = 12
wave_size = 3
[critic]
kind = "factory"
factory = "fixtures.prefect:flaky_critic"
options = {{marker = "{marker}"}}
[execution]
kind = "local"
[storage]
root = "{root}"
"""


def create_run(api: str, deployment_id: str) -> dict:
    """POST create_flow_run; a busy SQLite-backed server may answer 503 (Prefect's own
    client retries those too), so retry a few times."""
    for _ in range(20):
        r = httpx.post(f"{api}/deployments/{deployment_id}/create_flow_run", json={}, timeout=30)
        if r.status_code != 503:
            break
        time.sleep(1.0)
    assert r.status_code in (200, 201), r.text
    return r.json()


def wait_state(api: str, run_id: str, want: set[str], timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = httpx.get(f"{api}/flow_runs/{run_id}", timeout=30).json()
        if run["state_type"] in want:
            return run
        time.sleep(0.3)
    raise AssertionError(f"flow run {run_id} stayed {run['state_type']} (wanted {want})")


def test_run_button_completes_and_retry_resumes(prefect_server, prefect_env, tmp_path):
    api = prefect_server
    marker = tmp_path / "critic-down"
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(CONFIG.format(marker=marker, root=tmp_path / "store"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "deployments.serve", "--config", str(cfg), "--cron", "0 3 * * *"],
        env=prefect_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 90
        while (r := httpx.get(f"{api}/deployments/name/collect/manual")).status_code != 200:
            assert proc.poll() is None and time.monotonic() < deadline, "deployments were not registered"
            time.sleep(0.3)
        manual = r.json()
        scheduled = httpx.get(f"{api}/deployments/name/collect/scheduled").json()
        assert [s["schedule"]["cron"] for s in scheduled["schedules"]] == ["0 3 * * *"]

        # the Run button
        run = create_run(api, manual["id"])
        assert wait_state(api, run["id"], {"COMPLETED", "FAILED", "CRASHED"})["state_type"] == "COMPLETED"

        # a run that fails in critic scoring, after its evidence rollouts are stored
        marker.write_text("down")
        run = create_run(api, manual["id"])
        assert wait_state(api, run["id"], {"COMPLETED", "FAILED", "CRASHED"})["state_type"] == "FAILED"
        marker.unlink()
        # the Retry button
        r = httpx.post(
            f"{api}/flow_runs/{run['id']}/set_state", json={"state": {"type": "SCHEDULED", "name": "AwaitingRetry"}}
        )
        assert r.status_code in (200, 201), r.text
        done = wait_state(api, run["id"], {"COMPLETED", "FAILED", "CRASHED"})
        assert done["state_type"] == "COMPLETED" and done["run_count"] == 2

        # the retry reused the stored evidence rollouts instead of redoing them
        cid = f"{done['name']}-{run['id'][:8]}"
        arts = httpx.post(f"{api}/artifacts/filter", json={"artifacts": {"key": {"any_": [f"{cid}-steps"]}}}).json()
        assert arts, f"no steps artifact for {cid}"
        data = arts[0]["data"]
        steps = {
            (s["phase"], s.get("wave")): s["reused"] for s in (json.loads(data) if isinstance(data, str) else data)
        }
        assert steps[("evidence", 0)] is True and steps[("evidence.score", 0)] is False
    finally:
        kill_tree(proc)
