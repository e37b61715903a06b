"""What a collection's checkpoints take in the store, and that they still resume exactly.

A collection's checkpoints are mostly its waves' rollouts pickled: the repeated
structure of dataclass instances and prompts that extend each other. Stored bare they
took 20-25 times the collection's Parquet batch (benchmarks/README.md, "Checkpoint
size"); now each data file is its pickle compressed with zstd behind a short header
(:func:`storage.checkpoints.encode`) and each manifest is one short line (format
version 2). A data file saved bare, or a manifest of version 1, as earlier versions
wrote them, still loads, and a store of such files resumes to the same batch. Real
parts: the embedded tiny model server (seeded sampling: its answers repeat), a local
store, moto's S3 on loopback, ``kill -9``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from fixtures.journal import run_collect
from fixtures.prefect import base_env
from fixtures.resume import collect_args, crash_at, mismatches, run_cli

from storage import BatchStore, CheckpointStore, CorruptDataError, ManifestError
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
#: 925 saved bare, 5.0 times its batch; 426 compressed, 2.3 times, of which the
#: manifests, a line of about 500 bytes per checkpoint, were 43%; 357 with short
#: manifests (308 bytes each, 32%), 1.9 times. The bounds leave room for the few bytes
#: that a run's wall-clock figures change in the compressed files.
BOUND, BATCHES = 400, 2.5


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
    # written short: no created_at (the seq is the save's time), no fingerprint (the file's digest), no type
    assert json.loads(manifest)["format_version"] == 2 and len(manifest) < 320, manifest


def old_copy(root: Path, dest: Path, *, bare: bool) -> Path:
    """A copy of the store ``root`` whose checkpoints are saved as earlier versions saved
    them: a version 1 manifest with every field (a time, the object's type), on one line
    as the version before short manifests wrote it, the data file as it is; ``bare``: as
    every version before compression, the bare pickle (:func:`storage.checkpoints.dumps`)
    named by its digest and an indented manifest."""
    shutil.copytree(root, dest)
    store = CheckpointStore(dest)
    folder = dest / "checkpoints" / CID
    for phase, wave in store.list(CID):
        base = Path(store.url_for(CID, phase, wave).removeprefix("file://"))
        manifest_path = base.with_name(base.name + ".manifest.json")
        new = Manifest.from_json(manifest_path.read_bytes(), str(manifest_path))
        obj = store.load(CID, phase, wave)
        name, data = new.files[0].path, (folder / new.files[0].path).read_bytes()
        if bare:
            data = ck.dumps(obj)
            (folder / name).unlink()
            name = f"{base.name}.{sha256(data)[:16]}.pkl"
            (folder / name).write_bytes(data)
        digest, kind = sha256(data), f"{type(obj).__module__}.{type(obj).__qualname__}"
        old = Manifest(
            "checkpoint", CID, (FileEntry(name, len(data), digest),), digest, created_at="2026-12-01T10:00:00+00:00",
            info={**new.info, "type": kind},
        )  # fmt: skip
        manifest_path.write_bytes(old.to_json(compact=not bare))
    return dest


def cut_and_resume(old: Path, url: str) -> tuple[CheckpointStore, dict]:
    """The collection in store ``old`` cut after its second wave's scores (what a run
    killed there leaves, its batch gone too) and run again: (store, the rerun's result)."""
    store = CheckpointStore(old)
    keys = store.list(CID)
    store.discard(CID, keys[keys.index(("1.continue.score", 1)) + 1 :])
    shutil.rmtree(old / "batches")
    return store, run_collect(config(str(old), url))


def same_batch(old: Path, again: dict, root: Path, out: dict) -> None:
    got, want = BatchStore(str(old)).read(again["batch_url"]), BatchStore(str(root)).read(out["batch_url"])
    assert mismatches(got, want) == {"actor": 0, "critic": 0}
    assert BatchStore(str(old)).manifest(again["batch_url"]).fingerprint == (
        BatchStore(str(root)).manifest(out["batch_url"]).fingerprint
    )


def test_checkpoints_saved_bare_as_before_load_and_resume_to_the_same_batch(finished, local_model_server, tmp_path):
    """A store written before compression: each checkpoint loads as it was, and the
    collection, cut after its second wave, resumes to the finished batch bit for bit (its
    new waves saved compressed beside the bare ones)."""
    root, out = finished
    old = old_copy(root, tmp_path / "old", bare=True)
    store, new = CheckpointStore(old), CheckpointStore(root)
    for key in store.list(CID):
        assert store.load(CID, *key) == new.load(CID, *key), key
    data = sorted((old / "checkpoints" / CID).glob("*.pkl"))
    assert all(p.read_bytes()[:1] == b"\x80" for p in data)
    assert folder_bytes(old / "checkpoints") > 2 * folder_bytes(root / "checkpoints")
    store, again = cut_and_resume(old, local_model_server.url)
    assert again["stats"]["steps_reused"] == 7, again["stats"]
    same_batch(old, again, root, out)
    later = (old / "checkpoints" / CID).glob("n-1.continue-w0000[2-9].*.pkl")
    assert all(p.read_bytes().startswith(ck.ZSTD_HEADER) for p in later)


def test_checkpoints_with_full_manifests_as_before_load_and_resume_to_the_same_batch(
    finished, local_model_server, tmp_path
):
    """A store written before short manifests (each a version 1 manifest on one line,
    with a time, a fingerprint and the object's type; the data compressed): each
    checkpoint loads as it was, in the order saved, and the collection, cut after its
    second wave, resumes to the finished batch bit for bit; its new manifests are short."""
    root, out = finished
    old = old_copy(root, tmp_path / "old", bare=False)
    store, new = CheckpointStore(old), CheckpointStore(root)
    assert store.list(CID) == new.list(CID)
    for key in store.list(CID):
        assert store.load(CID, *key) == new.load(CID, *key), key
    manifests = sorted((old / "checkpoints" / CID).glob("*.manifest.json"))
    docs = [json.loads(p.read_bytes()) for p in manifests]
    assert all(d["format_version"] == 1 and "type" in d["info"] and d["created_at"] for d in docs)
    store, again = cut_and_resume(old, local_model_server.url)
    assert again["stats"]["steps_reused"] == 7, again["stats"]
    same_batch(old, again, root, out)
    later = [json.loads(p.read_bytes()) for p in (old / "checkpoints" / CID).glob("n-1.continue-w0000[2-9].man*")]
    assert len(later) >= 2 and all(d["format_version"] == 2 for d in later)
    assert store.latest(CID) == ("export", 0)


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


def test_a_short_manifest_reads_back_whole_and_another_version_is_refused():
    """Written short, a manifest leaves out what repeats another field or holds its
    default, and reads back equal to the full one; one file of several without its
    fingerprint, or a version this reader does not know, is refused in one line."""
    full = Manifest("checkpoint", "c", (FileEntry("a.pkl", 3, "ab" * 32),), "ab" * 32, info={"phase": "x", "wave": 1})
    short = full.to_json(short=True)
    assert json.loads(short) == {
        "format": "focus-manifest", "format_version": 2, "kind": "checkpoint", "collection_id": "c",
        "files": [{"path": "a.pkl", "bytes": 3, "sha256": "ab" * 32}], "info": {"phase": "x", "wave": 1},
    }  # fmt: skip
    assert Manifest.from_json(short, "m") == full == Manifest.from_json(full.to_json(compact=True), "m")
    dated = Manifest("batch", "c", full.files * 2, "f" * 64, schema_version=2, created_at="2026-12-06T00:00:00+00:00")
    assert Manifest.from_json(dated.to_json(short=True), "m") == dated
    doc = json.loads(dated.to_json(short=True))
    del doc["fingerprint"]
    with pytest.raises(ManifestError, match=r"^m: manifest lacks field\(s\) \['fingerprint'\]$"):
        Manifest.from_json(json.dumps(doc).encode(), "m")
    with pytest.raises(ManifestError, match="^m: manifest format version 3, this reader knows 1 and 2$"):
        Manifest.from_json(json.dumps({**doc, "format_version": 3}).encode(), "m")
