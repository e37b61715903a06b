"""focus.spawn: a start that fails with a transient EFAULT is tried again; nothing else is."""

from __future__ import annotations

import errno
import subprocess
import sys

import pytest

from focus import spawn as spawn_mod
from focus.spawn import EFAULT_TRIES, spawn


def _failing(times: int, err: int, calls: list[list[str]]):
    real = subprocess.Popen

    def popen(cmd, **kw):
        calls.append(cmd)
        if len(calls) <= times:
            raise OSError(err, "Bad address" if err == errno.EFAULT else "failed", cmd[0])
        return real(cmd, **kw)

    return popen


def test_a_transient_efault_is_started_again(monkeypatch):
    calls: list[list[str]] = []
    monkeypatch.setattr(spawn_mod.subprocess, "Popen", _failing(EFAULT_TRIES - 1, errno.EFAULT, calls))
    proc = spawn([sys.executable, "-c", "print('up')"], stdout=subprocess.PIPE)
    out, _ = proc.communicate(timeout=60)
    assert out.strip() == b"up" and proc.returncode == 0
    assert len(calls) == EFAULT_TRIES


def test_an_efault_every_time_is_raised(monkeypatch):
    calls: list[list[str]] = []
    monkeypatch.setattr(spawn_mod.subprocess, "Popen", _failing(99, errno.EFAULT, calls))
    with pytest.raises(OSError) as e:
        spawn([sys.executable, "-c", "pass"])
    assert e.value.errno == errno.EFAULT and len(calls) == EFAULT_TRIES


def test_other_errors_are_raised_at_once(monkeypatch):
    calls: list[list[str]] = []
    monkeypatch.setattr(spawn_mod.subprocess, "Popen", _failing(99, errno.ENOENT, calls))
    with pytest.raises(FileNotFoundError):
        spawn(["/nonexistent/focus-binary"])
    assert len(calls) == 1


def test_a_missing_program_is_not_retried():
    with pytest.raises(FileNotFoundError):
        spawn(["/nonexistent/focus-binary"])
