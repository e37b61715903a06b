"""A train loop on the embedded model killed with SIGKILL mid-collection, mid-training
and in the next iteration, then run again with the same id, ends with the weights of a
run that was never interrupted; finished steps are reused, not recomputed.

The loop runs as the installed ``focus`` command would: from the user's own folder,
which holds the trainer module (``slowtrain.py``), with that folder on no import path
but the current directory's."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from fixtures.prefect import base_env, kill_tree

from storage import BatchStore, CheckpointStore
from storage.weights import WeightStore

pytestmark = [
    # Generous and bounded: three runs to kill, a resume and a clean loop, each a few
    # seconds on a quiet machine and minutes on a loaded one.
    pytest.mark.timeout(900),
    # Equal weights need equal log-probs from the model server whatever else it serves
    # (its prefix cache, its batching): the embedded server's invariant numerics.
    pytest.mark.skipif(
        importlib.util.find_spec("focus.tinylm.numerics") is None,
        reason="needs the embedded server's batch-invariant numerics (focus.tinylm.numerics)",
    ),
]

CONFIG = """
collection_id = "r"
seed = 5
progress = false
[env]
n_tasks = 3
[agent]
max_steps = 4
sampling = {{max_tokens = 4}}
[[search.phases]]
name = "evidence"
rollouts_per_task = 2
[[search.phases]]
name = "continue"
transitions = 30
wave_size = 2
max_depth = 3
[critic]
kind = "local"
options = {{buckets = 256, hidden = 8}}
[execution]
kind = "local"
[storage]
root = "{root}"
[train]
iterations = 2
trainer = "slowtrain:train"
options = {{marker_dir = "{markers}", pause_s = {pause}}}
"""

TRAINER = '''
"""A user's trainer: the shipped local trainer, with marks and pauses to be killed in."""
import pathlib
import time

from tasks.trainers import local_trainer


def train(batch_url, ctx, marker_dir, pause_s):
    mark = pathlib.Path(marker_dir)
    mark.mkdir(parents=True, exist_ok=True)
    result = local_trainer(batch_url, ctx)
    trained = mark / f"trained-{ctx.iteration}"
    first = ctx.iteration == 0 and not trained.exists()
    trained.touch()  # weights published, result not yet recorded
    if first:  # the run that trains iteration 0 first waits here to be killed (in short
        # sleeps, as a Python trainer's steps are: a Ctrl-C's stop lands between them)
        end = time.monotonic() + pause_s
        while time.monotonic() < end:
            time.sleep(0.05)
    return result
'''

LAUNCHER = "import sys\nfrom cli.app import main\nsys.argv[0] = 'focus'\nmain()\n"


def _wait(proc, what, cond, timeout=300):
    deadline = time.monotonic() + timeout
    while not cond():
        assert proc.poll() is None, f"the run ended before {what}: " + (
            proc.stdout.read().decode()[-3000:] if proc.stdout else ""
        )
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.needs("torch")  # a LocalCritic
def assert_same_as_clean(root: Path, results: list[dict], clean_root: Path, clean: list[dict]) -> None:
    """Each iteration's policy version and batch, and the last weights, are the clean loop's."""
    for a, b in zip(results, clean, strict=True):
        assert a["train"]["policy_version"] == b["train"]["policy_version"]
        ra = BatchStore(str(root)).read(a["batch_url"])
        rb = BatchStore(str(clean_root)).read(b["batch_url"])
        assert ra.actor == rb.actor and ra.critic == rb.critic
    for name in ("policy.pt", "critic.pt", "optimizer.pt"):
        got = WeightStore(str(root)).read(f"{WeightStore(str(root)).folder('r', 2)}/{name}")
        want = WeightStore(str(clean_root)).read(f"{WeightStore(str(clean_root)).folder('r', 2)}/{name}")
        assert got == want, name


def test_kill_9_anywhere_then_resume_gives_the_uninterrupted_weights(prefect_env, clean_train_loop, tmp_path):
    user = tmp_path / "user"  # the user's folder: config and trainer module
    user.mkdir()
    (user / "slowtrain.py").write_text(textwrap.dedent(TRAINER))
    launcher = tmp_path / "bin" / "focus_cli.py"  # like the console script: not in the user's folder
    launcher.parent.mkdir()
    launcher.write_text(LAUNCHER)
    root, markers = tmp_path / "store", tmp_path / "markers"
    # the first training of iteration 0 waits (bounded) until it is killed, whatever the
    # machine's speed; later trainings, the resumed ones included, do not wait
    (user / "loop.toml").write_text(CONFIG.format(root=root, markers=markers, pause=120))
    cmd = [sys.executable, str(launcher), "train", "-c", "loop.toml", "--json"]
    store = CheckpointStore(str(root))

    # The killed runs take the direct path (no Prefect API configured), the run that
    # finishes is a train_loop flow run and the clean loop runs directly again: one loop
    # over one journal, so either path resumes the other and both end with one set of weights.
    direct_env = base_env(tmp_path / "prefect-home")

    def start():
        return subprocess.Popen(
            cmd, cwd=user, env=direct_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        )

    kills = [
        ("mid-collection of iteration 0", lambda: any(p == "1.continue.score" for p, _ in store.list("r-it0"))),
        ("mid-training of iteration 0", lambda: (markers / "trained-0").exists()),
        ("mid-collection of iteration 1", lambda: any(p == "1.continue" for p, _ in store.list("r-it1"))),
    ]
    for what, cond in kills:
        proc = start()
        try:
            _wait(proc, what, cond)
        finally:
            kill_tree(proc)  # SIGKILL to the CLI and everything it started (the model server)
        assert proc.returncode == -9, what
    assert store.exists("r", "train", 0) and not store.exists("r", "train", 1)
    assert not store.exists("r-it1", "export", 0), "iteration 1 finished before it could be killed"

    done = subprocess.run(cmd, cwd=user, env=prefect_env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    resumed = [json.loads(line) for line in done.stdout.strip().splitlines() if line.startswith("{")]
    assert [r["iteration"] for r in resumed] == [0, 1]
    # iteration 0 is reused whole; iteration 1 resumes its collection
    assert resumed[0]["train"]["reused"] and resumed[0]["stats"]["steps_reused"] == resumed[0]["stats"]["steps"]
    assert not resumed[1]["train"]["reused"] and 0 < resumed[1]["stats"]["steps_reused"]

    # the same loop, never interrupted, run from a user's folder (once a session: the
    # Ctrl-C test of tests/test_interrupts.py compares with it too)
    clean_root, clean = clean_train_loop
    assert_same_as_clean(root, resumed, clean_root, clean)
    assert Path(resumed[1]["train"]["weights"]).name == "policy.pt"


@pytest.mark.needs("torch")  # a LocalCritic
def test_focus_train_waits_out_its_model_server_killed_after_a_reload(clean_train_loop, tmp_path):
    """The loop's embedded model server killed (kill -9, the OOM killer) while iteration 1
    collects, after the loop loaded iteration 0's weights into it: its keeper starts it
    again on its port, with the weights last loaded, the collection waits it out, and the
    loop ends as one never interrupted (batches and weights, bit for bit).

    And the restart is one line on the console, the keeper's: the model client's two
    lines about the outage (``has not answered for``, ``answers again after``) go to the
    log file alone (``focus.backends.outage.kept_by_owner``; it printed three lines for
    one restart). Retries spent within a second: the calls the kill cut wait for the
    server at the outage gate, which writes those lines."""
    import os
    import signal

    from fixtures._procs import server_of

    user = tmp_path / "user"
    user.mkdir()
    (user / "slowtrain.py").write_text(textwrap.dedent(TRAINER))
    launcher = tmp_path / "bin" / "focus_cli.py"
    launcher.parent.mkdir()
    launcher.write_text(LAUNCHER)
    root, markers = tmp_path / "store", tmp_path / "markers"
    (user / "loop.toml").write_text(CONFIG.format(root=root, markers=markers, pause=0))
    store = CheckpointStore(str(root))
    log = tmp_path / "train.log"
    args = ["train", "-c", "loop.toml", "--json", "--log-file", str(log)]
    args += ["--set", "model.http.max_retries=1", "--set", "model.http.backoff_s=0.01"]
    proc = subprocess.Popen(
        [sys.executable, str(launcher), *args], cwd=user,
        env=base_env(tmp_path / "prefect-home"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        _wait(proc, "mid-collection of iteration 1", lambda: any(p == "1.continue" for p, _ in store.list("r-it1")))
        pid = server_of(proc.pid)
        assert pid is not None, "no embedded model server"
        os.kill(pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=300)
    finally:
        kill_tree(proc)
    assert proc.returncode == 0, err.decode()[-3000:]
    # the keeper's line and nothing else (no traceback, not the model client's lines)
    lines = [ln for ln in err.decode().splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith(
        f"warning: the embedded model server (pid {pid}) exited (killed by SIGKILL) while in use; started again on "
        "port "
    ), lines
    port = lines[0].split("started again on port ")[1].split()[0]
    service = f"model service at http://127.0.0.1:{port}"
    text = log.read_text()  # the client's lines: in the log file, as before
    assert f"{service} has not answered for " in text and f"{service} answers again after " in text, text[-3000:]
    results = [json.loads(line) for line in out.decode().strip().splitlines() if line.startswith("{")]
    clean_root, clean = clean_train_loop
    assert [r["iteration"] for r in results] == [0, 1]
    assert_same_as_clean(root, results, clean_root, clean)
