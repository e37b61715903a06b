"""A model server killed and restarted mid-collection costs a wait, not a rerun.

Real parts: the embedded tiny model server, killed with SIGKILL in the middle of a
collection driven through the pipeline's one loop and started again on the same port
(:class:`focus.testing.faults.ServerRestart`). Within ``model.http.outage_wait_s`` the
collection waits and ends with the batch of an uninterrupted run, bit for bit; past
it, the wave fails as a model-service outage, nothing of it is stored, and a rerun
once the server is back completes the same batch. The server is down a few seconds
here (past the ordinary retries, which the config makes short, so the same waiting
code runs as for a real restart); ``python -m benchmarks.restart`` measures 30 s and
90 s outages with the default retry settings.
"""

from __future__ import annotations

import contextlib
import logging
import time

import pytest
from fixtures._procs import server_of
from fixtures.journal import run_collect

from focus.backends import LocalModelServer
from focus.execution import ModelServiceOutage
from focus.testing.faults import ServerRestart, served_requests
from storage import BatchStore, CheckpointStore
from tasks.config import load_config

pytestmark = [pytest.mark.timeout(300), pytest.mark.integration]

#: How long the server is down: past the ordinary retries (spent within a fraction of a
#: second), so the calls wait at the outage gate, whose probes (one a second) find the
#: server back within a second of its return. It was 3 s: 1.5 s more per restart,
#: checking nothing more.
DOWN_S = 1.5

#: Ordinary retries spent within a fraction of a second: a restart is past them.
HTTP = {"max_retries": 2, "backoff_s": 0.01, "backoff_max_s": 0.2, "timeout_s": 20.0, "connect_timeout_s": 2.0}


def config(root: str, cid: str, url: str, outage_wait_s: float, deadline_s: float = 600.0):  # type: ignore[no-untyped-def]
    return load_config(
        overrides={
            "collection_id": cid,
            "seed": 11,
            "model.kind": "openai",
            "model.url": url,
            "model.http": {**HTTP, "outage_wait_s": outage_wait_s, "deadline_s": deadline_s},
            "env.n_tasks": 4,
            "agent.sampling.max_tokens": 8,
            "search.phases": [
                {"name": "evidence", "rollouts_per_task": 2},
                {"name": "continue", "transitions": 60, "wave_size": 6, "max_depth": 6},
            ],
            "execution.kind": "local",
            "execution.max_concurrency": 8,
            "storage.root": root,
            "progress": False,
        },
        environ={},
    )


def rows(root: str, url: str):  # type: ignore[no-untyped-def]
    batch = BatchStore(root).read(url)
    actor = [
        (r.tree_id, r.edge_id, r.turn_index, r.prompt_ids, r.completion_ids, r.logprobs, r.advantage)
        for r in batch.actor
    ]
    return batch.stats, actor, [(r.tree_id, r.node_id, r.context_ids, r.target, r.weight) for r in batch.critic]


@pytest.fixture(scope="module")
def clean(tmp_path_factory):  # type: ignore[no-untyped-def]
    """The uninterrupted collection the tests compare with, run once for the module on a
    server of its own, and the model calls it took (the tests kill their server half way
    through the same collection): each test ran it again, before its own. The same config
    (the outage wait and deadline change no batch) and model give the same batch, bit
    for bit, on any server process: what the tests check across a restart."""
    root = str(tmp_path_factory.mktemp("clean") / "store")
    s = LocalModelServer().start()
    try:
        before = served_requests(s.url)
        result = run_collect(config(root, "clean", s.url, 60.0))
        return root, result["batch_url"], served_requests(s.url) - before
    finally:
        s.stop()


@pytest.fixture
def server():  # type: ignore[no-untyped-def]
    """A server of this test's own: it is killed."""
    s = LocalModelServer().start()
    try:
        yield s
    finally:
        s.stop()


def test_a_server_restart_mid_collection_is_waited_out_and_the_batch_is_unchanged(server, clean, tmp_path, caplog):
    root = str(tmp_path / "store")
    clean_root, clean_url, calls = clean
    assert calls > 40
    before = served_requests(server.url)

    with caplog.at_level(logging.WARNING, logger="focus.backends.outage"):
        with ServerRestart(server, after_requests=before + calls // 2, down_s=DOWN_S) as restart:
            restarted = run_collect(config(root, "restarted", server.url, 60.0))
    assert restart.killed_at is not None and restart.down_for_s is not None and restart.down_for_s >= DOWN_S
    assert restart.requests_at_kill < before + calls  # killed mid-collection
    stats, actor, critic = rows(root, restarted["batch_url"])
    want_stats, want_actor, want_critic = rows(clean_root, clean_url)
    assert stats["failed_rollouts"] == 0 and len(actor) > 0
    assert (actor, critic) == (want_actor, want_critic)  # bit for bit: log-probs, advantages, targets
    assert stats["rollouts"] == want_stats["rollouts"]
    waits = [r.getMessage() for r in caplog.records if "has not answered for" in r.getMessage()]
    backs = [r.getMessage() for r in caplog.records if "answers again" in r.getMessage()]
    assert len(waits) == 1 and "up to 60 s" in waits[0] and len(backs) == 1


def test_past_the_window_the_wave_fails_and_a_rerun_completes_the_same_batch(server, clean, tmp_path):
    root = str(tmp_path / "store")
    clean_root, clean_url, calls = clean
    before = served_requests(server.url)

    cfg = config(root, "outage", server.url, 1.0)
    with ServerRestart(server, after_requests=before + calls // 2, down_s=None) as restart:
        with pytest.raises(ModelServiceOutage, match=r"model service outage.*waited for it up to outage_wait_s = 1 s"):
            run_collect(cfg)
        restart.restart()
    assert ("config", 0) in CheckpointStore(root).list("outage")
    again = run_collect(cfg)
    got, want = rows(root, again["batch_url"]), rows(clean_root, clean_url)
    assert got[0]["failed_rollouts"] == 0 and got[1:] == want[1:]


def test_the_embedded_server_a_command_started_is_started_again_when_killed(tmp_path):
    """The embedded model server belongs to the command: killed mid-run (kill -9, the OOM
    killer), nobody else could start it again on its port, and the collection waited
    the whole outage wait (300 s) before its wave failed. The command's services start
    it again on the same port with the same weights; stopped by them, it stays down."""
    import os
    import signal
    import time

    import httpx

    from flows.services import Services

    cfg = load_config(overrides={"storage.root": str(tmp_path), "progress": False}, environ={})
    services = Services(cfg)
    ready = services.__enter__()
    try:
        server, url = services.model_server, ready.model.url
        assert server is not None and url is not None
        first, version = server.pid, ready.model.policy_version
        os.kill(first, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while True:
            try:
                if server.pid != first and httpx.get(f"{url}/health", timeout=2, trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the killed server was not started again within 20 s"
            time.sleep(0.05)
        assert server.restarts == 1 and server.policy_version == version
        again = server.pid
    finally:
        services.stop()
    time.sleep(1.0)  # a keeper that started it once more would have by now
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{url}/health", timeout=2, trust_env=False)
    with pytest.raises(ProcessLookupError):
        os.kill(again, 0)


def test_a_hung_embedded_server_is_killed_and_started_again_and_the_batch_is_unchanged(clean, tmp_path, caplog):
    """An embedded server alive but not answering (SIGSTOP here; a wedged process) was
    not started again: its keeper waited for the process to exit, and the calls waited
    out their deadline (600 s). Its keeper now asks ``/health`` and, after ``hang_s``
    without an answer, kills it and starts it again as a dead one; the seeded requests
    in flight are sent again and the batch is an uninterrupted run's, bit for bit."""
    import os
    import signal
    import threading

    server = LocalModelServer().start()
    stopped: list[int] = []
    try:
        server.keep_alive(hang_s=2.0)
        root = str(tmp_path / "store")
        clean_root, clean_url, calls = clean
        before = served_requests(server.url)

        def stop_mid_run() -> None:
            while served_requests(server.url) < before + calls // 2:
                time.sleep(0.02)
            assert server.pid is not None
            stopped.append(server.pid)
            os.kill(server.pid, signal.SIGSTOP)

        stopper = threading.Thread(target=stop_mid_run, daemon=True)
        stopper.start()
        t0 = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="focus.backends.local"):
            hung = run_collect(config(root, "hung", server.url, 60.0, deadline_s=90.0))
        took = time.monotonic() - t0
        stopper.join(timeout=5)
        assert stopped and server.restarts == 1 and server.pid != stopped[0]
        assert rows(root, hung["batch_url"])[1:] == rows(clean_root, clean_url)[1:]
        assert rows(root, hung["batch_url"])[0]["failed_rollouts"] == 0
        lines = [r.getMessage() for r in caplog.records if "embedded model server" in r.getMessage()]
        assert len(lines) == 1 and f"(pid {stopped[0]}) hung (killed: alive, but /health unanswered for" in lines[0]
        assert took < 60, took  # the hang costs hang_s and a restart, not a call's deadline
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        server.stop()


def _until(predicate, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + 60
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_a_restart_counts_against_the_keepers_budget_only_within_its_window(caplog):
    """The keeper's budget (``restarts``) is of the last ``window_s`` seconds, not of the
    server's life: a long ``focus train`` loop spent it on crashes hours apart, and here
    (``restarts`` = 1) the second death, past the window, was the end. Within the window
    the budget still stops a server that cannot stay up. The window is 2 s here
    (``RESTART_WINDOW_S``: 600 s)."""
    import os
    import signal

    server = LocalModelServer().start()
    try:
        with caplog.at_level(logging.WARNING, logger="focus.backends.local"):
            server.keep_alive(restarts=1, window_s=2.0)
            first = server.pid
            assert first is not None
            os.kill(first, signal.SIGKILL)
            _until(lambda: server.restarts == 1 and server.pid != first, "the killed server was not started again")
            restarted, second = time.monotonic(), server.pid
            assert second is not None
            while time.monotonic() - restarted < 2.0:  # the first restart no longer counts
                time.sleep(0.05)
            os.kill(second, signal.SIGKILL)
            _until(lambda: server.restarts == 2 and server.pid != second, "the server was not started again")
            third = server.pid
            assert third is not None
            os.kill(third, signal.SIGKILL)  # within 2 s of the second restart: the budget of 1 is spent
            _until(lambda: len(caplog.records) >= 3, "no line for the third death")
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 3 and server.restarts == 2, lines
        assert all("(restart 1 of 1, exits and hangs counted together, in any 2 s)" in line for line in lines[:2])
        assert lines[2].startswith(f"the embedded model server (pid {third}) exited (killed by SIGKILL) again; ")
        assert (
            "started again 1 time(s) (1 after it exited, 0 after it hung: restarts = 1 counts both) in the last "
            in (lines[2])
        )
    finally:
        server.stop()


def test_weights_published_while_the_embedded_server_restarts_are_loaded_when_it_is_back(tmp_path):
    """A train loop publishes each new version into its embedded server. Killed just
    before (here: just killed, its keeper starting it again), the load met a refused
    connection and `focus train` stopped with `ConnectError: [Errno 111] Connection
    refused`. The load now waits for the server its keeper starts again, and a server
    started again after it serves the new weights."""
    import os
    import signal

    torch = pytest.importorskip("torch")
    from focus.tinylm.arch import DEFAULT_WEIGHTS, weights_version

    saved = torch.load(DEFAULT_WEIGHTS, weights_only=False)
    saved["state_dict"]["embed.weight"] = saved["state_dict"]["embed.weight"] * 1.01
    other = tmp_path / "other.pt"
    torch.save(saved, other)
    server = LocalModelServer().start()
    try:
        server.keep_alive()
        first = server.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        assert server.reload(other) == weights_version(other) == server.policy_version
        assert server.restarts == 1 and server.pid != first
        os.kill(server.pid, signal.SIGKILL)  # started again now: with the weights last loaded
        deadline = time.monotonic() + 30
        while server.restarts < 2 or not server._answers(1.0):
            assert time.monotonic() < deadline, "not started again within 30 s"
            time.sleep(0.05)
        assert server.policy_version == weights_version(other)
    finally:
        server.stop()


def test_a_command_whose_embedded_server_is_gone_for_good_stops_at_once_with_one_line(tmp_path):
    """Killed once more than its keeper starts it again (3 times), the embedded server
    stayed down and `focus collect` waited the whole `model.http.outage_wait_s` (300 s:
    the probe measured 314 s) before its wave failed as an outage. The keeper's last word
    now stops the run as a signal does: exit 1 at once, its line last, nothing half-made
    kept."""
    import os
    import signal
    import subprocess
    import sys

    from fixtures.prefect import base_env

    root = tmp_path / "store"
    args = ["collect", "--store", str(root), "--tasks", "12", "--transitions", "100000", "--collection-id", "gone"]
    args += ["--set", "model.http.outage_wait_s=900"]  # a wait this long cannot end within the test
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli", *args], cwd=tmp_path, env=base_env(tmp_path / "prefect"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    killed: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while len(killed) < 4:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
            pid = server_of(proc.pid)
            if pid is not None and pid not in killed and (root / "checkpoints" / "gone").exists():
                time.sleep(0.5)  # in use
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            time.sleep(0.05)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"error: the embedded model server (pid {killed[-1]}) exited (killed by SIGKILL) again;")
    assert "started again 3 time(s) (3 after it exited, 0 after it hung: restarts = 3 counts both)" in last
    assert sum("is not any more" in line for line in (out + err).splitlines()) == 1
    assert server_of(proc.pid) is None


def test_focus_collect_waits_out_a_restart_with_one_line_and_its_batch_is_unchanged(server, clean, tmp_path):
    """The command an operator runs, against a model service killed mid-collection and
    started again on its port within ``model.http.outage_wait_s``: it goes on, its
    console says so, and the batch is an uninterrupted run's (the module's clean one)."""
    import json
    import subprocess
    import sys

    from fixtures.prefect import base_env

    root = tmp_path / "store"
    clean_root, clean_url, calls = clean
    http = "\n".join(f"{k} = {v}" for k, v in {**HTTP, "outage_wait_s": 60.0, "deadline_s": 600.0}.items())
    cfg = tmp_path / "collect.toml"
    cfg.write_text(
        f'collection_id = "cli"\nseed = 11\nprogress = false\n[model]\nkind = "openai"\nurl = "{server.url}"\n'
        f"[model.http]\n{http}\n[env]\nn_tasks = 4\n[agent.sampling]\nmax_tokens = 8\n"
        '[[search.phases]]\nname = "evidence"\nrollouts_per_task = 2\n'
        '[[search.phases]]\nname = "continue"\ntransitions = 60\nwave_size = 6\nmax_depth = 6\n'
        f'[execution]\nkind = "local"\nmax_concurrency = 8\n[storage]\nroot = "{root}"\n',
        encoding="utf-8",
    )
    before = served_requests(server.url)
    with ServerRestart(server, after_requests=before + calls // 2, down_s=DOWN_S) as restart:
        done = subprocess.run(
            [sys.executable, "-m", "cli", "collect", "-c", str(cfg), "--json"], cwd=tmp_path,
            env=base_env(tmp_path / "prefect"), capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert restart.killed_at is not None and restart.requests_at_kill < before + calls  # killed mid-collection
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert len(lines) == 2, lines  # one line when it went, one when it is back; no traceback, no other line
    assert lines[0].startswith(f"warning: model service at {server.url} has not answered for "), lines
    assert "waiting up to 60 s from then for it to come back (outage_wait_s)" in lines[0], lines
    assert lines[1].startswith(f"warning: model service at {server.url} answers again after "), lines
    result = json.loads(done.stdout.splitlines()[-1])
    stats, actor, critic = rows(str(root), result["batch_url"])
    want_stats, want_actor, want_critic = rows(clean_root, clean_url)
    assert stats["failed_rollouts"] == 0 and (actor, critic) == (want_actor, want_critic)
