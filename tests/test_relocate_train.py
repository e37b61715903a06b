"""A train loop's store moves too: everything the loop records about itself - its
trainer steps' weights, optimizer state and critic, its collections' batches, its
evaluations - is named relative to the store's root (and the collections' resume
fingerprints name the weight store's files the same way). Copied to another folder, or
to S3 (moto's server on loopback), a finished loop reruns from its records, a loop
extended by an iteration resumes there with the weights the original store would have
produced, and ``focus inspect`` reads it."""

from __future__ import annotations

import asyncio
import json
import shutil

import pytest
from fixtures.loop import TINY_LOOP
from test_relocate import upload
from typer.testing import CliRunner

from storage import CheckpointStore
from storage.weights import WeightStore
from tasks.config import load_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def loop(root: str, iterations: int):
    from test_pipeline_train import LOOP_TOML

    over = {
        "collection_id": "m",
        **TINY_LOOP,
        "storage.root": root,
        "train.iterations": iterations,
        "train.eval_tasks": 2,
        "progress": False,
    }
    from flows.loop import train_direct

    return asyncio.run(train_direct(load_config(LOOP_TOML, overrides=over, environ={})))


def all_reused(records) -> bool:
    trained = [r for r in records if "train" in r]
    return all(r["train"]["reused"] and r["stats"]["steps_reused"] == r["stats"]["steps"] for r in trained) and all(
        r["eval"]["reused"] for r in records
    )


@pytest.mark.needs("torch")  # a LocalCritic
def test_a_train_store_moved_or_copied_to_s3_reruns_resumes_and_inspects(s3_server, s3_bucket, tmp_path):
    a, c = tmp_path / "a", tmp_path / "c"
    first = loop(str(a), 1)
    record = CheckpointStore(str(a)).load("m", "train", 0)
    assert record["weights"] == "weights/m/v000001/policy.pt" and record["state"] == "weights/m/v000001/optimizer.pt"

    shutil.copytree(a, tmp_path / "b")
    shutil.move(tmp_path / "b", c)  # copied, then moved
    again = loop(str(c), 1)
    assert all_reused(again)
    root_c = WeightStore(str(c)).root
    assert again[0]["train"]["weights"] == f"{root_c}/weights/m/v000001/policy.pt"
    assert [r["eval"]["success_rate"] for r in again] == [r["eval"]["success_rate"] for r in first]

    # one more iteration, on the moved store and on the original: the same new version
    here, there = loop(str(a), 2), loop(str(c), 2)
    assert [r["train"]["reused"] for r in there[:2]] == [True, False]
    assert there[1]["train"]["policy_version"] == here[1]["train"]["policy_version"]
    for name in ("policy.pt", "critic.pt", "optimizer.pt"):
        mine, theirs = WeightStore(str(a)), WeightStore(str(c))
        assert mine.read(f"{mine.folder('m', 2)}/{name}") == theirs.read(f"{theirs.folder('m', 2)}/{name}"), name

    s3_root = f"{s3_bucket}/loop"
    upload(s3_server, a, s3_root)
    on_s3 = loop(s3_root, 2)
    assert all_reused(on_s3)
    assert on_s3[1]["train"]["weights"] == f"{s3_root}/weights/m/v000002/policy.pt"
    assert on_s3[1]["batch_url"] == f"{s3_root}/batches/m-it1/iter-000001"
    shown = CliRunner().invoke(__import__("cli.app").app.app, ["inspect", "--json", on_s3[1]["batch_url"]])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.output)["actor_rows"] == here[1]["stats"]["actor_rows"]
