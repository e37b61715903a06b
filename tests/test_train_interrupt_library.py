"""Ctrl-C during a policy update of a train loop called from Python (not the ``focus``
command, whose exit skips the interpreter's shutdown): the process ends as an
interrupted Python program does, with a KeyboardInterrupt traceback. It ended with
abort (exit -6, ``terminate called without an active exception``): the trainer's daemon
thread was still inside torch when the interpreter shut down."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fixtures.loop import TINY_LOOP

from storage import CheckpointStore
from storage.weights import WeightStore

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.needs("torch"), pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[1]

#: The loop as a library caller runs it; the update (focus.train_local.train_iteration)
#: marks that it began, then spends its time in torch (a minute at most) before the
#: real update: a SIGINT lands while the thread is inside torch.
SCRIPT = """
import asyncio, json, pathlib, sys, time

import focus.train_local as tl
from flows.loop import train_direct
from tasks.config import load_config

root, overrides = pathlib.Path(sys.argv[1]), json.loads(sys.argv[2])
real = tl.train_iteration


def slow_update(*args, **kwargs):
    import torch

    (root / "update-began").touch()
    x, end = torch.randn(256, 256), time.monotonic() + 60
    while time.monotonic() < end:
        x = torch.tanh(x @ x)
    return real(*args, **kwargs)


tl.train_iteration = slow_update
asyncio.run(train_direct(load_config("configs/loop.toml", overrides, environ={})))
"""


def test_ctrl_c_during_an_update_ends_a_library_callers_process_with_keyboard_interrupt(tmp_path):
    store = tmp_path / "store"
    overrides = {
        **TINY_LOOP,
        "collection_id": "lib",
        "progress": False,
        "storage.root": str(store),
        "train.iterations": 1,
        "train.eval_tasks": 0,
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(tmp_path), json.dumps(overrides)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 90
    while not (tmp_path / "update-began").exists():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the update never began"
        time.sleep(0.05)
    time.sleep(0.3)  # inside torch
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    # an uncaught KeyboardInterrupt ends Python by SIGINT (-2 here, 130 in a shell)
    assert proc.returncode in (-signal.SIGINT, 130), (proc.returncode, err[-3000:])
    assert "terminate called" not in err, err[-3000:]
    assert err.rstrip().endswith("KeyboardInterrupt"), err[-3000:]
    # the trainer stopped within the loop's bound (how soon within it follows the machine's
    # load, so the 1 s "waiting for the trainer" line is not held against it)
    assert "did not stop" not in err, err[-3000:]
    # nothing of the interrupted update was recorded or published
    assert not CheckpointStore(str(store)).exists("lib", "train", 0)
    assert not WeightStore(str(store)).exists("lib", 1)
