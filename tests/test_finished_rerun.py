"""A rerun of a finished collection costs no start-up: the installed command's entry
(:mod:`cli.entry`) runs with every process it starts recorded, and a rerun of a
finished collection starts none - no embedded model server, no Prefect server, no Dask
cluster - and imports neither Prefect nor Dask."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from fixtures.prefect import base_env

pytestmark = pytest.mark.integration

SMALL = ["--tasks", "2", "--transitions", "6", "--set", "agent.sampling.max_tokens=8", "--set", "agent.max_steps=4"]

#: The ``focus`` command's entry with every ``subprocess.Popen`` recorded, and what it
#: imported written to ``$STARTED_LOG`` as it leaves (the command ends with ``os._exit``).
_RECORDED = """
import json, os, subprocess, sys

started = []
_init = subprocess.Popen.__init__


def _recording(self, args, *a, **k):
    started.append([str(x) for x in args] if isinstance(args, (list, tuple)) else [str(args)])
    _init(self, args, *a, **k)


subprocess.Popen.__init__ = _recording
_exit = os._exit


def _leave(code):
    with open(os.environ["STARTED_LOG"], "w") as f:
        json.dump({"started": started, "imported": sorted(m for m in ("prefect", "distributed") if m in sys.modules)}, f)
    _exit(code)


os._exit = _leave
sys.argv = ["focus", *sys.argv[1:]]
from cli.entry import main

main()
"""


def _focus(tmp_path, *args: str, env_extra: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    log = tmp_path / "started.json"
    env = {**base_env(tmp_path / "prefect"), "STARTED_LOG": str(log), **(env_extra or {})}
    done = subprocess.run(
        [sys.executable, "-c", _RECORDED, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done, json.loads(log.read_text())


def _servers(record: dict) -> list[list[str]]:
    return [cmd for cmd in record["started"] if "focus.tinylm.server" in cmd or "prefect" in " ".join(cmd)]


def test_a_finished_collection_is_answered_before_any_server_starts(tmp_path):
    store = str(tmp_path / "runs")
    base = ["collect", *SMALL, "--store", store, "--collection-id", "done", "--log-file", str(tmp_path / "c.log")]
    _, first = _focus(tmp_path, *base)
    assert any("focus.tinylm.server" in cmd for cmd in first["started"]), first  # the record sees a start
    for extra, env_extra in (
        ([], None),
        (["--dask"], None),
        (["--prefect"], None),
        (["--json"], None),
    ):
        done, record = _focus(tmp_path, *base, *extra, env_extra=env_extra)
        assert "already finished" in done.stdout or '"already_finished": true' in done.stdout, done.stdout
        assert record == {"started": [], "imported": []}, (extra, record)
    # named by the environment or a config file, not the command line: the same
    cfg = tmp_path / "c.toml"
    cfg.write_text('collection_id = "done"\n')
    rest = ["collect", *SMALL, "--store", store, "--log-file", str(tmp_path / "c.log")]
    for args, env_extra in (([*rest, "-c", str(cfg)], None), (rest, {"FOCUS_COLLECTION_ID": "done"})):
        done, record = _focus(tmp_path, *args, env_extra=env_extra)
        assert "already finished" in done.stdout, done.stdout
        assert _servers(record) == [] and record["started"] == [], (args, record)


def test_a_new_collection_starts_its_model_server_early_and_a_named_one_after_its_preflight(tmp_path):
    """A new collection (no id: it cannot be finished) gets the server the console entry
    started before reading the configuration; a named one starts it after its preflight
    found it unfinished. Each run collects, with one server."""
    store = str(tmp_path / "runs")
    for named, early in (([], True), (["--collection-id", "new"], False)):
        log = tmp_path / f"c{len(named)}.log"
        args = ["collect", *SMALL, "--store", store, *named, "--json", "--log-file", str(log)]
        done, record = _focus(tmp_path, *args)
        assert json.loads(done.stdout.strip().splitlines()[-1])["stats"]["actor_rows"] > 0
        assert sum("focus.tinylm.server" in cmd for cmd in record["started"]) == 1, record
        assert ("(started by the console entry)" in log.read_text()) is early, log.read_text()[-2000:]
