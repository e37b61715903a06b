"""train_loop: collect -> train -> collect with a trainer that really updates the
embedded model, whose new weights the flow reloads into the running model server."""

from __future__ import annotations

import asyncio

import pytest

from storage import BatchStore
from tasks.config import load_config

pytestmark = pytest.mark.timeout(240)


def test_train_loop_reloads_trained_weights_into_the_local_model(prefect_api, tmp_path):
    from flows.train_loop import train_loop
    from focus.tinylm.model import weights_version

    cfg = load_config(
        overrides={
            "collection_id": "loop",
            "env.n_tasks": 2,
            "agent.max_steps": 4,
            "agent.sampling.max_tokens": 8,
            "search.phases": [
                {"name": "evidence", "rollouts_per_task": 2},
                {"name": "continue", "transitions": 6, "wave_size": 3, "max_depth": 3},
            ],
            "execution.kind": "local",
            "storage.root": str(tmp_path / "store"),
            "train.iterations": 2,
            "train.trainer": "fixtures.prefect:reinforce_trainer",
            "progress": False,
        },
        environ={},
    )
    records = asyncio.run(train_loop(cfg))
    assert [r["iteration"] for r in records] == [0, 1]
    b0, b1 = (BatchStore(cfg.storage.root).read(r["batch_url"]) for r in records)
    v0 = {r.policy_version for r in b0.actor}
    v1 = {r.policy_version for r in b1.actor}
    trained = records[0]["train"]
    # iteration 1 sampled from the weights the trainer wrote after iteration 0
    assert v1 == {weights_version(trained["weights"])} == {trained["policy_version"]}
    assert v0 != v1 and len(v0) == 1
    assert b1.iteration == 1 and b1.collection_id == "loop-it1"

    # rerunning the loop reuses both collections and both training steps
    again = asyncio.run(train_loop(cfg))
    assert [r["train"]["reused"] for r in again] == [True, True]
    assert [r["stats"]["steps_reused"] == r["stats"]["steps"] for r in again] == [True, True]
