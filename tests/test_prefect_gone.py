"""The Prefect server goes away while ``focus collect`` runs as a flow, and comes back.

A cuttable TCP relay stands in front of the session's Prefect server (the relay, not
the server, goes away: the server is shared). The command must end with the one error
line naming the Prefect server, nothing else on the terminal but progress, soon after
the server went (the flow's watch, ``flows/watch.py``), and a rerun once the server
answers again finishes the collection from its saved steps. A server away for a few
seconds (a restart) fails nothing.

Before the watch, with Prefect's default client retries (``PREFECT_CLIENT_MAX_RETRIES``
= 5), the command ended 152 s after the cut (load average 0.2-1.2): the steps went on
(a task run's states travel as events), then the report's artifact and the flow run's
final state were each retried for over a minute. Before that, Prefect's API log handler
wrote ``--- Error logging to API ---`` and the error, unterminated, to stderr for every
batch of records it could not send, glued to the error line.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fixtures.digits import ran_out
from test_errors import SMALL, error_line

from focus.testing.faults import TcpRelay

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

#: How soon after the cut the command must have ended: the grace (the tests' 2 s; 10 s
#: by default) and a health check's period, the cancelled steps and the services' stop,
#: with room for a loaded 2-core machine (11.1-11.9 s measured with the default grace at
#: load average 2.5-4.2).
ENDED_WITHIN_S = 60.0


def _collect(tmp_path: Path, cid: str, latency_s: float, *more: str, fast_after: Path | None = None) -> list[str]:
    """``focus collect`` of 60 transitions, the model's calls ``latency_s`` each (until
    ``fast_after`` exists, if named: :class:`fixtures.digits.DigitPolicy`)."""
    args = [*SMALL, "--collection-id", cid, "--store", str(tmp_path / "store"), "--transitions", "60"]
    options = json.dumps({"latency_s": latency_s, **({"fast_after": str(fast_after)} if fast_after else {})})
    args += ["--set", "search.phases.1.wave_size=2", "--set", f"model.options={options}", *more]
    return [sys.executable, "-m", "cli", "collect", *args]


def _gated(gate: Path) -> list[str]:
    """``--set`` flags for a model whose calls after the evidence wave's wait at ``gate``
    (``fixtures.digits.gated_policy``): the run is still running when the watch stops it,
    whatever the machine's speed, and the rerun, the gate open, runs at full speed."""
    # 2 tasks x 4 evidence rollouts of at most 4 steps: the evidence wave is never held
    options = json.dumps({"gate": str(gate), "free_calls": 2 * 4 * 4})
    return ["--set", "model.factory=fixtures.digits:gated_policy", "--set", f"model.options={options}"]


def _start_and_cut_after_evidence(cmd: list[str], env: dict[str, str], cwd: Path, relay: TcpRelay) -> Any:
    """Start ``cmd``, cut the relay once its evidence wave is saved; the process and the
    time of the cut."""
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    cid = cmd[cmd.index("--collection-id") + 1]
    evidence = cwd / "store" / "checkpoints" / cid / "n-evidence-w00000.manifest.json"
    deadline = time.monotonic() + 120
    while not evidence.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()
    relay.cut()
    return proc, time.monotonic()


def _gone(
    tmp_path, prefect_env, prefect_server, cid: str, latency_s: float, *more: str, gate: Path | None = None
) -> tuple[float, dict[str, Any]]:
    """Cut the server after the evidence wave; seconds from the cut to the command's end
    (checking its one line) and the rerun's result (``gate``, where the model waits at
    one, opened before the rerun)."""
    port = int(prefect_server.rsplit(":", 1)[1].split("/")[0])
    with TcpRelay(port) as relay:
        env = {**prefect_env, "PREFECT_API_URL": f"{relay.url}/api"}  # Prefect's own retries: the default
        # the command's flow run stays Running on the server (gone when it failed): the
        # rerun closes it once it is silent for two heartbeats and the event lag
        # (flows.abandoned), 6 s with a heartbeat every 0.5 s (25 s with the default 10 s);
        # each test's own collection id, so no rerun waits for another test's run
        more = ("--set", "execution.heartbeat_s=0.5", *more)
        cmd = _collect(tmp_path, cid, latency_s, *more)
        proc, cut_at = _start_and_cut_after_evidence(cmd, env, tmp_path, relay)
        out, err = proc.communicate(timeout=150)
        ended_s = time.monotonic() - cut_at
        done = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
        line = error_line(done)  # the one line, nothing else but progress
        assert "Error logging to API" not in err
        assert f"the Prefect server at {relay.url}/api did not answer" in line and done.returncode == 1
        relay.restore()
        if gate is not None:
            gate.touch()
        again = subprocess.run([*cmd, "--json"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=150)
    assert again.returncode == 0, again.stderr[-3000:]
    result = json.loads(again.stdout.splitlines()[-1])
    assert Path(result["batch_url"].removeprefix("file://")).is_dir()
    return ended_s, result


def test_prefect_gone_mid_run_is_one_line_soon_and_a_rerun_finishes(tmp_path, prefect_env, prefect_server):
    # steps of 50 ms: the collection may finish before the server is found gone; then
    # the report's artifact waits on Prefect's retries until the watch cancels it. A
    # grace of 2 s, as below: with the default (10 s) the test waited 8 s more for the
    # same ending (the blip test below keeps the default, which it rides out)
    ended_s, result = _gone(tmp_path, prefect_env, prefect_server, "gone", 0.05, "--set", "execution.prefect_grace_s=2")
    assert ended_s < ENDED_WITHIN_S, ended_s
    assert result.get("already_finished") or result["stats"]["steps_reused"] > 0, result


def test_prefect_gone_stops_the_steps_and_the_rerun_runs_the_rest(tmp_path, prefect_env, prefect_server):
    # the model's calls after the evidence wave wait at a gate, opened only for the rerun:
    # the run is mid-collection when the watch stops it (a grace of 2 s), however fast the
    # machine, and the rerun runs the rest at full speed. (Steps of 0.5 s did the same
    # and cost the rerun 20 s on a loaded machine)
    gate = tmp_path / "gate"
    more = ["--set", "execution.prefect_grace_s=2", *_gated(gate)]
    ended_s, result = _gone(tmp_path, prefect_env, prefect_server, "gone-held", 0.0, *more, gate=gate)
    assert ended_s < ENDED_WITHIN_S, ended_s
    assert not ran_out(gate).exists()  # the watch stopped the held calls; their hold did not end
    assert not result.get("already_finished") and result["stats"]["steps_reused"] > 0, result
    assert result["stats"]["steps"] > result["stats"]["steps_reused"], result  # the rerun ran the rest


def test_prefect_away_for_a_few_seconds_fails_nothing(tmp_path, prefect_env, prefect_server):
    # away 4 s: more than a restart's second or two, and long enough that a health check
    # (every 2 s, a refused connection tried for 1.5 s by Prefect's transport) fails
    # within it, so the watch is seen to ride the outage out
    # the model's calls take 0.5 s until the server is back (steps go on through the
    # outage, and the run outlasts it), then none: the rest of the run (5-9 s at 0.5 s,
    # on a loaded machine) checks nothing the outage did not
    port, restored = int(prefect_server.rsplit(":", 1)[1].split("/")[0]), tmp_path / "restored"
    with TcpRelay(port) as relay:
        env = {**prefect_env, "PREFECT_API_URL": f"{relay.url}/api", "XDG_STATE_HOME": str(tmp_path / "state")}
        cmd = [*_collect(tmp_path, "blip", 0.5, fast_after=restored), "--json"]
        proc, _ = _start_and_cut_after_evidence(cmd, env, tmp_path, relay)
        time.sleep(4.0)
        relay.restore()
        assert proc.poll() is None  # the outage fell within the run
        # full speed only once the watch has seen the server back: touched at once, the run
        # ended before the next health check, and the "answers again" line was never written
        back = f"the Prefect server at {relay.url}/api answers again after"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            logs = list((tmp_path / "state" / "focus" / "logs").glob("collect-*.log"))
            if logs and back in logs[0].read_text(encoding="utf-8"):
                break
            time.sleep(0.2)
        restored.touch()
        out, err = proc.communicate(timeout=150)
    assert proc.returncode == 0, err[-3000:]
    result = json.loads(out.splitlines()[-1])
    assert result["stats"]["steps_reused"] == 0, result
    runs = httpx.post(f"{prefect_server}/flow_runs/filter", json={"flow_runs": {"name": {"any_": ["blip"]}}}).json()
    assert [r["state_type"] for r in runs] == ["COMPLETED"], runs
    (log_file,) = (tmp_path / "state" / "focus" / "logs").glob("collect-*.log")
    text = log_file.read_text(encoding="utf-8")
    assert f"the Prefect server at {relay.url}/api did not answer a health check" in text, text[-3000:]
    assert f"the Prefect server at {relay.url}/api answers again after" in text, text[-3000:]
