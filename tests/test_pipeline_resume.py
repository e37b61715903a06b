"""Resume after kill -9: a CLI collection killed in its continuation phase, run again
with the same collection id, reuses every finished wave and writes the same batch as an
uninterrupted run with the same seed. The run plans waves ahead (the pipeline's default
``search.waves_in_flight = 2``), so the kill lands with a wave still running; the resumed
run plans it again from the stored waves and launches it with the same jobs."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest
from fixtures.resume import kill_when, spawn
from test_pipeline import rows, small_config

from storage import BatchStore, CheckpointStore

pytestmark = pytest.mark.timeout(240)

CONFIG = """
seed = 11
collection_id = "killed"
progress = false
[model]
kind = "factory"
factory = "fixtures.digits:digit_policy"
options = {{latency_s = 0.03}}
[env]
n_tasks = 3
[search]
waves_in_flight = 2
[[search.phases]]
name = "evidence"
rollouts_per_task = 2
[[search.phases]]
name = "continue"
transitions = 60
wave_size = 3
max_depth = 6
[execution]
kind = "dask"
n_workers = 2
heartbeat_s = 0.5
[storage]
root = "{root}"
"""


def test_kill_9_mid_continuation_then_resume_gives_same_batch(prefect_env, prefect_api, tmp_path):
    root = str(tmp_path / "store")
    cfg_file = tmp_path / "collect.toml"
    cfg_file.write_text(CONFIG.format(root=root))
    cmd = [sys.executable, "-m", "cli", "collect", "--config", str(cfg_file), "--json"]
    store = CheckpointStore(root)

    kill_when(  # SIGKILL to the CLI and everything it started (Dask workers)
        spawn(cmd, prefect_env, tmp_path / "killed.log"),
        lambda: any(p == "1.continue.score" and w >= 1 for p, w in store.list("killed")),
        timeout_s=150,
        what="a finished continuation wave",
        log=tmp_path / "killed.log",
    )
    before = [k for k in store.list("killed") if k[0] not in ("config", "critic")]  # not steps
    assert ("export", 0) not in before, "the run finished before it could be killed"

    done = subprocess.run(cmd, env=prefect_env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "distributed." not in done.stderr and "INFO" not in done.stderr  # Dask's chatter is in the log file
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # every finished step before the kill is reused (config check too), nothing else is
    assert result["stats"]["steps_reused"] == len(before) + 1
    resumed = BatchStore(root).read(result["batch_url"])

    # the same collection, uninterrupted, in-process and without Dask
    fresh = small_config(root, "uninterrupted", seed=11)
    fresh = fresh.with_updates(
        **{
            "model.options": {"latency_s": 0.0},
            "env.n_tasks": 3,
            "search.waves_in_flight": 2,
            "search.phases": [p.model_dump() for p in resumed_phases()],
        }
    )
    from flows.collect import collect

    clean = BatchStore(root).read(asyncio.run(collect(fresh))["batch_url"])
    assert rows(resumed) == rows(clean)
    assert len(resumed.actor) > 0 and resumed.stats["transitions"] >= 60


def resumed_phases():
    from focus.priority import Phase

    return [Phase("evidence", rollouts_per_task=2), Phase("continue", transitions=60, wave_size=3, max_depth=6)]
