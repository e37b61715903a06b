"""A collection and a train loop keep their records under ``checkpoints/<id>``; one id
given to both mixed them. `focus collect --collection-id L` on a store where `L` is a
train loop said that the collection's configuration record was missing while steps of
it were saved, and to remove ``checkpoints/L`` "to start this one again": the loop's
settings and trainer records. `focus train --collection-id c` over a collection `c`
wrote the loop's records into the collection's folder without a word. Each is now
refused in one line naming what the id already is, before anything is written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from fixtures.prefect import base_env

from storage import CheckpointStore
from tasks.config import load_config
from tasks.fingerprint import ResumeMismatch
from tasks.loop_settings import settle


def config(root: Path, cid: str = "L"):
    return load_config(None, overrides={"collection_id": cid, "storage.root": str(root)}, environ={})


def listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_focus_collect_refuses_a_train_loops_id_without_advice_that_removes_the_loop(tmp_path):
    store = tmp_path / "s"
    settle(config(store))  # a loop's first run records its settings
    CheckpointStore(str(store)).save("L", "train", 0, {"policy_version": "v1"})
    before = listing(store)
    done = subprocess.run(
        [sys.executable, "-m", "cli", "collect", "--store", str(store), "--collection-id", "L", "--tasks", "1"],
        cwd=tmp_path,
        env=base_env(tmp_path / "prefect"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stdout[-1000:] + done.stderr[-2000:]
    assert lines[0].startswith("error: collection id 'L' in file://") and "is a train loop's" in lines[0], lines[0]
    assert "collect under another collection id" in lines[0] and "remove" not in lines[0], lines[0]
    assert listing(store) == before  # nothing written, nothing removed


def test_a_new_train_loop_refuses_a_collections_id(tmp_path):
    store = CheckpointStore(str(tmp_path))
    store.save("c", "config", 0, "{}")  # a collection's first record
    store.save("c", "evidence", 0, {"rollouts": []})
    with pytest.raises(ResumeMismatch, match=r"^train loop 'c': 'c' is the id of a collection in file://") as e:
        settle(config(tmp_path, "c"), record=False)
    assert "use another --collection-id" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ResumeMismatch):
        settle(config(tmp_path, "c"))
    assert not store.exists("c", "settings", 0)
    # a loop that already began in such a folder (before this check) goes on: its work stays reachable
    store.save("d", "config", 0, "{}")
    store.save("d", "settings", 0, {"from": 0, "settings": {}})
    settle(config(tmp_path, "d"), record=False)
