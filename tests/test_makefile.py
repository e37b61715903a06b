"""The Makefile on a machine whose ``python3`` is older than pyproject.toml's
``requires-python`` (Ubuntu 22.04's python3 is 3.10.12): ``make install`` stops at once with
one line naming the Python and what to run, before a venv is made or anything installed.
It made the venv, installed torch for minutes, then pip refused the project; and the venv
made from the old Python stayed, so ``make PY=python3.12 install`` reused it and failed
the same way.

An older Python is the running one with ``sys.version_info`` set to 3.10.12 by a
``sitecustomize`` module on ``PYTHONPATH``: the Makefile's check is what runs, on a real
interpreter."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from fixtures.mounts import private_mounts

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make here")


def older_python(tmp_path: Path) -> dict[str, str]:
    """An environment in which Python reports version 3.10.12."""
    site = tmp_path / "old-site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import sys\nsys.version_info = (3, 10, 12, 'final', 0)\n")
    return {**os.environ, "PYTHONPATH": str(site)}


def make(args: list[str], env: dict[str, str] | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "--no-print-directory", "-f", str(ROOT / "Makefile"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def beside(tmp_path: Path) -> Path:
    """A folder with pyproject.toml, where ``make`` runs with the repository's Makefile
    and a relative venv: nothing in the checkout is touched, and a temporary folder whose
    path holds a space (make splits targets on spaces) does not matter."""
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_make_install_refuses_an_older_python_before_making_the_venv(tmp_path):
    venv = tmp_path / "venv"
    done = make(["install", f"PY={sys.executable}", "VENV=venv"], env=older_python(tmp_path), cwd=beside(tmp_path))
    assert done.returncode != 0
    line = f"{sys.executable} is Python 3.10.12; FOCUS needs 3.11 or later: make PY=python3.12"
    assert line in done.stderr, done.stderr
    assert not venv.exists()  # nothing was made, nothing installed


def test_make_install_refuses_a_venv_made_from_an_older_python(tmp_path):
    """A venv left by an older Python is named, with how to remove it, before pip runs."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    env = older_python(tmp_path)
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{env["PYTHONPATH"]}" exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    done = make(["install", f"PY={sys.executable}", "VENV=venv"], cwd=beside(tmp_path))
    assert done.returncode != 0
    assert "venv is Python 3.10.12; FOCUS needs 3.11 or later: remove it (make clean)" in done.stderr, done.stderr
    assert "pip install" not in done.stdout and not (venv / ".installed").exists()


def test_the_makefile_check_passes_this_python_and_matches_requires_python(tmp_path):
    probe = ["--eval", "probe: ; @$(call py_ok,$(PY),$(PY),x)", "probe", f"PY={sys.executable}"]
    assert make(probe).returncode == 0  # this interpreter meets requires-python
    assert make(probe, env=older_python(tmp_path)).returncode != 0
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    required = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["requires-python"]
    minimum = re.search(r"^PY_MIN := (\S+)$", text, re.M)
    assert minimum is not None and required == f">={minimum.group(1)}"
    assert f"v >= ({minimum.group(1).replace('.', ', ')})" in text


def test_lint_caches_leave_a_read_only_checkout(tmp_path):
    """``make lint`` (the first step of ``make test``) in a checkout mounted read-only: ruff
    and mypy stopped at once, unable to make .ruff_cache and .mypy_cache there. The
    Makefile points both caches at the temporary folder then, and leaves them alone in a
    checkout that can be written (and where the user set them)."""
    prefix = private_mounts()
    if prefix is None:
        pytest.skip("no private mount namespace here (unshare -m or -rm) to mount a folder read-only")
    show = 'show: ; @echo "[$$RUFF_CACHE_DIR][$$MYPY_CACHE_DIR]"'
    (tmp_path / "checkout").mkdir()
    checkout = beside(tmp_path / "checkout")
    env = {k: v for k, v in os.environ.items() if k not in ("RUFF_CACHE_DIR", "MYPY_CACHE_DIR")}
    env["TMPDIR"] = str(tmp_path / "tmp")
    makefile = str(ROOT / "Makefile")
    script = (
        'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && cd "$1" && exec make -s -f "$2" --eval "$3" show'
    )
    done = subprocess.run(
        [*prefix, "sh", "-c", script, "sh", str(checkout), makefile, show],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    cache = re.escape(f"{tmp_path / 'tmp'}/focus-lint-cache-") + r"\d+"  # the id inside the namespace
    assert re.fullmatch(rf"\[{cache}/ruff\]\[{cache}/mypy\]", done.stdout.strip()), done.stdout
    writable = make(["-s", "--eval", show, "show"], env=env, cwd=checkout)
    assert writable.stdout.strip() == "[][]", writable.stderr
    mine = subprocess.run(
        [*prefix, "sh", "-c", script, "sh", str(checkout), makefile, show],
        env={**env, "RUFF_CACHE_DIR": "/r", "MYPY_CACHE_DIR": "/m"}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert mine.stdout.strip() == "[/r][/m]", mine.stderr


@pytest.mark.parametrize("stamped", [True, False], ids=["installed", "half-made"])
def test_make_names_a_venv_whose_python_is_gone(tmp_path, stamped):
    """A venv whose interpreter was removed or replaced since (``pyenv uninstall``, ``brew
    upgrade python``, a venv copied from another machine): installed, ``make install`` did
    nothing and ``make lint``/``make test`` stopped at ``bad interpreter``; half made,
    ``python -m venv`` over it stopped with ``Error: [Errno 2] No such file or directory:
    'venv/bin/python3'``. Both name the venv, the Python it was made from and what to do."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /gone/bin\nexecutable = /gone/bin/python3.12\nversion = 3.12.1\n")
    (venv / "bin" / "python").symlink_to("/gone/bin/python3.12")
    cwd = beside(tmp_path)
    if stamped:
        (venv / ".installed").touch()
    for goal in ("install", "lint") if stamped else ("install",):
        done = make([goal, f"PY={sys.executable}", "VENV=venv"], cwd=cwd)
        assert done.returncode != 0, (goal, done.stdout, done.stderr)
        line = "venv's Python does not run (made from /gone/bin/python3.12, gone or replaced since): remove it (make clean)"
        assert line in done.stderr, (goal, done.stderr)
        assert "bad interpreter" not in done.stderr and "Errno" not in done.stderr
