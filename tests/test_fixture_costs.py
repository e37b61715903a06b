"""What the test fixtures cost the processes the tests start (tests/conftest.py, tests/fixtures/)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures.prefect import base_env


def test_the_factories_a_command_imports_bring_no_pytest_or_httpx(tmp_path: Path) -> None:
    """A ``focus`` command a test starts builds its model from ``fixtures.digits`` (the
    ``model.factory`` of the pipeline tests): importing it must not pull in pytest or httpx,
    which the command itself does not import (0.11-0.16 CPU-s a process, when the factories
    lived in fixtures.prefect)."""
    import fixtures.digits as digits
    import fixtures.prefect as prefect

    # the names the tests import from fixtures.prefect are these same objects
    for name in ("DigitPolicy", "GatedPolicy", "FlakyCritic", "digit_policy", "gated_policy", "flaky_critic"):
        assert getattr(prefect, name) is getattr(digits, name), name
    code = "import sys, fixtures.digits; print(sorted({'pytest', 'httpx', '_pytest'} & set(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", code], env=base_env(tmp_path / "prefect"), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_the_template_prefect_home_is_migrated_and_holds_no_runs(
    prefect_template: Path, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """tests/fixtures/prefect.py copies the first session server's home (once it answers)
    for the servers started later: the copy is a migrated database with Prefect's block
    types and no flow run, task run, deployment or automation of any test. It is kept
    outside the run's temporary folders, for the Prefect installed, so the next run's first
    servers start on it too (kept per run, both xdist workers' first servers migrated)."""
    import sqlite3
    from importlib.metadata import version

    from fixtures.prefect import TEMPLATE_FILES, from_template

    if prefect_template is None:
        pytest.skip("no template kept: pytest's cache is off, or its folder cannot be written (a read-only checkout)")
    run = tmp_path_factory.getbasetemp().parent
    assert not prefect_template.is_relative_to(run) and prefect_template.name.endswith(version("prefect"))
    home = from_template(prefect_template, tmp_path / "home")
    assert sorted(p.name for p in home.iterdir()) == sorted(TEMPLATE_FILES)
    db = sqlite3.connect(home / "prefect.db")
    try:
        assert db.execute("select count(*) from alembic_version").fetchone()[0] == 1
        assert db.execute("select count(*) from block_type").fetchone()[0] > 0
        for table in ("flow_run", "task_run", "deployment", "automation", "flow"):
            assert db.execute(f"select count(*) from {table}").fetchone()[0] == 0, table
    finally:
        db.close()


def test_the_template_prefect_home_lives_in_pytests_cache_dir(tmp_path: Path) -> None:
    """The template is kept in pytest's ``cache_dir`` (a read-only checkout sets it with
    ``-o cache_dir=...``; it was always ``<checkout>/.pytest_cache``), and none is kept
    where pytest's cache is off (``-p no:cacheprovider``, which defines ``cache_dir``)."""
    from importlib.metadata import version
    from types import SimpleNamespace

    from fixtures.prefect import _template_dir

    def config(cache_dir: str | None) -> SimpleNamespace:
        def getini(name: str) -> str:
            if cache_dir is None:
                raise ValueError(f"unknown configuration value: {name!r}")
            return cache_dir

        return SimpleNamespace(rootpath=tmp_path / "checkout", getini=getini)

    name = f"prefect_home_template-{version('prefect')}"
    assert _template_dir(config(str(tmp_path / "elsewhere"))) == tmp_path / "elsewhere" / name
    assert _template_dir(config(".pytest_cache")) == tmp_path / "checkout" / ".pytest_cache" / name
    assert _template_dir(config(None)) is None


def test_a_template_this_user_cannot_read_is_no_template(tmp_path: Path) -> None:
    """A template folder the user running the tests cannot read (made by another user
    under ``umask 077``: a CI step as root, then one as a user, in one checkout) leaves
    the server's home empty, nothing half copied: every test that starts a Prefect server
    errored at setup with ``PermissionError`` there (a non-root user in a checkout root
    had tested in). Root reads any folder, so the refusal is the OS's answer, simulated."""
    from unittest import mock

    import fixtures.prefect as prefect

    template = tmp_path / "template"
    template.mkdir()
    for name in prefect.TEMPLATE_FILES:
        (template / name).write_text("x", encoding="utf-8")
    copied: list[str] = []

    def refused_second(src: Path, dst: Path) -> None:
        if copied:
            raise PermissionError(13, "Permission denied", str(src))
        copied.append(Path(dst).name)
        Path(dst).write_text("x", encoding="utf-8")

    with mock.patch.object(prefect.shutil, "copyfile", refused_second):
        home = prefect.from_template(template, tmp_path / "home")
    assert copied and list(home.iterdir()) == []
    assert prefect.from_template(None, tmp_path / "home2").is_dir()


def test_the_commands_a_test_starts_keep_their_bytecode(tmp_path: Path) -> None:
    """Where the suite was started with ``PYTHONDONTWRITEBYTECODE`` set, each command a test
    starts compiled the project's modules again (0.13 CPU-s of a small ``focus collect``) and
    each xdist worker rewrote every test module again: tests/conftest.py lets them keep it.
    The file itself is checked where the checkout can be written: in a read-only one (a
    fresh clone mounted read-only) there is none, and this failed."""
    import focus.batch_schema

    code = "import sys, focus.batch_schema; print(sys.dont_write_bytecode, focus.batch_schema.__cached__)"
    done = subprocess.run(
        [sys.executable, "-c", code], env=base_env(tmp_path / "prefect"), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    writes, cached = done.stdout.strip().split(" ", 1)  # a checkout's path may hold a space
    assert writes == "False" and not sys.dont_write_bytecode and "PYTHONDONTWRITEBYTECODE" not in os.environ
    assert cached == focus.batch_schema.__cached__
    # kept where it can be: a read-only checkout (a fresh clone mounted read-only, or one
    # another user owns) has no bytecode to keep, and Python then runs without writing it
    folder = Path(cached).parent
    if os.access(folder if folder.is_dir() else folder.parent, os.W_OK):
        assert Path(cached).is_file()


def test_the_fixture_plugins_every_pytest_process_loads_import_no_torch(tmp_path: Path) -> None:
    """tests/conftest.py makes every module of tests/fixtures/ a plugin, which every pytest
    process imports before it runs a test: the xdist controller, which runs none, and the
    sessions tests start (tests/test_prefect_logs_sent.py). A helper there that imported
    torch (the verl metrics mirror) cost each of them torch's import: ``pytest
    --collect-only`` of one test took 2.3 CPU-s, 0.9 without it (2 cores, load 12). Torch
    is imported by the tests that use it."""
    code = (
        "import importlib, sys; sys.path[:0] = ['tests', '.']; import conftest; "
        "[importlib.import_module(p) for p in conftest.pytest_plugins]; "
        "print(len(conftest.pytest_plugins), 'torch' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=Path(__file__).resolve().parents[1],
        env=base_env(tmp_path / "prefect"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    plugins, torch = done.stdout.split()
    assert int(plugins) > 5 and torch == "False", done.stdout
