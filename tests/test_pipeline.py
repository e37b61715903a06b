"""The collect flow against a real Prefect server: same batch as Collector.collect(),
idempotent reruns, artifacts, and a clear refusal to resume with another config."""

from __future__ import annotations

import asyncio

import duckdb
import httpx
import pytest

from storage import BatchStore
from tasks.config import FocusConfig, load_config

pytestmark = pytest.mark.timeout(180)


def small_config(root: str, cid: str, **updates) -> FocusConfig:
    return load_config(
        overrides={
            "collection_id": cid,
            "seed": 7,
            "model.kind": "factory",
            "model.factory": "fixtures.digits:digit_policy",
            "env.n_tasks": 3,
            "search.phases": [
                {"name": "evidence", "rollouts_per_task": 2},
                {"name": "continue", "transitions": 24, "wave_size": 4, "max_depth": 6},
            ],
            "execution.kind": "local",
            "storage.root": root,
            "progress": False,
            **updates,
        },
        environ={},
    )


def rows(batch):
    return [
        (
            r.tree_id,
            r.node_id,
            r.edge_id,
            r.turn_index,
            r.prompt_ids,
            r.completion_ids,
            r.logprobs,
            round(r.advantage, 9),
        )
        for r in batch.actor
    ], [(r.tree_id, r.node_id, r.context_ids, round(r.target, 9), r.weight) for r in batch.critic]


def direct_batch(config: FocusConfig):
    policy = config.build_policy()
    agent, tasks = config.build_agent(policy)
    return asyncio.run(config.build_collector(agent).collect(tasks))


def test_flow_batch_equals_direct_collect_and_rerun_reuses(prefect_api, tmp_path):
    from flows.collect import collect

    cfg = small_config(str(tmp_path / "store"), "flow-eq")
    out = asyncio.run(collect(cfg))
    assert out["collection_id"] == "flow-eq" and out["stats"]["steps_reused"] == 0
    batch = BatchStore(cfg.storage.root).read(out["batch_url"])
    assert rows(batch) == rows(direct_batch(cfg))
    assert batch.stats["transitions"] >= 24 and out["stats"]["actor_rows"] == len(batch.actor)
    # The Parquet dataset reads back with DuckDB, with the rows the flow reported.
    path = out["batch_url"].removeprefix("file://")
    n = duckdb.sql(f"select count(*) from read_parquet('{path}/actor/*.parquet')").fetchall()[0][0]
    assert n == len(batch.actor) > 0

    again = asyncio.run(collect(cfg))
    assert again["batch_url"] == out["batch_url"]
    assert again["stats"]["steps_reused"] == again["stats"]["steps"]

    # artifacts: a statistics table and a picture of the trees
    r = httpx.post(
        f"{prefect_api}/artifacts/filter", json={"artifacts": {"key": {"any_": ["flow-eq-stats", "flow-eq-trees"]}}}
    )
    kinds = {a["key"]: a["type"] for a in r.json()}
    assert kinds == {"flow-eq-stats": "table", "flow-eq-trees": "markdown"}
    trees = [a for a in r.json() if a["key"] == "flow-eq-trees"][0]
    assert "data:image/svg+xml;base64,PHN2Zy" in trees["data"]  # "<svg"


def test_resume_with_another_config_is_refused(prefect_api, tmp_path):
    from flows.collect import collect
    from tasks.fingerprint import ResumeMismatch

    root = str(tmp_path / "store")
    cfg = small_config(root, "mismatch", **{"search.phases": [{"name": "evidence", "rollouts_per_task": 1}]})
    asyncio.run(collect(cfg))
    with pytest.raises(ResumeMismatch, match=r"differs in: seed"):
        asyncio.run(collect(cfg.with_updates(seed=8)))
