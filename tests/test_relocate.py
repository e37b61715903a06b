"""A store copied or moved - to another folder, or from a folder to S3 (moto's server on
loopback) - keeps working: a finished collection reruns with nothing to do, one killed
part-way resumes to the batch an uninterrupted run writes (the same Parquet bytes), and
``focus inspect`` reads it. Records in a store name its files relative to its root;
records written before that (absolute URLs) still resolve under the new root."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from fixtures.prefect import base_env
from fixtures.resume import collect_args, crash_at, run_cli

from storage import BatchStore, CheckpointStore

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]


def settings(root: str, url: str, cid: str) -> list[str]:
    """A small collection (2 toy tasks, two continuation waves) against the shared model server."""
    return collect_args(root, url, cid, tasks=2, transitions=24)


def focus(args: list[str], env: dict[str, str], cwd: Path) -> dict:
    return run_cli(args, env, cwd)


def fingerprint(root: str, url: str) -> str:
    return BatchStore(root).verify(url).fingerprint


def upload(s3_server, folder: Path, target: str) -> None:
    """Copy a local store into the bucket, file by file (what `aws s3 cp --recursive` does)."""
    fs = s3_server.filesystem()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        fs.put_file(str(path), f"{target}/{path.relative_to(folder).as_posix()}")


#: The collection of every test here: its finished store is made once (:func:`finished`).
CID = "c1"


@pytest.fixture(scope="module")
def finished(local_model_server, tmp_path_factory) -> tuple[Path, dict]:  # type: ignore[no-untyped-def]
    """(a finished store of collection :data:`CID`, the JSON line of the run that made it),
    for the tests to copy: each moves or edits its own copy (a collection of its own in
    each test cost a run of the command each)."""
    tmp = tmp_path_factory.mktemp("finished")
    return tmp / "store", focus(settings(str(tmp / "store"), local_model_server.url, CID), base_env(tmp / "p"), tmp)


def test_a_finished_store_moved_or_copied_to_s3_reruns_and_inspects(
    local_model_server, s3_server, s3_bucket, finished, tmp_path
):
    env = base_env(tmp_path / "prefect")
    url = local_model_server.url
    made, first = finished
    shutil.copytree(made, tmp_path / "a")
    want = fingerprint(str(tmp_path / "a"), f"{BatchStore(str(tmp_path / 'a')).root}/batches/c1/iter-000000")
    assert want == fingerprint(str(made), first["batch_url"])  # the copy is the store the run wrote

    shutil.copytree(tmp_path / "a", tmp_path / "b")
    shutil.move(tmp_path / "b", tmp_path / "c")  # copied, then moved
    again = focus(settings(str(tmp_path / "c"), url, "c1"), env, tmp_path)
    assert again["already_finished"] is True
    assert again["batch_url"] == f"{BatchStore(str(tmp_path / 'c')).root}/batches/c1/iter-000000"
    assert fingerprint(str(tmp_path / "c"), again["batch_url"]) == want
    shown = focus(["inspect", "--json", again["batch_url"]], env, tmp_path)
    assert shown["actor_rows"] == first["stats"]["actor_rows"]

    s3_root = f"{s3_bucket}/moved"
    upload(s3_server, tmp_path / "a", s3_root)
    on_s3 = focus(settings(s3_root, url, "c1"), env, tmp_path)
    assert on_s3["already_finished"] is True and on_s3["batch_url"] == f"{s3_root}/batches/c1/iter-000000"
    assert fingerprint(s3_root, on_s3["batch_url"]) == want
    assert focus(["inspect", "--json", on_s3["batch_url"]], env, tmp_path)["actor_rows"] == shown["actor_rows"]
    listing = focus(["inspect", "--json", f"{s3_root}/batches/c1"], env, tmp_path)
    assert [r["url"] for r in listing["iterations"]] == [on_s3["batch_url"]]


def test_a_killed_collection_resumes_after_its_store_moved(
    local_model_server, s3_server, s3_bucket, finished, tmp_path
):
    """Killed (SIGKILL) after its second continuation wave, moved to another folder (or
    copied to S3), resumed there: the batch is bit-identical to an uninterrupted run's."""
    env = base_env(tmp_path / "prefect")
    url = local_model_server.url
    made, ref = finished  # the uninterrupted run
    want = fingerprint(str(made), ref["batch_url"])

    # one killed run: copied to S3 first, then moved to another folder (it ran twice, to
    # the same point with the same checkpoints)
    killed = tmp_path / "killed"
    crash_at("saved:1.continue:1", settings(str(killed), url, "c1"), env, tmp_path)
    assert ("1.continue", 1) in CheckpointStore(str(killed)).list("c1")
    for target in ("s3", "folder"):
        if target == "folder":
            root = str(tmp_path / "moved")
            shutil.move(killed, root)
        else:
            root = f"{s3_bucket}/resumed"
            upload(s3_server, killed, root)
        done = focus(settings(root, url, "c1"), env, tmp_path)
        assert done["stats"]["steps_reused"] >= 3, done["stats"]
        assert done["batch_url"] == f"{BatchStore(root).root}/batches/c1/iter-000000"
        assert fingerprint(root, done["batch_url"]) == want, target


def test_a_store_whose_records_hold_absolute_urls_still_reruns_after_a_move(local_model_server, finished, tmp_path):
    """Stores written before records were relative keep the batch's absolute URL in the
    export record; moved, they rerun and inspect all the same."""
    env = base_env(tmp_path / "prefect")
    url = local_model_server.url
    made, first = finished
    shutil.copytree(made, tmp_path / "old")
    store = CheckpointStore(str(tmp_path / "old"))
    record = store.load("c1", "export", 0)
    assert record["batch_url"] == "batches/c1/iter-000000"  # what this version records
    # the record as the previous version wrote it: the absolute URL of the old root
    for f in (tmp_path / "old" / "checkpoints" / "c1").glob("n-export-w00000.*"):
        f.unlink()
    old_url = f"{BatchStore(str(tmp_path / 'old')).root}/batches/c1/iter-000000"
    store.save("c1", "export", 0, {**record, "batch_url": old_url})

    shutil.move(tmp_path / "old", tmp_path / "new")
    again = focus(settings(str(tmp_path / "new"), url, "c1"), env, tmp_path)
    assert again["already_finished"] is True
    assert again["batch_url"] == f"{BatchStore(str(tmp_path / 'new')).root}/batches/c1/iter-000000"
    assert focus(["inspect", "--json", again["batch_url"]], env, tmp_path)["actor_rows"] == first["stats"]["actor_rows"]
