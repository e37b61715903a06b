"""The test session hands its children Ctrl-C at its default, whatever its own start.

Started as a background job of a non-interactive shell, pytest inherits SIGINT ignored;
without :func:`conftest.children_take_ctrl_c` every child would too, and a test that
interrupts a child (tests/test_train_interrupt_library.py) waits out its timeout."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CHILD = "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"


def test_a_child_of_the_session_takes_sigint_even_when_the_session_was_started_ignoring_it():
    # the session itself, started with SIGINT ignored (as `make test &` is): its child's answer
    session = (
        f"import signal, subprocess, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
        f"import conftest; conftest.children_take_ctrl_c(); "
        f"print(subprocess.run([sys.executable, '-c', {CHILD!r}], capture_output=True, text=True).stdout.strip())"
    )
    out = subprocess.run(
        [sys.executable, "-c", session], capture_output=True, text=True, cwd=Path(__file__).parent, timeout=60
    )
    assert out.stdout.strip() == "True", out.stderr[-2000:]


def test_without_it_the_child_inherits_sigint_ignored():
    # the failure this guards against, shown on this machine: an ignored SIGINT crosses exec
    session = (
        f"import signal, subprocess, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
        f"print(subprocess.run([sys.executable, '-c', {CHILD!r}], capture_output=True, text=True).stdout.strip())"
    )
    out = subprocess.run([sys.executable, "-c", session], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr[-2000:]
