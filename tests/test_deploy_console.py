"""What an operator of a long-running ``focus deploy`` reads on its console, against real
Prefect servers (the session's, and one of the test's own that it restarts).

- One start line saying what it serves and where the UI is (Prefect's banner table
  named no configuration and spread over a dozen lines).
- Quiet while runs go well: Prefect printed an INFO line per task run (``Task run
  'wave-1-3' - Finished in state Completed()``, a dozen a collection); they stay in the
  run's log in the UI.
- A Prefect server restart is one line when it goes and one when it is back; it was
  the runner's WARNING with a websocket traceback, and nothing said it was back.
- Ctrl-C ends with one line (three INFO lines of Prefect's before), saying the
  deployments are paused, which they are, and the runs in progress cancelled, which they
  are (the flow-run processes no longer get the terminal's Ctrl-C: a traceback, Crashed runs).
- A second ``focus deploy`` of the same deployments says another process serves them.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import httpx
import pytest
from fixtures.prefect import QUIET_SERVICES, base_env, free_port, from_template, kill_tree
from test_deploy import (
    EVIDENCE_AND_THREE_WAVES,
    artifacts,
    create_run,
    deploy,
    deployment,
    gated_config,
    held_mid_collection,
    kill_run_process,
    read_run,
    retry,
    run_logs,
    table,
    wait_state,
)

from storage import CheckpointStore

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

CONFIG = """
seed = 3
progress = false
[model]
kind = "factory"
factory = "fixtures.digits:digit_policy"
[env]
n_tasks = 2
"""


def operator_env(env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """``env`` as an operator's shell has it: Prefect's default logging level (INFO; the
    tests' WARNING hid the lines at issue), the log file under the test's folder."""
    out = {k: v for k, v in env.items() if k != "PREFECT_LOGGING_LEVEL"}
    return {**out, "XDG_STATE_HOME": str(tmp_path / "state")}


def lines_of(log: Path) -> list[str]:
    """The console's lines, less the warnings that another test's deployment of the same
    names left on the shared Prefect server (its config differs from this test's): they
    are the edit warning of tests/test_deploy_edits.py, true here and order-dependent."""
    text = log.read_text(encoding="utf-8").splitlines()
    return [ln for ln in text if ln.strip() and "the server's config differs from the one served now" not in ln]


def wait_for_line(log: Path, text: str, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not any(text in ln for ln in lines_of(log)):
        assert proc.poll() is None, lines_of(log)
        assert time.monotonic() < deadline, f"no line with {text!r}: {lines_of(log)}"
        time.sleep(0.2)


def interrupt(proc: subprocess.Popen[bytes], timeout: float = 30) -> int:
    """Ctrl-C in the terminal: SIGINT to the command's process group."""
    import os

    os.killpg(proc.pid, signal.SIGINT)
    try:
        return proc.wait(timeout=timeout)
    finally:
        kill_tree(proc)


def gated_run_config(tmp_path: Path) -> tuple[dict[str, Any], Path, Path]:
    """A Custom run's ``config`` (tests/test_deploy.py's gated run: its own store, a model
    that answers the evidence and three waves, then waits until ``gate`` exists), the
    store and the gate."""
    store, gate = tmp_path / "store", tmp_path / "gate"
    path = gated_config(tmp_path / "gated.toml", 30, store, gate, EVIDENCE_AND_THREE_WAVES)
    return tomllib.loads(path.read_text(encoding="utf-8")), store, gate


@pytest.mark.timeout(400)  # three focus deploy starts, two runs, a Retry: 25-130 s measured under load for two starts
def test_a_run_leaves_the_console_quiet_and_ctrl_c_sigterm_and_sighup_end_in_one_line(
    prefect_server, prefect_env, tmp_path
):
    """Two runs served at once (``--limit 2``): one completes, the Ctrl-C comes at once -
    its process may still be sending its last events - while the other is held mid-collection.
    The flow-run processes were in the terminal's process group: the Ctrl-C reached them,
    the first printed a ``KeyboardInterrupt`` traceback from Prefect's atexit drain, the
    second ended ``Crashed`` with two ERROR lines on the console. Now only ``focus deploy``
    gets it and cancels the run in progress: one line, the run ``Cancelled``, its lease
    released, and a Retry (served by the next ``focus deploy``) resumes it after its
    finished steps (deployments/stopping.py).

    That next ``focus deploy`` is then the first of two: a second ``focus deploy`` of the
    same deployments warns that another process serves them. Then the stops of a service
    manager (systemd, docker stop: SIGTERM) and of a closed terminal or dropped ssh session
    (SIGHUP): the first ended without a word, exit 0; the second killed it where it stood:
    no line, exit -1, the deployments left unpaused. Each is one line now, the deployments
    paused. The second process gets its SIGTERM as soon as it serves (the runner may still
    be starting: Prefect's handler then exited 0, silently); the first its SIGHUP. (The
    Retry's ``focus deploy`` is the pair's first: the pair was a test of its own, two
    starts of 6-25 s; a Ctrl-C of a ``focus deploy`` with no run in progress is the
    server-restart test's end.)"""
    from deployments.stopping import CANCELLED

    api = prefect_server
    cfg = tmp_path / "collect.toml"
    cfg.write_text(CONFIG, encoding="utf-8")
    gated, store, gate = gated_run_config(tmp_path)
    log = tmp_path / "deploy.log"
    env = operator_env(prefect_env, tmp_path)
    since = time.time() - 1
    proc = deploy(env, "-c", str(cfg), "--crash-after", "0", "--limit", "2", log=log)
    held: dict[str, Any] = {}
    try:
        manual = deployment(api, "manual", proc, log, since)
        # both at once (their processes' starts overlap): the held run waits at its gate
        # until after the Ctrl-C, whenever the other one completes
        held = create_run(api, manual["id"], {"config": gated})
        run = create_run(api, manual["id"])
        wait_state(api, held["id"], {"RUNNING"}, proc=proc)
        wait_state(api, run["id"], {"COMPLETED"}, timeout=90, proc=proc)
        cid = held_mid_collection(store, api, held["id"])
        # at once: the run's process may still send its last events. The stop waits for the
        # held run to stop (4 s measured at load 6.6 on 2 cores; over 30 s once at load 10)
        code = interrupt(proc, timeout=90)
    finally:
        kill_tree(proc)
        if held:  # its process runs in a session of its own: not in focus deploy's tree
            kill_run_process(held)
    lines = lines_of(log)
    assert not [ln for ln in lines if "Task run" in ln or "Flow run" in ln], lines
    assert lines[0].startswith("serving collect/scheduled and collect/manual; runs, their logs and the Run button"), (
        lines
    )
    assert "Ctrl-C stops" in lines[0], lines
    assert len(lines) == 2, "\n".join(lines)  # nothing per task or flow run, no banner, no traceback
    name = read_run(api, held["id"])["name"]
    assert lines[1].startswith(
        f"stopped (SIGINT): flow run '{name}' cancelled (finished steps saved: a Retry in the UI resumes it after "
        "its last finished step); collect/scheduled and collect/manual paused on the server"
    ), lines
    assert code == 0, lines
    paused = httpx.get(f"{api}/deployments/name/collect/scheduled", timeout=30).json()["paused"]
    assert paused is True  # as the line says
    # the run's log in the UI keeps every task run's line
    body = {"logs": {"flow_run_id": {"any_": [run["id"]]}}, "limit": 200}
    messages = [x["message"] for x in httpx.post(f"{api}/logs/filter", json=body, timeout=30).json()]
    assert sum("Finished in state Completed()" in m for m in messages) >= 5, messages
    # the run in progress: Cancelled, saying why, no ERROR in its log, its lease released
    cancelled = read_run(api, held["id"])
    assert cancelled["state_type"] == "CANCELLED", cancelled["state"]
    assert cancelled["state"]["message"] == CANCELLED.format(by="SIGINT")
    assert [x["message"] for x in run_logs(api, held["id"]) if x["level"] >= 40] == []
    assert not (store / "leases" / f"{cid}.json").exists(), "the cancelled run kept its lease"
    before = [k for k in CheckpointStore(str(store)).list(cid) if k[0] not in ("config", "critic")]

    # the next focus deploy serves the Retry, which resumes after the finished steps
    gate.touch()
    log = tmp_path / "again.log"
    hup = signal.signal(signal.SIGHUP, signal.SIG_DFL)  # as a terminal's shell starts it (pytest may run under nohup)
    try:
        proc = deploy(env, "-c", str(cfg), "--crash-after", "0", log=log)
    finally:
        signal.signal(signal.SIGHUP, hup)
    second = None
    try:
        deployment(api, "manual", proc, log, time.time() - 1)
        retry(api, held["id"])
        done = wait_state(api, held["id"], {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}, proc=proc)
        second, second_lines, first_lines = second_deploy_and_stops(api, env, cfg, proc, log, tmp_path)
    finally:
        for p in (proc, second):
            if p is not None:
                kill_tree(p)
    assert done["state_type"] == "COMPLETED" and done["run_count"] == 2, done["state"]
    reused = sum(1 for s in table(artifacts(api, held["id"])["steps"]) if s["reused"])
    assert reused >= len(before) > 0, (reused, before)
    stats = {r["statistic"]: r["value"] for r in table(artifacts(api, held["id"])["stats"])}
    assert stats["collection_id"] == cid and stats["transitions"] >= 30
    assert len(lines_of(log)) == 2 and lines_of(log)[1].startswith("stopped (SIGHUP): collect/"), lines_of(log)
    warnings = [ln for ln in second_lines if ln.startswith("warning: ")]
    assert [w.split(" is served")[0] for w in warnings] == [
        "warning: deployment collect/scheduled",
        "warning: deployment collect/manual",
    ], second_lines
    assert "stopping either pauses the deployment for both" in warnings[0]
    assert len(second_lines) == 4, second_lines  # serving, the two warnings, stopped
    assert len(first_lines) == 2 and not any(ln.startswith("warning: ") for ln in first_lines), first_lines
    for name in ("scheduled", "manual"):
        assert httpx.get(f"{api}/deployments/name/collect/{name}", timeout=30).json()["paused"] is True


def second_deploy_and_stops(
    api: str, env: dict[str, str], cfg: Path, first: subprocess.Popen[bytes], first_log: Path, tmp_path: Path
) -> tuple[subprocess.Popen[bytes], list[str], list[str]]:
    """A second ``focus deploy`` beside ``first``, which serves; SIGTERM to the second as
    soon as it serves, then SIGHUP to the first: (the second, its lines, the first's)."""
    # serving, and it asked for runs (every second here): waited for, not slept for 2 s,
    # as the deployments' "updated" of the test before's stop, within the last second,
    # could pass for the first one's registration (the second then started before the
    # first asked, and said nothing: the test failed whenever it followed the SIGHUP one)
    wait_for_line(first_log, "serving collect/scheduled", first)
    polled_after(api, time.time(), first)
    since = time.time()
    second_log = tmp_path / "second.log"
    second = deploy(env, "-c", str(cfg), "--crash-after", "0", log=second_log)
    try:
        deployment(api, "manual", second, second_log, since)
        wait_for_line(second_log, "serving collect/scheduled", second)
        second_lines = stopped_by(second, signal.SIGTERM, second_log)
        first_lines = stopped_by(first, signal.SIGHUP, first_log)
    except BaseException:
        kill_tree(second)
        raise
    return second, second_lines, first_lines


def stopped_by(proc: subprocess.Popen[bytes], sig: signal.Signals, log: Path) -> list[str]:
    """Send ``sig`` to ``focus deploy``; its console's lines once it ended, which was with
    exit 0 and a last line saying the deployments are paused, which the log file has too
    (a SIGHUP's terminal, which would show it, is gone)."""
    proc.send_signal(sig)
    code = proc.wait(timeout=30)
    lines = lines_of(log)
    stopped = f"stopped ({sig.name}): collect/scheduled and collect/manual paused"
    assert code == 0 and lines[-1].startswith(stopped), (code, lines)
    log_file = Path(lines[-1].rpartition("; log: ")[2])
    assert stopped in log_file.read_text(encoding="utf-8")
    return lines


def polled_after(api: str, t: float, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    """Until both deployments are unpaused and a runner asked for their runs after ``t``."""
    from datetime import datetime

    deadline = time.monotonic() + timeout
    while True:
        ds = [httpx.get(f"{api}/deployments/name/collect/{n}", timeout=30).json() for n in ("scheduled", "manual")]
        if all(not d["paused"] and d["last_polled"] and datetime.fromisoformat(d["last_polled"]).timestamp() > t
               for d in ds):  # fmt: skip
            return
        assert proc.poll() is None and time.monotonic() < deadline, ds
        time.sleep(0.2)


def start_server(home: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env={**base_env(home), **QUIET_SERVICES},
        stdout=open(log, "ab"),  # noqa: SIM115 - the child keeps it
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, log.read_text(encoding="utf-8")[-2000:]
        try:
            if httpx.get(f"http://127.0.0.1:{port}/api/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "the test's Prefect server did not start"
        time.sleep(0.2)


@pytest.mark.timeout(
    300
)  # a focus deploy start, two server starts: 180 s ran out at load 15 (63 s the session's server)
def test_a_prefect_server_restart_is_one_line_when_it_goes_and_one_when_it_is_back(
    prefect_server, prefect_template, tmp_path
):
    home = from_template(prefect_template, tmp_path / "server_home")
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    server = start_server(home, port, tmp_path / "server.log")
    cfg = tmp_path / "collect.toml"
    cfg.write_text(CONFIG, encoding="utf-8")
    env = {**base_env(tmp_path / "client"), "PREFECT_API_URL": api, "XDG_STATE_HOME": str(tmp_path / "state")}
    env.pop("PREFECT_LOGGING_LEVEL")
    # a poll for scheduled runs every second: more than 3 fail while the server is gone.
    # Prefect's runner gave up after 3 in a row (a traceback, focus deploy exited 1), which
    # its default 10 s polls reached only when a restart took over 20-30 s (twice at load 8-10)
    env["PREFECT_RUNNER_POLL_FREQUENCY"] = "1"
    log = tmp_path / "deploy.log"
    proc = deploy(env, "-c", str(cfg), "--crash-after", "0", log=log)
    try:
        wait_for_line(log, "serving collect/scheduled", proc, timeout=60)
        kill_tree(server, signal.SIGTERM)
        wait_for_line(log, "stopped answering", proc)
        time.sleep(4.0)  # gone a while: the runner's polls fail meanwhile (4 or more of them)
        server = start_server(home, port, tmp_path / "server.log")
        wait_for_line(log, "answers again", proc)
        interrupt(proc)
    finally:
        kill_tree(proc)
        kill_tree(server)
    lines = lines_of(log)
    assert not any("Traceback" in ln or ln.startswith(" ") for ln in lines), lines
    assert lines[1].startswith(f"the Prefect server at {api} stopped answering ("), lines
    assert lines[2] == f"the Prefect server at {api} answers again: serving as before", lines
    assert len(lines) == 4 and lines[3].startswith("stopped (SIGINT)"), lines
