"""``focus train`` without a Prefect server runs the loop directly: Ctrl-C (SIGINT to
the command) mid-collection stops it with the one line that says how to resume and
status 130, and the rerun resumes the interrupted collection from its checkpoints and
finishes (a finished loop's rerun: tests/test_train_watch.py)."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest
from fixtures.prefect import base_env, kill_tree
from test_train_watch import _command

from storage import CheckpointStore

pytestmark = [pytest.mark.integration, pytest.mark.timeout(500)]


def test_ctrl_c_then_rerun_resumes_the_direct_loop(tmp_path):
    root = tmp_path / "store"
    env = base_env(tmp_path / "p")
    # Ten times the tiny loop's budget, so many continuation waves, not one or two: the
    # signal comes after the first is saved, and must find the collection unfinished
    # however slowly the command reacts to it.
    cmd = [*_command(root), "--set", "search.phases.1.transitions=60"]
    store = CheckpointStore(str(root))
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 300
        while not any(p == "1.continue" for p, _ in store.list("w-it0")):
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:] if proc.stderr else ""
            assert time.monotonic() < deadline, "no continuation wave within 300 s"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)  # to the command alone, as a terminal's Ctrl-C reaches it
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            kill_tree(proc)
    lines = err.decode().strip().splitlines()
    assert proc.returncode == 130, err.decode()[-3000:]
    assert lines[-1].startswith("interrupted (SIGINT)") and "resume with: focus train -c " in lines[-1], lines[-3:]
    assert lines[-1].endswith("--set search.phases.1.transitions=60 --collection-id w"), lines[-3:]
    assert not store.exists("w-it0", "export", 0)

    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [r["iteration"] for r in records] == [0, 1, 2]
    assert 0 < records[0]["stats"]["steps_reused"] < records[0]["stats"]["steps"]  # resumed, not redone
