"""The focus command: the embedded default end to end, inspect, and config errors before work."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from fixtures.prefect import base_env
from typer.testing import CliRunner

from flows.cli import app

pytestmark = pytest.mark.timeout(240)


@pytest.mark.integration
def test_collect_embedded_default_then_inspect(tmp_path):
    """No model, no Prefect server, no Dask address: everything starts locally."""
    env = {**base_env(tmp_path / "prefect"), "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180"}
    cmd = [sys.executable, "-m", "flows.cli", "collect", "--tasks", "2", "--transitions", "6", "--collection-id", "emb"]
    cmd += ["--set", "agent.sampling.max_tokens=8", "--set", "agent.max_steps=4", "--json"]
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=220)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["batch_url"] == f"file://{os.path.realpath(tmp_path)}/runs/batches/emb/iter-000000"
    assert result["stats"]["transitions"] >= 6 and result["stats"]["failed_rollouts"] == 0

    out = CliRunner().invoke(app, ["inspect", result["batch_url"], "--json"])
    assert out.exit_code == 0, out.output
    summary = json.loads(out.output)
    assert summary["actor_rows"] == result["stats"]["actor_rows"] > 0
    assert summary["policy_versions"] and summary["phases"][1]["name"] == "continue"
    table = CliRunner().invoke(app, ["inspect", result["batch_url"]])
    assert "actor_rows" in table.output and "advantage_mean" in table.output


def test_invalid_config_fails_before_any_work(tmp_path):
    out = CliRunner().invoke(
        app, ["collect", "--set", "search.phases.1.wave_size=0", "--store", str(tmp_path / "s")], env={}
    )
    assert out.exit_code == 2
    assert "search.phases.1.wave_size: Input should be greater than or equal to 1" in out.output
    assert not (tmp_path / "s").exists()
    out = CliRunner().invoke(app, ["collect", "--set", "nokey"])
    assert out.exit_code == 2 and "expected KEY=VALUE" in out.output


def test_inspect_names_a_missing_batch(tmp_path):
    out = CliRunner().invoke(app, ["inspect", f"file://{tmp_path}/batches/none/iter-000000"])
    assert out.exit_code == 1 and "cannot read batch" in out.output
    out = CliRunner().invoke(app, ["inspect", str(tmp_path)])
    assert out.exit_code == 2 and "not a batch URL" in out.output
