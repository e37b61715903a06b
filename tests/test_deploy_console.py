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
  deployments are paused, which they are.
- A second ``focus deploy`` of the same deployments says another process serves them.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from fixtures.prefect import QUIET_SERVICES, base_env, free_port, from_template, kill_tree
from test_deploy import create_run, deploy, deployment, wait_state

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


def interrupt(proc: subprocess.Popen[bytes]) -> int:
    """Ctrl-C in the terminal: SIGINT to the command's process group."""
    import os

    os.killpg(proc.pid, signal.SIGINT)
    try:
        return proc.wait(timeout=30)
    finally:
        kill_tree(proc)


def test_a_run_leaves_the_console_quiet_and_ctrl_c_ends_in_one_line(prefect_server, prefect_env, tmp_path):
    api = prefect_server
    cfg = tmp_path / "collect.toml"
    cfg.write_text(CONFIG, encoding="utf-8")
    log = tmp_path / "deploy.log"
    since = time.time() - 1
    proc = deploy(operator_env(prefect_env, tmp_path), "-c", str(cfg), "--crash-after", "0", log=log)
    try:
        manual = deployment(api, "manual", proc, log, since)
        time.sleep(1.0)  # registered: serving
        run = create_run(api, manual["id"])
        wait_state(api, run["id"], {"COMPLETED"}, timeout=90, proc=proc)
        # the run's process exits (its events sent): a Ctrl-C while it still drains them got
        # Prefect's "EventsWorker - Still processing items" WARNING on the console (quieted
        # since: flows.cancel.quiet_services) and, at its exit, a KeyboardInterrupt traceback
        # from Prefect's atexit drain (not yet)
        time.sleep(3.0)
        code = interrupt(proc)
    finally:
        kill_tree(proc)
    lines = lines_of(log)
    assert not [ln for ln in lines if "Task run" in ln or "Flow run" in ln], lines
    assert lines[0].startswith("serving collect/scheduled and collect/manual; runs, their logs and the Run button"), (
        lines
    )
    assert "Ctrl-C stops" in lines[0], lines
    assert len(lines) == 2, "\n".join(lines)  # nothing per task or flow run, no banner
    assert lines[1].startswith("stopped (SIGINT): collect/scheduled and collect/manual paused on the server"), lines
    assert code == 0, lines
    paused = httpx.get(f"{api}/deployments/name/collect/scheduled", timeout=30).json()["paused"]
    assert paused is True  # as the line says
    # the run's log in the UI keeps every task run's line
    body = {"logs": {"flow_run_id": {"any_": [run["id"]]}}, "limit": 200}
    messages = [x["message"] for x in httpx.post(f"{api}/logs/filter", json=body, timeout=30).json()]
    assert sum("Finished in state Completed()" in m for m in messages) >= 5, messages


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_end_in_one_line_too(sig, prefect_server, prefect_env, tmp_path):
    """A service manager's stop (systemd, docker stop): it ended without a word, exit 0.
    A SIGHUP (the terminal closed, an ssh session dropped) killed it where it stood: no
    line, exit -1, the deployments left unpaused; the line is in the log file too (the
    terminal that would show it is gone)."""
    cfg = tmp_path / "collect.toml"
    cfg.write_text(CONFIG, encoding="utf-8")
    log = tmp_path / "deploy.log"
    since = time.time() - 1
    hup = signal.signal(signal.SIGHUP, signal.SIG_DFL)  # as a terminal's shell starts it (pytest may run under nohup)
    try:
        proc = deploy(operator_env(prefect_env, tmp_path), "-c", str(cfg), "--crash-after", "0", log=log)
    finally:
        signal.signal(signal.SIGHUP, hup)
    try:
        deployment(prefect_server, "manual", proc, log, since)
        wait_for_line(log, "serving collect/scheduled", proc)
        proc.send_signal(sig)  # at once: the runner may still be starting (Prefect's handler then exited 0, silently)
        code = proc.wait(timeout=30)
    finally:
        kill_tree(proc)
    lines = lines_of(log)
    stopped = f"stopped ({sig.name}): collect/scheduled and collect/manual paused"
    assert code == 0 and len(lines) == 2 and lines[1].startswith(stopped), (code, lines)
    log_file = Path(lines[1].rpartition("; log: ")[2])
    assert stopped in log_file.read_text(encoding="utf-8")
    for name in ("scheduled", "manual"):
        assert httpx.get(f"{prefect_server}/deployments/name/collect/{name}", timeout=30).json()["paused"] is True


def test_a_second_focus_deploy_of_the_same_deployments_says_another_serves_them(prefect_server, prefect_env, tmp_path):
    cfg = tmp_path / "collect.toml"
    cfg.write_text(CONFIG, encoding="utf-8")
    env = operator_env(prefect_env, tmp_path)
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    since = time.time() - 1
    first = deploy(env, "-c", str(cfg), "--crash-after", "0", log=first_log)
    second = None
    try:
        deployment(prefect_server, "manual", first, first_log, since)
        time.sleep(2.0)  # it asked for runs (every second here)
        since = time.time()
        second = deploy(env, "-c", str(cfg), "--crash-after", "0", log=second_log)
        deployment(prefect_server, "manual", second, second_log, since)
    finally:
        for proc in (first, second):
            if proc is not None:
                interrupt(proc)
    warnings = [ln for ln in lines_of(second_log) if ln.startswith("warning: ")]
    assert [w.split(" is served")[0] for w in warnings] == [
        "warning: deployment collect/scheduled",
        "warning: deployment collect/manual",
    ], lines_of(second_log)
    assert "stopping either pauses the deployment for both" in warnings[0]
    assert not any(ln.startswith("warning: ") for ln in lines_of(first_log)), lines_of(first_log)


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
    log = tmp_path / "deploy.log"
    proc = deploy(env, "-c", str(cfg), "--crash-after", "0", log=log)
    try:
        wait_for_line(log, "serving collect/scheduled", proc, timeout=60)
        kill_tree(server, signal.SIGTERM)
        wait_for_line(log, "stopped answering", proc)
        time.sleep(3.0)  # gone a while: the runner's polls fail meanwhile
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
