"""The ``train_loop`` flow: collect -> train -> collect ..., with a pluggable trainer.

Each iteration runs the ``collect`` flow as a subflow with collection id
``<id>-it<i>``, then calls the trainer step named by ``train.trainer`` (an import path
of ``f(batch_url, TrainContext) -> TrainResult``). When the trainer returns a weights
file and the model is the embedded one, the flow reloads it into the running model
server, so the next iteration samples from the new policy (and its batch records the
new policy version). For a remote model service the trainer itself updates the service
and returns the version it now serves.

Each trainer result is saved to the checkpoint store as ("train", i): rerunning the
loop with the same id skips finished collections and finished training steps, and
reloads the last weights before continuing.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from flows.collect import collect, collection_id_for_run, services_in_thread
from tasks.config import ConfigError, FocusConfig, TrainContext, TrainResult, import_object

TRAIN_PHASE = "train"


@task(name="train-step", task_run_name="train-{iteration}", cache_policy=NO_CACHE, persist_result=False)
async def train_step(
    config: FocusConfig, base_id: str, iteration: int, batch_url: str, weights: str | None, version: str | None
) -> dict[str, Any]:
    """Run the trainer on one batch (or reuse its saved result); returns a small record."""
    return await asyncio.to_thread(_train_step, config, base_id, iteration, batch_url, weights, version)


def _train_step(
    config: FocusConfig, base_id: str, iteration: int, batch_url: str, weights: str | None, version: str | None
) -> dict[str, Any]:
    """The trainer call, in a worker thread: it blocks for as long as training takes."""
    from storage import CheckpointStore

    store = CheckpointStore(config.storage.root)
    if store.exists(base_id, TRAIN_PHASE, iteration):
        return {**store.load(base_id, TRAIN_PHASE, iteration), "reused": True}
    trainer = import_object(config.train.trainer or "")
    workdir = Path(tempfile.gettempdir()) / "focus-train" / base_id / f"it{iteration}"
    workdir.mkdir(parents=True, exist_ok=True)
    ctx = TrainContext(iteration, config, weights, version, str(workdir), config.model.url)
    result = trainer(batch_url, ctx, **config.train.options)
    if not isinstance(result, TrainResult):
        raise TypeError(f"trainer {config.train.trainer!r} returned {type(result).__name__}, expected TrainResult")
    record = {"policy_version": result.policy_version, "weights": result.weights, "metrics": dict(result.metrics)}
    store.save(base_id, TRAIN_PHASE, iteration, record)
    return {**record, "reused": False}


@flow(name="train_loop", log_prints=True)
async def train_loop(config: FocusConfig | None = None) -> list[dict[str, Any]]:
    """``train.iterations`` rounds of collect then train; one record per iteration.

    Async like :func:`flows.collect.collect`: ``asyncio.run(train_loop(config))``.
    """
    config = collection_id_for_run(config or FocusConfig())
    if not config.train.trainer:
        raise ConfigError("train.trainer is not set: name a trainer step 'module:function' (see docs/pipeline.md)")
    import_object(config.train.trainer)  # fail before any work if it does not import
    log = get_run_logger()
    base = config.collection_id or "train"
    records: list[dict[str, Any]] = []
    async with services_in_thread(config) as (cfg, server):
        weights, version = cfg.model.weights, cfg.model.policy_version
        for i in range(cfg.train.iterations):
            it_cfg = cfg.with_updates(
                collection_id=f"{base}-it{i}",
                iteration=i,
                **{"model.weights": weights, "model.policy_version": version},
            )
            out = await collect(it_cfg)
            trained = await train_step(it_cfg, base, i, out["batch_url"], weights, version)
            if trained["weights"] and server is not None:
                version = await asyncio.to_thread(server.reload, trained["weights"])
                weights = trained["weights"]
            else:
                version, weights = trained["policy_version"], trained["weights"] or weights
            log.info("iteration %d: batch %s, trained -> policy version %s", i, out["batch_url"], version)
            records.append({"iteration": i, "batch_url": out["batch_url"], "stats": out["stats"], "train": trained})
    return records
