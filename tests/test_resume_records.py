"""A collection's configuration record or critic-identity record missing on a rerun.

A collection's first run saves the fingerprint of its configuration (checkpoint
``("config", 0)``) and the identity of its critic (``("critic", 0)``) before any step,
and a rerun compares the configuration and critic it meets with them. Where one of them
was lost while steps are saved (a partial copy of a store, a file deleted by hand), the
rerun saved the current configuration or critic as if the collection were new: a rerun
with another configuration or critic resumed the old steps under it, mixing them, and
later runs were checked against the wrong record. Now it stops with one line naming the
missing record's URL and what to do, and deletes nothing (:func:`tasks.gaps.missing_record`).
A run stopped before its first step leaves no step, and its rerun goes on as before.
Real parts: the embedded tiny model server, a local store, moto's S3 on loopback, and
the ``focus collect`` command for the exit status.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures.journal import Stopped, run_collect
from fixtures.prefect import base_env, free_port
from test_resume_gaps import CID, assert_finished_batch, config, copy_without, run_finished

from flows.errors import exit_code, one_line
from tasks.fingerprint import CRITIC_KEY
from tasks.gaps import RecordMissing, StoreIncomplete
from tasks.journal import CheckpointJournal

pytestmark = pytest.mark.timeout(240)

MANIFESTS = {"config": "n-config-w00000.manifest.json", "critic": "n-critic-w00000.manifest.json"}
#: The export record, manifest and data (a data file without a manifest is a leftover the
#: rerun's lease removes): without it the collection is unfinished.
EXPORT = ("n-export-w00000.manifest.json", "n-export-w00000.*.pkl")


@pytest.fixture(scope="module")
def finished(local_model_server, tmp_path_factory):
    """``tests/test_resume_gaps.py``'s collection, run once."""
    return run_finished(local_model_server.url, tmp_path_factory)


def contents(root: Path) -> dict[str, str]:
    """Every file under ``root`` and the digest of its bytes."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


def refusal(root: Path, url: str, **journal) -> str:  # type: ignore[no-untyped-def]
    """The one line a rerun stops with (it must stop)."""
    cfg = config(str(root), url)
    with pytest.raises(RecordMissing) as stopped:
        run_collect(cfg, CheckpointJournal(cfg, **journal))
    line = one_line(stopped.value)
    assert line == str(stopped.value) and "\n" not in line and exit_code(stopped.value) == 1
    return line


@pytest.mark.parametrize("record", ["config", "critic"])
@pytest.mark.needs("torch")  # the finished collection's critic is a LocalCritic
def test_a_record_missing_beside_saved_steps_stops_the_rerun_in_one_line(
    record, finished, local_model_server, tmp_path
):
    """An unfinished collection (no export record) without its configuration or critic
    record: the rerun stops naming the record's URL and what to do, before any step is
    replayed or computed, and the store is as it was, byte for byte. With the record put
    back, the rerun resumes and writes the finished collection's batch. Before, it saved
    the current record and went on: with another configuration (another seed, below) it
    resumed the old steps under it."""
    manifest = MANIFESTS[record]
    root = copy_without(finished, tmp_path, manifest, *EXPORT)
    before = contents(root)
    line = refusal(root, local_model_server.url)
    url = f"file://{root}/checkpoints/{CID}/{manifest}"
    what = {"config": "configuration record", "critic": "critic-identity record"}[record]
    assert f"collection {CID}: its {what} {url} is missing while 12 step(s) of it are saved" in line, line
    assert "restore the file" in line and "collect under a new collection id" in line, line
    assert f"remove file://{root}/checkpoints/{CID} to start" in line, line
    assert contents(root) == before  # nothing lost, nothing written
    if record == "config":  # another configuration is refused the same way, not resumed under it
        other = config(str(root), local_model_server.url).with_updates(seed=14)
        with pytest.raises(RecordMissing):
            run_collect(other)
        assert contents(root) == before
    shutil.copy(finished[0] / "checkpoints" / CID / manifest, root / "checkpoints" / CID / manifest)
    out = run_collect(config(str(root), local_model_server.url))
    assert_finished_batch(out, finished)
    assert out["stats"]["steps_reused"] == 12  # the configuration check and the 11 steps of the search


@pytest.mark.parametrize("record", ["config", "critic"])
@pytest.mark.needs("torch")  # the finished collection's critic is a LocalCritic
def test_a_damaged_record_says_to_restore_it_not_to_compute_it_again(record, finished, local_model_server, tmp_path):
    """A record's data file garbled (its manifest kept): the store's own line would say
    to remove the manifest and rerun to compute it again, which for a record leads to the
    missing-record line; the rerun says to restore it, and removes nothing."""
    root = copy_without(finished, tmp_path, *EXPORT)
    (data,) = (root / "checkpoints" / CID).glob(MANIFESTS[record].replace(".manifest.json", ".*.pkl"))
    data.write_bytes(b"garbled" + data.read_bytes()[7:])
    before = contents(root)
    line = refusal(root, local_model_server.url)
    what = {"config": "configuration record", "critic": "critic-identity record"}[record]
    assert f"collection {CID}: its {what} is damaged (file://{data}: " in line, line
    assert "checksum differs" in line and "restore it" in line and "compute it again" not in line, line
    assert contents(root) == before


@pytest.mark.needs("torch")  # the finished collection's critic is a LocalCritic
def test_a_finished_collection_without_its_configuration_record_is_refused(finished, local_model_server, tmp_path):
    """The batch is there and checks out: a rerun used to save the configuration it met
    and report the old batch as that configuration's. Now it stops the same way."""
    root = copy_without(finished, tmp_path, MANIFESTS["config"], batch=True)
    before = contents(root)
    line = refusal(root, local_model_server.url)
    assert f"its configuration record file://{root}/checkpoints/{CID}/{MANIFESTS['config']} is missing" in line
    assert contents(root) == before


@pytest.mark.needs("torch")  # the finished collection's critic is a LocalCritic
def test_a_store_removed_under_its_run_says_so_and_to_start_over_exit_2(finished, local_model_server, tmp_path):
    """What a store removed while a run wrote it leaves (``rm -rf runs`` mid-run: the run
    recreated the folders and saved its later steps): no configuration record, no
    critic identity, no evidence, later steps. The rerun said the configuration record
    was missing and to restore it, exit 1; the store was removed or is incomplete, and
    the way on is to start over elsewhere, exit 2."""
    root = copy_without(finished, tmp_path, *MANIFESTS.values(), *EXPORT, "n-evidence-w00000.manifest.json")
    before = contents(root)
    cfg = config(str(root), local_model_server.url)
    with pytest.raises(StoreIncomplete) as stopped:
        run_collect(cfg, CheckpointJournal(cfg))
    line = one_line(stopped.value)
    assert exit_code(stopped.value) == 2 and "\n" not in line, line
    assert line.startswith(
        f"collection {CID}: the store file://{root} is incomplete: file://{root}/checkpoints/{CID} holds "
    ), line
    assert "but not its configuration record, its critic's identity or its evidence" in line, line
    assert line.endswith("start over at a new storage root (--store) or under a new collection id"), line
    assert contents(root) == before  # nothing removed


@pytest.mark.needs("torch")  # the finished collection's critic is a LocalCritic
def test_another_critic_allowed_resumes_without_the_critic_record(finished, local_model_server, tmp_path, caplog):
    """``--allow-policy-change`` allows another critic than the one that started the
    collection, so it allows an unknown one: the line says so, and with it the rerun
    resumes (one warning line) and saves the current critic's identity."""
    root = copy_without(finished, tmp_path, MANIFESTS["critic"], *EXPORT)
    assert "or pass --allow-policy-change" in refusal(root, local_model_server.url)
    cfg = config(str(root), local_model_server.url)
    with caplog.at_level(logging.WARNING, logger="tasks.gaps"):
        out = run_collect(cfg, CheckpointJournal(cfg, allow_policy_change=True))
    assert_finished_batch(out, finished)
    (warned,) = [r.getMessage() for r in caplog.records if r.name == "tasks.gaps"]
    assert f"its critic-identity record file://{root}/checkpoints/{CID}/" in warned and "as allowed" in warned
    first = CheckpointJournal(config(str(finished[0]), local_model_server.url)).load(CRITIC_KEY)
    assert CheckpointJournal(cfg).load(CRITIC_KEY) == first  # the same critic, as it happens


class StopAtFirstStep(CheckpointJournal):
    """A run that dies when its loop asks for the first step: both records saved, no step."""

    async def recorded(self, step):  # type: ignore[no-untyped-def]
        raise Stopped(f"stopped before {step}")


@pytest.mark.needs("torch")  # the finished collection's critic is a LocalCritic
def test_a_first_run_stopped_before_any_step_reruns_as_new(finished, local_model_server, tmp_path):
    """A first run killed after its records and before its first step, or between its
    two records (the critic's not saved yet), leaves no step: the rerun saves what is
    missing and collects the finished collection's batch."""
    for name, drop in [("both", None), ("config-only", MANIFESTS["critic"])]:
        root = tmp_path / name
        cfg = config(str(root), local_model_server.url)
        with pytest.raises(Stopped):
            run_collect(cfg, StopAtFirstStep(cfg))
        folder = root / "checkpoints" / CID
        assert sorted(p.name for p in folder.glob("*.manifest.json")) == sorted(MANIFESTS.values())
        if drop:
            (folder / drop).unlink()
        out = run_collect(cfg)
        assert_finished_batch(out, finished)
        assert out["stats"]["steps_reused"] == 1  # the configuration check alone


@pytest.mark.needs("torch")  # the finished collection's critic is a LocalCritic
def test_on_s3_a_missing_configuration_record_stops_the_rerun(finished, local_model_server, s3_bucket):
    """The same on an object store (moto's S3 on loopback): the line names the s3:// URL
    and every object is still there."""
    import fsspec

    fs = fsspec.filesystem("s3")
    bucket = s3_bucket.removeprefix("s3://")
    fs.put(str(finished[0]) + "/", bucket + "/", recursive=True)
    fs.rm(f"{bucket}/checkpoints/{CID}/{MANIFESTS['config']}")
    before = {p: fs.info(p)["ETag"] for p in fs.find(bucket)}
    line = refusal(s3_bucket, local_model_server.url)  # type: ignore[arg-type]
    assert f"its configuration record {s3_bucket}/checkpoints/{CID}/{MANIFESTS['config']} is missing" in line, line
    fs.invalidate_cache()
    assert {p: fs.info(p)["ETag"] for p in fs.find(bucket)} == before


@pytest.mark.needs("torch")  # the finished collection's critic is a LocalCritic
def test_focus_collect_exits_1_with_the_line_before_anything_starts(finished, tmp_path):
    """``focus collect`` decides it from the store before it starts any service (the
    model URL is a closed port): one line, exit 1, the store untouched."""
    root = copy_without(finished, tmp_path, MANIFESTS["config"], *EXPORT)
    before = contents(root)
    env = {**base_env(tmp_path / "prefect"), "PREFECT_API_URL": f"http://127.0.0.1:{free_port()}/api"}
    argv = ["collect", "--store", str(root), "--collection-id", CID, "--model-url", "http://127.0.0.1:9"]
    done = subprocess.run(
        [sys.executable, "-m", "cli", *argv], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    lines = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
    assert done.returncode == 1 and len(lines) == 1, lines
    assert lines[0].startswith(f"error: collection {CID}: its configuration record file://{os.path.realpath(root)}/")
    assert contents(root) == before
