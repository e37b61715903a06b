"""What a rerun of ``focus collect`` asks the store.

The preflight (:mod:`flows.preflight`) reads a collection's configuration record and
lists its checkpoints to decide, before any service starts, whether a rerun may resume;
the collection then read the record and listed the checkpoints again for the same
answers (two reads and a listing more per rerun, each a request on S3). The direct
collection now takes what the preflight read (:func:`flows.direct.collect_direct`,
``preflight``). Real parts: the ``focus collect`` command in this process, the digit
policy (no model server), a local store whose every request is counted.
"""

from __future__ import annotations

import collections
from typing import Any

import pytest
from fixtures.journal import StopAfter, Stopped, run_collect
from typer.testing import CliRunner

import storage.urls
from cli.app import app
from focus.journal import wave_step
from tasks.config import load_config

CID = "counted"
#: Every request a store makes goes through one of these (storage/urls.py, Location).
REQUESTS = ("cat", "cat_many", "put_bytes", "exists", "list_files", "remove_many", "remove_folder", "copy")
SETS = {
    "model.kind": "factory",
    "model.factory": "fixtures.digits:digit_policy",
    "env.n_tasks": 2,
    "search.phases.1.transitions": 8,
}


def counted(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """(method, URL) of every storage request made from here on."""
    calls: list[tuple[str, str]] = []
    for name in REQUESTS:
        real = getattr(storage.urls.Location, name)

        def wrapper(self: Any, url: Any, *args: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
            calls.append((_name, str(url)))
            return _real(self, url, *args, **kw)

        monkeypatch.setattr(storage.urls.Location, name, wrapper)
    return calls


def test_a_resumed_rerun_reads_the_configuration_record_once_and_lists_once_before_the_lease(tmp_path, monkeypatch):
    """Before: the configuration record's manifest and data file read twice, the
    checkpoints listed four times (preflight, the collection's record check, the lease's
    sweep, the gap search). Now once, and three times."""
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    root = str(tmp_path / "store")
    cfg = load_config(overrides={**SETS, "collection_id": CID, "storage.root": root, "progress": False}, environ={})
    with pytest.raises(Stopped):
        run_collect(cfg, StopAfter(cfg, wave_step(1, 0)))
    calls = counted(monkeypatch)
    argv = ["collect", "--store", root, "--collection-id", CID, "--json"]
    for key, value in SETS.items():
        argv += ["--set", f"{key}={value}"]
    out = CliRunner().invoke(app, argv)
    assert out.exit_code == 0, out.output
    folder = f"file://{tmp_path / 'store'}/checkpoints/{CID}"
    config_record = [u for m, u in calls if m == "cat" and "/n-config-w00000." in u]
    assert len(config_record) == 2, config_record  # its manifest, its data file
    listings = [m for m, u in calls if m == "list_files" and u == folder]
    assert len(listings) == 3, calls
    kinds = collections.Counter(m for m, _ in calls)
    assert kinds["list_files"] + kinds["cat"] + kinds["cat_many"] < 40, kinds
