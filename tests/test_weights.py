"""Weights that travel: the weight store (memory:// here, any fsspec URL in use) and the
shipped local trainer step, which publishes each version beside the batches and
continues bit for bit from the previous version's weights and optimizer state."""

from __future__ import annotations

import os
import stat
import tempfile
import uuid

import pytest

from storage import BatchStore
from storage.errors import CorruptDataError, PathOutsideRoot
from storage.temp import user_temp_folder
from storage.weights import WeightStore
from tasks.config import TrainContext, load_config


def memory_root() -> str:
    return f"memory://focus-test-{uuid.uuid4().hex[:8]}"


def test_local_copies_use_a_private_folder_of_this_user(tmp_path, monkeypatch):
    """The default cache of local copies is ``<tmp>/focus-weights-<uid>``, mode 0700: it
    was ``<tmp>/focus-weights`` for every user, made by whichever came first, so the
    next user's copy failed (permission denied) or returned a file of the right size
    that another user put there. A folder of that name others can write into is not
    used."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    store = WeightStore(memory_root())
    folder = store.put(store.folder("run", 1), {"policy.pt": b"the stored weights"}, {})
    entry = store.manifest(folder).file("policy.pt")
    planted = f"{entry.sha256[:32]}-policy.pt"
    for shared in ("focus-weights", f"focus-weights-{os.getuid()}"):  # the name before, and now
        (tmp_path / shared).mkdir(mode=0o777)
        os.chmod(tmp_path / shared, 0o777)  # whatever the umask
        (tmp_path / shared / planted).write_bytes(b"another user bytes")  # the same size: 18 bytes
    local = store.local_copy(f"{folder}/policy.pt")
    assert local.read_bytes() == b"the stored weights"
    assert local.parent.name.startswith(f"focus-weights-{os.getuid()}-")  # a fresh private one
    assert stat.S_IMODE(local.parent.stat().st_mode) == 0o700

    (tmp_path / "mine").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "mine"))
    path = user_temp_folder("focus-train")
    assert path == tmp_path / "mine" / f"focus-train-{os.getuid()}" and stat.S_IMODE(path.stat().st_mode) == 0o700
    assert user_temp_folder("focus-train") == path  # the same folder again


def test_weight_store_versions_checks_and_local_copies(tmp_path):
    store = WeightStore(memory_root())
    folder = store.folder("run", 3)
    assert folder == f"{store.root}/weights/run/v000003" and not store.exists("run", 3)
    assert store.put(folder, {"policy.pt": b"abc", "critic.pt": b"xyz"}, {"iteration": 2}) == folder
    assert store.exists("run", 3) and store.manifest(folder).info == {"version": 3, "iteration": 2}
    assert store.read(f"{folder}/policy.pt") == b"abc"
    local = store.local_copy(f"{folder}/policy.pt", cache=tmp_path)
    assert local.read_bytes() == b"abc" and store.local_copy(f"{folder}/policy.pt", cache=tmp_path) == local
    store.loc.fs.pipe_file(store.loc.path(f"{folder}/critic.pt"), b"xyZ")  # corrupted after the fact
    with pytest.raises(CorruptDataError, match="checksum"):
        store.read(f"{folder}/critic.pt")
    with pytest.raises(CorruptDataError, match="no manifest"):
        store.read(f"{store.folder('run', 4)}/policy.pt")
    with pytest.raises(PathOutsideRoot):
        store.folder("../x", 1)
    with pytest.raises(ValueError, match="not a weights version folder"):
        store.put(f"{store.root}/batches/x", {"a": b""})


def _batch(root: str, iteration: int) -> str:
    """A small real batch: the toy task's format, rows with advantages of both signs."""
    from focus.batch import ActorRow, Batch, CriticRow
    from focus.env import Message
    from focus.format import ByteCodec

    codec = ByteCodec()
    prompt = codec.render([Message("user", f"Reach {7 + iteration}. Total 0.")])
    rows, critic = [], []
    for i, (d, adv) in enumerate([("7", 1.0), ("3", -1.0), ("5", 0.4), ("9", -0.3)]):
        rows.append(
            ActorRow(
                "c",
                iteration,
                "t",
                "t#0",
                0,
                i,
                0,
                "v",
                tuple(prompt),
                (ord(d), ByteCodec.EOT),
                (-2.2, -0.01),
                (1, 1),
                adv,
                float(adv > 0),
                "stop",
            )
        )
        critic.append(CriticRow("c", iteration, "t", "t#0", i, tuple(prompt) + (ord(d),), adv / 2, 1.0, 0.0))
    return BatchStore(root).write(Batch("c", iteration, rows, critic, {"transitions": 4}))


def _train_twice(root: str, tmp_path, *, fresh_second: bool = False) -> list:
    from tasks.trainers import local_trainer

    cfg = load_config(
        overrides={
            "collection_id": "w",
            "storage.root": root,
            "critic.kind": "local",
            "critic.options": {"buckets": 64, "hidden": 4, "seed": 1},
            "train.local.rule": "adam",  # the optimizer state it carries is what this checks
            "train.local.target_kl": None,
            "train.local.epochs": 2,
            "train.local.minibatch": 2,
        },
        environ={},
    )
    store = WeightStore(root)
    results = []
    latest = {"weights": None, "policy_version": None, "critic": None, "state": None}
    for i in range(2):
        ctx = TrainContext(
            i,
            cfg,
            latest["weights"],
            latest["policy_version"],
            str(tmp_path / f"w{i}"),
            out=store.folder("w", i + 1),
            critic=latest["critic"],
            state=latest["state"],
        )
        res = local_trainer(_batch(root, i), ctx)
        results.append(res)
        latest = {
            "weights": res.weights,
            "policy_version": res.policy_version,
            "critic": res.critic,
            "state": None if fresh_second else res.state,
        }
    return results


@pytest.mark.slow
@pytest.mark.needs("torch")  # a LocalCritic
def test_local_trainer_publishes_versions_and_is_reproducible(tmp_path):
    from focus.tinylm.model import weights_version

    root = memory_root()
    first = _train_twice(root, tmp_path / "a")
    store = WeightStore(root)
    for i, res in enumerate(first):
        folder = store.folder("w", i + 1)
        assert res.weights == f"{folder}/policy.pt" and res.critic == f"{folder}/critic.pt"
        assert res.state == f"{folder}/optimizer.pt"
        assert weights_version(store.local_copy(res.weights, cache=tmp_path / "cache")) == res.policy_version
        assert res.metrics["critic_fitted"] == 1.0 and res.metrics["train_steps"] == 4.0
    assert first[0].policy_version != first[1].policy_version
    # the same steps again (another store): the same bytes, weights, critic and optimizer state
    root2 = memory_root()
    again = _train_twice(root2, tmp_path / "b")
    for a, b in zip(first, again, strict=True):
        for name in ("weights", "critic", "state"):
            assert WeightStore(root).read(getattr(a, name)) == WeightStore(root2).read(getattr(b, name))
    # the second step without the first's optimizer state differs: the state is what makes resume exact
    fresh = _train_twice(memory_root(), tmp_path / "c", fresh_second=True)
    assert fresh[0].policy_version == first[0].policy_version != fresh[1].policy_version != first[1].policy_version


@pytest.mark.parametrize("damage", ["weights cut", "manifest cut"])
def test_a_damaged_version_in_a_local_store_is_named_with_what_to_do(tmp_path, damage):
    """A version of a local weight store was handed to the model server and the trainer
    unchecked (a ``file://`` URL is a path): a cut ``policy.pt`` stopped ``focus train``
    with `the embedded model server did not start: ... not a tinylm weights file: not a
    torch checkpoint`, a cut manifest with `manifest is not valid JSON` alone. Both are
    now checked against the manifest and name the loop record to remove to train that
    version again (following it gave the uninterrupted loop's weights, bit for bit)."""
    from tasks.trainers import local_weights

    store = WeightStore(str(tmp_path))
    folder = store.put(store.folder("loop", 1), {"policy.pt": b"weights" * 100, "optimizer.pt": b"state"})
    url = f"{folder}/policy.pt"
    assert local_weights(url, str(tmp_path)) == url.removeprefix("file://")  # intact: read in place
    (tmp_path / "outside.pt").write_bytes(b"mine")  # a file of the user's, not of the store: as it is
    assert local_weights(f"file://{tmp_path}/outside.pt", str(tmp_path)) == f"{tmp_path}/outside.pt"
    name = "policy.pt" if damage == "weights cut" else "_manifest.json"
    path = tmp_path / "weights" / "loop" / "v000001" / name
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(CorruptDataError) as err:
        local_weights(url, str(tmp_path))
    record = f"file://{tmp_path}/checkpoints/loop/n-train-w00000.manifest.json"
    assert f"remove {record} and rerun to train that iteration again" in str(err.value), err.value
