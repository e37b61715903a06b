"""``focus deploy`` against a real Prefect server, driven through the calls the UI makes.

- Quick run: ``POST /api/deployments/{id}/create_flow_run`` with no parameters.
- Custom run: the same call with a ``config`` parameter (the UI's edited form).
- Retry: ``POST /api/flow_runs/{id}/set_state`` with ``{"type": "SCHEDULED", "name": "AwaitingRetry"}``.

Checked: the states and their messages, the artifacts (statistics with failure causes,
steps, the tree picture), per-deployment configuration files, ``FOCUS_*`` variables of
the serving process applied at run time, readable collection ids that differ for runs
created together, ``--limit`` (runs do not overlap), and node loss: the whole process
tree killed with SIGKILL, the watchdog marks the run Crashed within a bounded time, a
new ``focus deploy`` picks up the Retry and the run resumes from its checkpoints.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import sys
import time
from contextlib import suppress
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from fixtures.prefect import kill_tree

from storage import BatchStore, CheckpointStore

pytestmark = pytest.mark.timeout(240)

FINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
BASE = """
seed = 3
progress = {progress}
[model]
kind = "factory"
factory = "fixtures.digits:digit_policy"
options = {{latency_s = {latency}}}
[env]
n_tasks = 2
[[search.phases]]
name = "evidence"
rollouts_per_task = 2
[[search.phases]]
name = "continue"
transitions = {transitions}
wave_size = 3
[critic]
kind = "factory"
factory = "fixtures.digits:flaky_critic"
options = {{marker = "{marker}"}}
"""


@pytest.fixture(autouse=True)
def _no_watchdog_left(prefect_server):
    """The watchdog automation a test's ``focus deploy`` installs is removed after it: it
    watches every flow run of the session's server, and one left with ``--crash-after
    10`` marked a later test's runs (heartbeats every 10 s, the default) Crashed about
    10 s after they started, so a run due while one ran was no longer refused."""
    from deployments.watchdog import NAME

    yield
    autos = httpx.post(f"{prefect_server}/automations/filter", json={}, timeout=30).json()
    for auto in autos:
        if auto["name"] == NAME:
            httpx.delete(f"{prefect_server}/automations/{auto['id']}", timeout=30)


def create_run(api: str, deployment_id: str, parameters: dict[str, Any] | None = None) -> dict[str, Any]:
    """The UI's Quick run (no body) or Custom run (edited parameters). A busy
    SQLite-backed server may answer 503 (Prefect's client retries those too)."""
    body = {"parameters": parameters} if parameters is not None else {}
    for _ in range(20):
        r = httpx.post(f"{api}/deployments/{deployment_id}/create_flow_run", json=body, timeout=30)
        if r.status_code != 503:
            break
        time.sleep(1.0)
    assert r.status_code in (200, 201), r.text
    return dict(r.json())


def retry(api: str, run_id: str) -> None:
    """The UI's Retry button."""
    r = httpx.post(
        f"{api}/flow_runs/{run_id}/set_state",
        json={"state": {"type": "SCHEDULED", "name": "AwaitingRetry"}},
        timeout=30,
    )
    assert r.status_code in (200, 201), r.text


def read_run(api: str, run_id: str) -> dict[str, Any]:
    return dict(httpx.get(f"{api}/flow_runs/{run_id}", timeout=30).json())


def brief(run: dict[str, Any]) -> dict[str, Any]:
    """A flow run's state and times, for an assertion's message."""
    return {k: run.get(k) for k in ("state_type", "created", "start_time", "end_time")}


def wait_state(api: str, run_id: str, want: set[str], timeout: float = 120, proc: Any = None) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    run: dict[str, Any] = {}
    while time.monotonic() < deadline:
        run = read_run(api, run_id)
        if run["state_type"] in want:
            return run
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"focus deploy exited with {proc.returncode}: {_log_of(proc)}")
        time.sleep(0.3)
    raise AssertionError(f"flow run {run_id} stayed {run.get('state_type')} (wanted {want})")


def artifacts(api: str, run_id: str) -> dict[str, dict[str, Any]]:
    """The run's artifacts by the part of their key after the collection id."""
    arts = httpx.post(
        f"{api}/artifacts/filter", json={"artifacts": {"flow_run_id": {"any_": [run_id]}}}, timeout=30
    ).json()
    return {a["key"].rsplit("-", 1)[1]: a for a in arts if a.get("key")}


def table(artifact: dict[str, Any]) -> list[dict[str, Any]]:
    data = artifact["data"]
    return list(json.loads(data) if isinstance(data, str) else data)


_LOGS: dict[int, Path] = {}


def _log_of(proc: Any) -> str:
    path = _LOGS.get(proc.pid)
    return path.read_text(encoding="utf-8")[-3000:] if path is not None and path.exists() else ""


def deploy(env: dict[str, str], *args: str, log: Path) -> subprocess.Popen[bytes]:
    """``focus deploy`` in the test's folder (a run that names no store writes under ./runs)."""
    out = open(log, "wb")  # noqa: SIM115 - the child keeps it; closed with the process
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli", "deploy", *args],
        cwd=log.parent,
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    _LOGS[proc.pid] = log
    return proc


def deployment(api: str, name: str, proc: subprocess.Popen[bytes], log: Path, since: float) -> dict[str, Any]:
    """The deployment once this ``focus deploy`` (re)registered it: updated after ``since``
    (an earlier test's registration of the same name has other parameters) and not paused
    (an earlier test's ``focus deploy`` pauses it as it stops, which updates it too: a
    second before this test began was after ``since``, and a run created then got that
    test's parameters)."""
    deadline = time.monotonic() + 90
    while True:
        r = httpx.get(f"{api}/deployments/name/collect/{name}", timeout=30)
        if r.status_code == 200:
            d = dict(r.json())
            if datetime.fromisoformat(d["updated"]).timestamp() > since and not d.get("paused"):
                return d
        assert proc.poll() is None, log.read_text(encoding="utf-8")[-3000:]
        assert time.monotonic() < deadline, "deployments were not registered"
        time.sleep(0.3)


def kill_run_process(run: dict[str, Any]) -> None:
    """SIGKILL a flow run's process and its process group. ``focus deploy`` starts it in a
    session of its own (deployments/stopping.py), out of the serving process's group that
    ``kill_tree`` kills; Prefect records no pid for it (``infrastructure_pid`` stays
    empty): it is the process whose environment names the run (``PREFECT__FLOW_RUN_ID``)."""
    want = f"PREFECT__FLOW_RUN_ID={run['id']}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with suppress(OSError):
            if want in (entry / "environ").read_bytes().split(b"\0"):
                pid = int(entry.name)
                if os.getpgid(pid) == pid:
                    os.killpg(pid, signal.SIGKILL)
                else:
                    os.kill(pid, signal.SIGKILL)


@pytest.mark.timeout(480)  # six runs of one focus deploy (four, and tests/test_custom_run.py's two, 240 s each)
def test_quick_run_custom_run_and_retry(prefect_server, prefect_env, tmp_path):
    api = prefect_server
    marker = tmp_path / "critic-down"
    # per-deployment files; neither names a store: FOCUS_STORAGE__ROOT of the serving process does
    sched_cfg, manual_cfg = tmp_path / "scheduled.toml", tmp_path / "manual.toml"
    sched_cfg.write_text(BASE.format(transitions=6, marker=marker, progress="true", latency=0))
    manual_cfg.write_text(BASE.format(transitions=9, marker=marker, progress="false", latency=0))
    store = tmp_path / "store"
    env = {**prefect_env, "FOCUS_STORAGE__ROOT": str(store), "FOCUS_EXECUTION__KIND": "local"}
    log = tmp_path / "deploy.log"
    args = ["--scheduled-config", str(sched_cfg), "--manual-config", str(manual_cfg), "--cron", "0 3 * * *"]
    since = time.time() - 1
    proc = deploy(env, *args, "--limit", "1", log=log)
    try:
        manual = deployment(api, "manual", proc, log, since)
        scheduled = deployment(api, "scheduled", proc, log, since)
        assert [s["schedule"]["cron"] for s in scheduled["schedules"]] == ["0 3 * * *"]
        # only what the files name is stored: defaults and the store come at run time
        assert manual["parameters"]["config"]["search"]["phases"][1]["transitions"] == 9
        assert scheduled["parameters"]["config"]["search"]["phases"][1]["transitions"] == 6
        assert "storage" not in manual["parameters"]["config"] and "execution" not in manual["parameters"]["config"]

        # Quick run of the scheduled deployment, twice at once: --limit 1 runs them one after the other
        runs = [create_run(api, scheduled["id"]), create_run(api, scheduled["id"])]
        done = [wait_state(api, r["id"], FINAL, proc=proc) for r in runs]
        assert [d["state_type"] for d in done] == ["COMPLETED", "COMPLETED"]
        first, second = sorted(done, key=lambda d: d["start_time"])
        assert second["start_time"] >= first["end_time"], "runs overlapped despite --limit 1"
        ids = []
        for d in done:
            arts = artifacts(api, d["id"])
            stats = {r["statistic"]: r["value"] for r in table(arts["stats"])}
            ids.append(stats["collection_id"])
            # FOCUS_STORAGE__ROOT of the serving process decided where the batch went
            assert stats["batch_url"] == BatchStore(str(store)).url_for(stats["collection_id"], 0)
            assert BatchStore(str(store)).verify(stats["batch_url"])
            assert arts["trees"]["type"] == "markdown"
            svg = base64.b64decode(re.search(r"base64,([A-Za-z0-9+/=]+)", arts["trees"]["data"]).group(1)).decode()
            assert svg.startswith("<svg") and "refined value" in svg and "advantage" in svg
        assert len(set(ids)) == 2 and all(re.fullmatch(r"scheduled-\d{8}-\d{6}-[0-9a-f]{6}", i) for i in ids), ids

        # Custom run of the manual deployment with an edited config: the critic is down
        marker.write_text("down")
        edited = {**manual["parameters"]["config"], "seed": 9}
        run = create_run(api, manual["id"], {"config": edited})
        failed = wait_state(api, run["id"], FINAL, proc=proc)
        assert failed["state_type"] == "FAILED"
        assert f"critic service unavailable (marker {marker} present)" in failed["state"]["message"]
        marker.unlink()
        retry(api, run["id"])  # the Retry button: the same flow run, so the same collection
        done_run = wait_state(api, run["id"], FINAL, proc=proc)
        assert done_run["state_type"] == "COMPLETED" and done_run["run_count"] == 2
        steps = {(s["phase"], s.get("wave")): s["reused"] for s in table(artifacts(api, run["id"])["steps"])}
        # the critic's identity is probed before the first rollout, so its outage failed the
        # run before it spent any: the Retry computes every step (a Retry that reuses
        # finished steps: test_node_loss_is_crashed_quickly_and_retry_resumes)
        assert steps[("evidence", 0)] is False and steps[("evidence.score", 0)] is False
        stats = {r["statistic"]: r["value"] for r in table(artifacts(api, run["id"])["stats"])}
        assert stats["collection_id"].startswith("manual-")
        # the edited seed reached the run: it is in the stored configuration
        assert json.loads(CheckpointStore(str(store)).load(stats["collection_id"], "config", 0))["seed"] == 9

        # the watchdog automation is installed
        autos = httpx.post(f"{api}/automations/filter", json={}, timeout=30).json()
        assert any(a["name"] == "focus: mark silent collections crashed" for a in autos)

        # the critic is up again: a Custom run as the UI's form makes it, served by the same process
        custom_run_keeps_the_workers_store(api, manual, proc, store, tmp_path)
    finally:
        kill_tree(proc)


def custom_run_keeps_the_workers_store(
    api: str, dep: dict[str, Any], proc: subprocess.Popen[bytes], store: Path, folder: Path
) -> None:
    """A Custom run from the Prefect UI of ``dep`` (the manual deployment ``proc`` serves,
    its file naming no store, ``store`` the serving process's ``FOCUS_STORAGE__ROOT``, its
    folder ``folder``): the run changes the field the operator edited and takes the rest
    from the serving process's ``FOCUS_*`` variables, as a Quick run does.

    The run is created the way the UI's form creates it: ``POST
    /api/deployments/{id}/create_flow_run`` with the parameters the form posts for the
    deployment's ``parameter_openapi_schema`` and stored parameters, one field edited
    (:func:`fixtures.ui_form.form_post`, checked against what the real form sent in
    ``tests/test_config_form.py``). (It was tests/test_custom_run.py, with a ``focus
    deploy`` of its own: 5-10 s of a loaded machine to start and register.)"""
    from fixtures.ui_form import form_post

    parameters = form_post(dep["parameter_openapi_schema"], dep["parameters"], {"config.seed": 9})
    sent = parameters["config"]
    assert sent["seed"] == 9 and "storage" not in sent and sent["execution"]["processes"] is None  # switch unset
    run = create_run(api, dep["id"], parameters)
    done = wait_state(api, run["id"], FINAL, proc=proc)
    assert done["state_type"] == "COMPLETED", done["state"].get("message")
    stats = {r["statistic"]: r["value"] for r in table(artifacts(api, run["id"])["stats"])}
    cid = stats["collection_id"]
    # the serving process's FOCUS_STORAGE__ROOT decided where the batch went, not the default ./runs
    assert stats["batch_url"] == BatchStore(str(store)).url_for(cid, 0)
    assert BatchStore(str(store)).verify(stats["batch_url"])
    assert not (folder / "runs").exists()
    stored = json.loads(CheckpointStore(str(store)).load(cid, "config", 0))
    assert stored["seed"] == 9 and stored["env"]["n_tasks"] == 2  # the edit, and the deployment's file

    # the API's (and `prefect deployment run --param config=...`'s) way: a config that
    # leaves out a stored field replaces the stored config whole, Prefect's rule for a
    # parameter; the run's log says which stored fields did not apply, once
    partial = {k: v for k, v in dep["parameters"]["config"].items() if k != "seed"}
    api_run = create_run(api, dep["id"], {"config": partial})
    done = wait_state(api, api_run["id"], FINAL, proc=proc)
    assert done["state_type"] == "COMPLETED", done["state"].get("message")
    notes = _replaced_notes(api, api_run["id"], wait_s=15)
    assert len(notes) == 1 and "not applied from the deployment: seed." in notes[0], notes
    stats = {r["statistic"]: r["value"] for r in table(artifacts(api, api_run["id"])["stats"])}
    assert json.loads(CheckpointStore(str(store)).load(stats["collection_id"], "config", 0))["seed"] == 0
    # the Custom run sent every stored field (the form starts from them): nothing to say
    assert _replaced_notes(api, run["id"]) == []


def _replaced_notes(api: str, run_id: str, wait_s: float = 0) -> list[str]:
    """The run's log lines about stored config fields its own config left out, waited for
    up to ``wait_s`` (logs reach the server in batches: the final state may come first)."""
    deadline = time.monotonic() + wait_s
    while True:
        notes = [x["message"] for x in run_logs(api, run_id) if "not applied from the deployment" in x["message"]]
        if notes or time.monotonic() > deadline:
            return notes
        time.sleep(0.5)


def test_node_loss_is_crashed_quickly_and_retry_resumes(prefect_server, prefect_env, tmp_path):
    """kill -9 of everything (the serving process and the flow run it started): the
    watchdog marks the run Crashed within crash-after + its evaluation period; a new
    ``focus deploy`` picks up the Retry and the run resumes from its checkpoints."""
    api = prefect_server
    store, gate = tmp_path / "store", tmp_path / "gate"
    cfg = gated_config(tmp_path / "manual.toml", 30, store, gate, EVIDENCE_AND_THREE_WAVES, "heartbeat_s = 0.5\n")
    crash_after = 10
    args = ["--config", str(cfg), "--crash-after", str(crash_after)]
    log = tmp_path / "deploy.log"
    since = time.time() - 1
    proc = deploy(prefect_env, *args, log=log)
    second = None
    try:
        manual = deployment(api, "manual", proc, log, since)
        run = create_run(api, manual["id"])
        wait_state(api, run["id"], {"RUNNING"}, proc=proc)
        checkpoints = CheckpointStore(str(store))
        deadline = time.monotonic() + 90
        cid = None
        while cid is None or not any(p == "1.continue.score" for p, _ in checkpoints.list(cid)):
            assert time.monotonic() < deadline, f"no continuation wave finished in time: {read_run(api, run['id'])}"
            ck = store / "checkpoints"
            cid = next((p.name for p in ck.iterdir()), None) if ck.exists() else None
            time.sleep(0.1)
        running = read_run(api, run["id"])
        kill_tree(proc)  # the node is gone: the serving process ...
        kill_run_process(running)  # ... and the flow run it started
        killed_at = time.monotonic()
        assert read_run(api, run["id"])["state_type"] == "RUNNING"  # nobody reported the loss
        before = [k for k in checkpoints.list(cid) if k[0] not in ("config", "critic")]

        # the replacement node's focus deploy starts while the watchdog waits out the
        # silence (its start is 5-10 s of a loaded machine, the wait at least 10 s): with
        # --crash-after 0 it leaves the watchdog the first one installed as it is (the
        # same --crash-after would update it in place mid-wait)
        since = time.time()
        gate.touch()
        second = deploy(prefect_env, "--config", str(cfg), "--crash-after", "0", log=tmp_path / "deploy2.log")

        crashed = wait_state(api, run["id"], {"CRASHED", "COMPLETED", "FAILED"}, timeout=60)
        waited = time.monotonic() - killed_at
        assert crashed["state_type"] == "CRASHED" and "no heartbeat" in crashed["state"]["message"]
        # heartbeats every 0.5 s, crash after 10 s, proactive evaluation every 5 s, plus slack
        print(f"node loss: Crashed {waited:.1f} s after the kill")
        assert waited < crash_after + 5 + 15, waited

        deployment(api, "manual", second, tmp_path / "deploy2.log", since - 1)
        retry(api, run["id"])
        done = wait_state(api, run["id"], FINAL, proc=second)
        assert done["state_type"] == "COMPLETED" and done["run_count"] == 2
        steps = table(artifacts(api, run["id"])["steps"])
        reused = sum(1 for s in steps if s["reused"])
        assert reused >= len(before), (reused, before)  # every step finished before the kill
        stats = {r["statistic"]: r["value"] for r in table(artifacts(api, run["id"])["stats"])}
        assert stats["collection_id"] == cid and stats["transitions"] >= 30
    finally:
        kill_tree(proc)
        if second is not None:
            kill_tree(second)


def run_logs(api: str, run_id: str) -> list[dict[str, Any]]:
    r = httpx.post(
        f"{api}/logs/filter",
        json={"logs": {"flow_run_id": {"any_": [run_id]}}, "sort": "TIMESTAMP_ASC"},
        timeout=30,
    )
    return list(r.json())


#: The model calls of the gated runs' evidence phase (2 tasks x 2 rollouts, 12 calls)
#: and of three continuation waves of 3: answered at once, the next ones wait at the gate.
EVIDENCE_AND_THREE_WAVES = 12 + 3 * 3


def gated_config(
    path: Path, transitions: int, store: Path, gate: Path, free_calls: int = 0, execution: str = ""
) -> Path:
    """A run's config: in-process, its own store, a model that answers ``free_calls``
    calls and then waits until ``gate`` exists (``fixtures.digits.gated_policy``): the
    run is still running when the test acts on it, whatever the machine's speed (with
    50 ms answers, runs of 30 and of 600 transitions ended in about 4 s: under load one
    ended before its Cancel, another before a second run came due)."""
    text = BASE.format(transitions=transitions, marker=path.parent / "never", progress="false", latency=0)
    model = '"fixtures.digits:digit_policy"\noptions = {latency_s = 0}'
    assert model in text
    gated = f'"fixtures.digits:gated_policy"\noptions = {{gate = "{gate}", free_calls = {free_calls}}}'
    path.write_text(
        text.replace(model, gated) + f'[execution]\nkind = "local"\n{execution}[storage]\nroot = "{store}"\n'
    )
    return path


def test_overlap_skip_and_cancel_ends_quietly_and_retry_resumes(prefect_server, prefect_env, tmp_path):
    """One ``focus deploy`` (a start and its registration: 8-12 s of a test at load 7) for
    two checks, one after the other: ``--overlap skip`` on its scheduled deployment, then
    the UI's Cancel of a Custom run of its manual one (:func:`cancel_quietly_and_retry`).

    ``--overlap skip``: the scheduled deployment has a concurrency limit of 1 with
    Prefect's CANCEL_NEW strategy, so a run of it due while another runs is Cancelled at
    once instead of waiting (with a short cron, runs longer than the interval piled up,
    each a new collection). ``--limit 2`` lets the serving process start both; the
    manual deployment keeps no limit."""
    api = prefect_server
    # the first run waits at the gate, so it is still running when the second is due
    # and when that one is checked, whatever the machine's speed (a second run picked up
    # after the first had ended ran)
    gate = tmp_path / "gate"
    cfg = gated_config(tmp_path / "c.toml", 12, tmp_path / "store", gate)
    log = tmp_path / "deploy.log"
    since = time.time() - 1
    args = ["--config", str(cfg), "--cron", "0 3 * * *", "--limit", "2", "--overlap", "skip", "--crash-after", "0"]
    # INFO: the lines an operator reads (the fixture's WARNING would hide the cancel's)
    proc = deploy({**prefect_env, "PREFECT_LOGGING_LEVEL": "INFO"}, *args, log=log)
    scheduled: dict[str, Any] = {}
    try:
        scheduled = deployment(api, "scheduled", proc, log, since)
        manual = deployment(api, "manual", proc, log, since)
        assert scheduled["global_concurrency_limit"]["limit"] == 1
        assert scheduled["concurrency_options"]["collision_strategy"] == "CANCEL_NEW"
        assert manual["global_concurrency_limit"] is None
        first = create_run(api, scheduled["id"])
        wait_state(api, first["id"], {"RUNNING"}, proc=proc)
        second = create_run(api, scheduled["id"])
        skipped = wait_state(api, second["id"], FINAL, timeout=60, proc=proc)
        assert skipped["state_type"] == "CANCELLED", f"{brief(skipped)} {brief(read_run(api, first['id']))}"
        assert "Deployment concurrency limit reached" in skipped["state"]["message"]
        assert read_run(api, first["id"])["state_type"] == "RUNNING"  # it was cancelled while one ran
        gate.touch()
        assert wait_state(api, first["id"], FINAL, proc=proc)["state_type"] == "COMPLETED"

        cancel_quietly_and_retry(api, manual, proc, log, tmp_path / "cancelled")
    finally:
        kill_tree(proc)
        if scheduled:  # other tests of this server register it again without a limit
            httpx.delete(f"{api}/deployments/{scheduled['id']}", timeout=30)


def cancel_quietly_and_retry(
    api: str, manual: dict[str, Any], proc: subprocess.Popen[bytes], log: Path, folder: Path
) -> None:
    """The UI's Cancel of a Custom run of ``manual`` served by ``proc`` (the run set
    Cancelling; the serving process sends its flow run SIGTERM): the run's log says it was
    cancelled at INFO - it ended with ``[ERROR] Finished in state Running()`` - the serving
    console ``log`` shows no traceback (it showed asyncio's 50-line TerminationSignal
    one), the lease is released, and a Retry resumes after the last finished step
    (flows/cancel.py). The run's config: its own store and gate, under ``folder``."""
    import tomllib

    from flows.cancel import CANCELLED, ENDED

    folder.mkdir()
    store, gate = folder / "store", folder / "gate"
    cfg = gated_config(folder / "manual.toml", 30, store, gate, EVIDENCE_AND_THREE_WAVES)
    run = create_run(api, manual["id"], {"config": tomllib.loads(cfg.read_text(encoding="utf-8"))})
    wait_state(api, run["id"], {"RUNNING"}, proc=proc)
    cid = held_mid_collection(store, api, run["id"])  # held at the gate: cancelled mid-run
    checkpoints = CheckpointStore(str(store))
    r = httpx.post(
        f"{api}/flow_runs/{run['id']}/set_state",
        json={"state": {"type": "CANCELLING", "name": "Cancelling"}},
        timeout=30,
    )
    assert r.status_code in (200, 201) and r.json()["status"] == "ACCEPT", r.text
    cancelled = wait_state(api, run["id"], FINAL, timeout=60, proc=proc)
    assert cancelled["state_type"] == "CANCELLED", cancelled["state"]
    deadline = time.monotonic() + 20  # the run's last lines reach the API as its process exits
    while ENDED not in (messages := [x["message"] for x in run_logs(api, run["id"])]):
        assert time.monotonic() < deadline, messages
        time.sleep(0.3)
    assert CANCELLED in messages and not any("Finished in state Running" in m for m in messages), messages
    errors = [x["message"] for x in run_logs(api, run["id"]) if x["level"] >= 40]
    assert errors == [], errors
    console = log.read_text(encoding="utf-8")
    assert "Traceback" not in console and "TerminationSignal" not in console and "ERROR" not in console, console
    assert not (store / "leases" / f"{cid}.json").exists(), "the cancelled run kept its lease"

    before = [k for k in checkpoints.list(cid) if k[0] not in ("config", "critic")]
    gate.touch()
    retry(api, run["id"])
    done = wait_state(api, run["id"], FINAL, proc=proc)
    assert done["state_type"] == "COMPLETED" and done["run_count"] == 2
    reused = sum(1 for s in table(artifacts(api, run["id"])["steps"]) if s["reused"])
    assert reused >= len(before) > 0, (reused, before)
    stats = {r["statistic"]: r["value"] for r in table(artifacts(api, run["id"])["stats"])}
    assert stats["collection_id"] == cid and stats["transitions"] >= 30


def held_mid_collection(store: Path, api: str, run_id: str) -> str:
    """The collection id of the run writing ``store`` once a continuation wave is saved
    (the run then waits at its gate: still in progress when the test acts on it)."""
    checkpoints, deadline, cid = CheckpointStore(str(store)), time.monotonic() + 90, None
    while cid is None or not any(p == "1.continue.score" for p, _ in checkpoints.list(cid)):
        assert time.monotonic() < deadline, f"no continuation wave finished in time: {read_run(api, run_id)}"
        ck = store / "checkpoints"
        cid = next((p.name for p in ck.iterdir()), None) if ck.exists() else None
        time.sleep(0.1)
    assert read_run(api, run_id)["state_type"] == "RUNNING"
    return cid
