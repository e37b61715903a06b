"""What a collection's checkpoints take in the store, and that they still resume exactly.

A collection's checkpoints are mostly its waves' rollouts pickled: the repeated
structure of dataclass instances and prompts that extend each other. Stored bare they
took 20-25 times the collection's Parquet batch (benchmarks/README.md, "Checkpoint
size"); now each data file is its pickle compressed with zstd behind a short header
(:func:`storage.checkpoints.encode`) and each manifest is one line. A data file saved
bare, as every earlier version wrote it, still loads, and a store of such files resumes
to the same batch. Real parts: the embedded tiny model server (seeded sampling: its
answers repeat), a local store, moto's S3 on loopback, ``kill -9``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from fixtures.journal import run_collect
from fixtures.prefect import base_env
from fixtures.resume import collect_args, crash_at, mismatches, run_cli

from storage import BatchStore, CheckpointStore, CorruptDataError
from storage import checkpoints as ck
from storage.manifest import FileEntry, Manifest, sha256
from tasks.config import load_config

pytestmark = pytest.mark.timeout(300)

CID = "size"
PHASES = [
    {"name": "evidence", "rollouts_per_task": 2},
    {"name": "continue", "transitions": 60, "wave_size": 4, "max_depth": 6},
]
#: Stored bytes per transition of the collection below (79 transitions, 29 checkpoints):
#: 925 saved bare, 5.0 times its batch; 426 now, 2.3 times, of which the manifests, a
#: line of about 500 bytes per checkpoint, are 43%. The bounds leave room for the few
#: bytes that a run's wall-clock figures change in the compressed files.
BOUND, BATCHES = 600, 3


def config(root: str, url: str):  # type: ignore[no-untyped-def]
    return load_config(
        overrides={
            "collection_id": CID,
            "seed": 3,
            "model.kind": "openai",
            "model.url": url,
            "env.n_tasks": 4,
            "agent.sampling.max_tokens": 16,
            "search.phases": PHASES,
            "critic.kind": "constant",
            "execution.kind": "local",
            "storage.root": root,
            "progress": False,
        },
        environ={},
    )


@pytest.fixture(scope="module")
def finished(local_model_server, tmp_path_factory):
    """(store folder, the collection's result) of the collection run once."""
    root = tmp_path_factory.mktemp("finished") / "store"
    return root, run_collect(config(str(root), local_model_server.url))


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def test_a_collections_checkpoints_take_under_the_bound_per_transition(finished):
    """Fails on the bare store (see :data:`BOUND`)."""
    root, out = finished
    n = int(out["stats"]["transitions"])
    assert n >= 60
    stored = folder_bytes(root / "checkpoints" / CID)
    batch = folder_bytes(root / "batches" / CID)
    assert stored / n < BOUND, (stored / n, stored / batch)
    assert stored < BATCHES * batch, (stored / n, stored / batch)
    waves = sorted((root / "checkpoints" / CID).glob("n-1.continue-w*.pkl"))
    assert len(waves) >= 8 and all(p.read_bytes().startswith(ck.ZSTD_HEADER) for p in waves)
    manifest = (root / "checkpoints" / CID / "n-1.continue-w00000.manifest.json").read_bytes()
    assert b"\n" not in manifest and json.loads(manifest)["info"]["wave"] == 0


def bare_copy(root: Path, dest: Path) -> Path:
    """A copy of the store ``root`` whose checkpoints are saved as every version before
    compression saved them: the bare pickle (:func:`storage.checkpoints.dumps`) named by
    its digest, and an indented manifest."""
    shutil.copytree(root, dest)
    store = CheckpointStore(dest)
    folder = dest / "checkpoints" / CID
    for phase, wave in store.list(CID):
        base = Path(store.url_for(CID, phase, wave).removeprefix("file://"))
        manifest_path = base.with_name(base.name + ".manifest.json")
        old = Manifest.from_json(manifest_path.read_bytes(), str(manifest_path))
        data = ck.dumps(store.load(CID, phase, wave))
        digest = sha256(data)
        (folder / old.files[0].path).unlink()
        name = f"{base.name}.{digest[:16]}.pkl"
        (folder / name).write_bytes(data)
        bare = Manifest(
            "checkpoint", CID, (FileEntry(name, len(data), digest),), digest, created_at=old.created_at, info=old.info
        )
        manifest_path.write_bytes(bare.to_json())
    return dest


def test_checkpoints_saved_bare_as_before_load_and_resume_to_the_same_batch(finished, local_model_server, tmp_path):
    """A store written before compression: each checkpoint loads as it was, and the
    collection, cut after its second wave, resumes to the finished batch bit for bit (its
    new waves saved compressed beside the bare ones)."""
    root, out = finished
    old = bare_copy(root, tmp_path / "old")
    store, new = CheckpointStore(old), CheckpointStore(root)
    keys = store.list(CID)
    for key in keys:
        assert store.load(CID, *key) == new.load(CID, *key), key
    data = sorted((old / "checkpoints" / CID).glob("*.pkl"))
    assert all(p.read_bytes()[:1] == b"\x80" for p in data)
    assert folder_bytes(old / "checkpoints") > 2 * folder_bytes(root / "checkpoints")
    # cut after the second wave's scores: what a run killed there leaves
    store.discard(CID, keys[keys.index(("1.continue.score", 1)) + 1 :])
    shutil.rmtree(old / "batches")
    again = run_collect(config(str(old), local_model_server.url))
    assert again["stats"]["steps_reused"] == 7, again["stats"]
    got, want = BatchStore(str(old)).read(again["batch_url"]), BatchStore(str(root)).read(out["batch_url"])
    assert mismatches(got, want) == {"actor": 0, "critic": 0}
    assert BatchStore(str(old)).manifest(again["batch_url"]).fingerprint == (
        BatchStore(str(root)).manifest(out["batch_url"]).fingerprint
    )
    later = (old / "checkpoints" / CID).glob("n-1.continue-w0000[2-9].*.pkl")
    assert all(p.read_bytes().startswith(ck.ZSTD_HEADER) for p in later)


def cli_settings(root: str, url: str, cid: str) -> list[str]:
    return collect_args(root, url, cid, tasks=3, transitions=40)


@pytest.mark.slow
def test_kill_9_on_s3_resumes_to_the_uninterrupted_batch(local_model_server, s3_bucket, tmp_path):
    """Killed (SIGKILL) right after its second wave's checkpoint went to moto's S3, the
    same command resumes there and writes the uninterrupted local run's Parquet bytes."""
    env = base_env(tmp_path / "prefect")

    def focus(args: list[str]) -> dict:
        return run_cli(args, env, tmp_path)

    url, ref_root, s3_root = local_model_server.url, str(tmp_path / "ref"), f"{s3_bucket}/kill"
    ref = focus(cli_settings(ref_root, url, "k"))
    crash_at("saved:1.continue:1", cli_settings(s3_root, url, "k"), env, tmp_path)
    saved = CheckpointStore(s3_root).list("k")
    assert ("1.continue", 1) in saved and ("export", 0) not in saved
    done = focus(cli_settings(s3_root, url, "k"))
    assert done["stats"]["steps_reused"] >= 4, done["stats"]
    want = BatchStore(ref_root).verify(ref["batch_url"]).fingerprint
    assert BatchStore(s3_root).verify(done["batch_url"]).fingerprint == want


# ---- the encoding alone ----


def test_a_large_checkpoint_is_stored_compressed_and_a_small_one_bare(tmp_path):
    store = CheckpointStore(tmp_path)
    big = {"prompts": [tuple(range(i, i + 200)) for i in range(300)], "text": "Total 7. " * 500}
    path = Path(store.save("c", "w", 0, big).removeprefix("file://"))
    assert path.read_bytes().startswith(ck.ZSTD_HEADER) and path.stat().st_size < len(ck.dumps(big)) / 5
    assert store.load("c", "w", 0) == big
    small = Path(store.save("c", "end", 0, 4).removeprefix("file://"))
    assert small.read_bytes() == ck.dumps(4)  # compressing would make it larger
    assert store.load("c", "end", 0) == 4


def test_a_compressed_file_that_does_not_decompress_is_refused_in_one_line(tmp_path):
    """A file whose checksum matches but whose content does not decode (a writer's bug,
    not damage): the store's line for a damaged checkpoint."""
    store = CheckpointStore(tmp_path)
    url = store.save("c", "w", 0, ["x" * 100] * 50)
    path = Path(url.removeprefix("file://"))
    data = path.read_bytes()
    assert data.startswith(ck.ZSTD_HEADER)
    lying = ck.ZSTD_HEADER + (3).to_bytes(8, "little") + data[len(ck.ZSTD_HEADER) + 8 :]  # says 3 bytes
    manifest = path.parent / (path.name.rsplit(".", 2)[0] + ".manifest.json")
    doc = json.loads(manifest.read_bytes())
    doc["files"][0].update(bytes=len(lying), sha256=sha256(lying))
    manifest.write_text(json.dumps(doc))
    path.write_bytes(lying)
    with pytest.raises(CorruptDataError, match="checksum matches but unpickling failed") as e:
        store.load("c", "w", 0)
    assert "\n" not in str(e.value)
