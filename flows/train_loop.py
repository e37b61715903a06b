"""The ``train_loop`` flow (``focus train``): collect -> train -> publish weights -> collect.

Iteration ``i`` runs the ``collect`` flow as a subflow (collection ``<id>-it<i>``, a
seed and a task seed derived from the config's and ``i``, so every iteration draws
fresh tasks), then the trainer step named by ``train.trainer``: the local trainer
(``tasks.trainers:local_trainer``, the default for the embedded model), the Tinker
trainer (``tinker``) or your own ``package.module:function``. The step publishes the
new version to the weight store under the store root (``weights/<id>/v<i+1>``: policy,
critic, optimizer state), beside the batches. The embedded model server started for
the run then loads the new policy weights (``POST /update_weights_from_disk``, no
restart) and the next collection samples from them, scored by the new critic; with
Tinker the next collection samples from the new ``tinker://`` path through a fresh
sampling client. Each batch row records the policy version that sampled it.

Everything is resumable. A collection resumes from its checkpoints; a finished trainer
step is recorded in the checkpoint store as (``train``, i) and never recomputed; an
interrupted one is recomputed from the previous version's weights and optimizer state,
so a loop killed at any point and run again with the same id ends with the same
weights as one that never stopped (``tests/test_train_resume.py``). With
``train.eval_tasks`` each version is evaluated on held-out tasks, once, and recorded
as (``eval-n<tasks>``, version).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import tempfile
import threading
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from flows.collect import collect
from flows.preflight import collection_id_for_run
from flows.services import services_in_thread
from tasks.config import ConfigError, FocusConfig, TrainConfig, TrainContext, TrainResult, import_object
from tasks.config.form import ConfigParameter
from tasks.config.sources import config_at_runtime

_T = TypeVar("_T")
TRAIN_PHASE = "train"
EVAL_PHASE = "eval"


def iteration_config(config: FocusConfig, base: str, i: int, latest: dict[str, Any]) -> FocusConfig:
    """The collection config of iteration ``i``: its own id, seeds derived from the
    config's, and the latest weights, policy version and critic (pure)."""
    from focus.agent import derive_seed

    updates: dict[str, Any] = {
        "collection_id": f"{base}-it{i}",
        "iteration": i,
        "seed": derive_seed("train-loop", config.seed, i),
        "env.task_seed": derive_seed("train-loop-tasks", config.env.task_seed, i),
        "model.weights": latest["weights"],
        "model.policy_version": latest["policy_version"],
    }
    if config.critic.kind == "local":
        updates["critic.weights"] = latest["critic"]
    return config.with_updates(**updates)


@task(name="train-step", task_run_name="train-{iteration}", cache_policy=NO_CACHE, persist_result=False)
async def train_step(
    config: FocusConfig, base_id: str, iteration: int, batch_url: str, latest: dict[str, Any]
) -> dict[str, Any]:
    """Run the trainer on one batch (or reuse its recorded result); returns a small record."""
    return await in_daemon_thread(_train_step, config, base_id, iteration, batch_url, latest)


async def in_daemon_thread(fn: Callable[..., _T], *args: Any) -> _T:
    """``fn(*args)`` in a daemon thread of its own (with this context, as
    ``asyncio.to_thread``): training blocks for as long as it takes, and an interrupted
    loop must be able to exit without waiting for it, which the event loop's executor
    would (its shutdown joins every thread). What the trainer leaves unfinished is not
    recorded, so a rerun trains that iteration again."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[_T] = loop.create_future()
    ctx = contextvars.copy_context()

    def settle(out: Any, error: BaseException | None) -> None:
        if done.done():
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(out)

    def run() -> None:
        out, error = None, None
        try:
            out = ctx.run(fn, *args)
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting task
            error = e
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits any more
            loop.call_soon_threadsafe(settle, out, error)

    threading.Thread(target=run, name=f"focus-{fn.__name__}", daemon=True).start()
    return await done


def _train_step(
    config: FocusConfig, base_id: str, iteration: int, batch_url: str, latest: dict[str, Any]
) -> dict[str, Any]:
    """The trainer call, in a worker thread: it blocks for as long as training takes."""
    import time

    from storage import CheckpointStore
    from storage.weights import WeightStore

    store = CheckpointStore(config.storage.root)
    if store.exists(base_id, TRAIN_PHASE, iteration):
        return {**store.load(base_id, TRAIN_PHASE, iteration), "reused": True}
    t0 = time.perf_counter()
    trainer = import_object(config.train.trainer_path())
    workdir = Path(tempfile.gettempdir()) / "focus-train" / base_id / f"it{iteration}"
    workdir.mkdir(parents=True, exist_ok=True)
    ctx = TrainContext(
        iteration=iteration,
        config=config,
        weights=latest["weights"],
        policy_version=latest["policy_version"],
        workdir=str(workdir),
        model_url=config.model.url,
        out=WeightStore(config.storage.root).folder(base_id, iteration + 1),
        critic=latest["critic"],
        state=latest["state"],
    )
    options = config.train.options if config.train.trainer not in ("local", "tinker") else {}
    result = trainer(batch_url, ctx, **options)
    if not isinstance(result, TrainResult):
        raise TypeError(f"trainer {config.train.trainer!r} returned {type(result).__name__}, expected TrainResult")
    record = {**asdict(result), "metrics": dict(result.metrics), "wall_s": time.perf_counter() - t0}
    store.save(base_id, TRAIN_PHASE, iteration, record)
    return {**record, "reused": False}


@task(name="evaluate", task_run_name="eval-v{version}", cache_policy=NO_CACHE, persist_result=False)
async def evaluate_step(config: FocusConfig, base_id: str, version: int) -> dict[str, Any]:
    """One plain rollout on each of ``train.eval_tasks`` held-out tasks with the weights
    ``config`` names (recorded once per version, reused on reruns)."""
    return await in_daemon_thread(_evaluate, config, base_id, version)


def _evaluate(config: FocusConfig, base_id: str, version: int) -> dict[str, Any]:
    from focus.train_local import evaluate
    from storage import CheckpointStore

    store = CheckpointStore(config.storage.root)
    phase = f"{EVAL_PHASE}-n{config.env.n_tasks}"  # another evaluation size is another evaluation
    if store.exists(base_id, phase, version):
        return {**store.load(base_id, phase, version), "reused": True}

    async def run() -> Any:
        policy = config.build_policy()
        try:
            agent, tasks = config.build_agent(policy)
            return await evaluate(agent, tasks, config.seed, config.execution.max_concurrency)
        finally:
            await policy.aclose()

    record = {**asdict(asyncio.run(run())), "policy_version": config.model.policy_version}
    store.save(base_id, phase, version, record)
    return {**record, "reused": False}


def eval_config(config: FocusConfig, latest: dict[str, Any]) -> FocusConfig:
    """The held-out evaluation of the latest weights: ``train.eval_tasks`` tasks and
    rollout seeds derived from the loop's, the same for every version (pure)."""
    from focus.agent import derive_seed

    return config.with_updates(
        **{
            "seed": derive_seed("train-loop-eval", config.seed),
            "env.n_tasks": config.train.eval_tasks,
            "env.task_seed": derive_seed("train-loop-eval-tasks", config.env.task_seed),
            "model.weights": latest["weights"],
            "model.policy_version": latest["policy_version"],
        }
    )


def _check(config: FocusConfig) -> None:
    if config.train.trainer == "local" and config.model.kind != "local":
        raise ConfigError(
            f"train.trainer 'local' trains the embedded model, but model.kind is {config.model.kind!r}: "
            "use the 'tinker' trainer or name your own (train.trainer = 'package.module:function')"
        )
    import_object(config.train.trainer_path())  # fail before any work if it does not import


@flow(name="train_loop", log_prints=True)
async def train_loop(config: ConfigParameter = None) -> list[dict[str, Any]]:
    """``train.iterations`` rounds of collect then train; one record per iteration
    (and, with ``train.eval_tasks``, a last record evaluating the final weights).

    Async like :func:`flows.collect.collect`: ``asyncio.run(train_loop(config))``.
    """
    from tasks.trainers import local_weights

    config = collection_id_for_run(config_at_runtime(config))
    _check(config)
    log = get_run_logger()
    base = config.collection_id or "train"
    # the embedded server starts from a local file; iterations name the weights by URL
    start = config.with_updates(**{"model.weights": local_weights(config.model.weights, config.storage.root)})
    records: list[dict[str, Any]] = []
    async with services_in_thread(start) as (cfg, services):
        server = services.model_server
        cfg = cfg.with_updates(**{"model.weights": config.model.weights})
        latest: dict[str, Any] = {
            "weights": cfg.model.weights,
            "policy_version": cfg.model.policy_version,
            "critic": cfg.critic.weights,
            "state": None,
        }
        loaded = latest["weights"]
        n = cfg.train.iterations
        for i in range(n + 1):
            record: dict[str, Any] = {"run_id": base, "iteration": i, "policy_version": latest["policy_version"]}
            if cfg.train.eval_tasks:
                record["eval"] = await evaluate_step(eval_config(cfg, latest), base, i)
            if i == n:  # the last record only evaluates the final weights
                if "eval" in record:
                    records.append(record)
                break
            it_cfg = iteration_config(cfg, base, i, latest)
            # the collection does not depend on the train section: leaving it out of the
            # collection's config lets a loop be extended (more iterations) or its trainer
            # retuned and rerun, reusing every finished collection
            out = await collect(it_cfg.with_updates(train=TrainConfig().model_dump()))
            trained = await train_step(it_cfg, base, i, out["batch_url"], latest)
            # a trainer that returns no weights or critic leaves them as they were
            latest = {
                "weights": trained["weights"] or latest["weights"],
                "policy_version": trained["policy_version"],
                "critic": trained["critic"] or latest["critic"],
                "state": trained["state"],
            }
            if server is not None and latest["weights"] != loaded:
                path = await asyncio.to_thread(local_weights, latest["weights"], cfg.storage.root)
                assert path is not None  # weights that differ from those loaded are never None
                served = await asyncio.to_thread(server.reload, path)
                if served != trained["policy_version"]:
                    log.warning(
                        "trainer said policy version %s, the server reports %s", trained["policy_version"], served
                    )
                latest["policy_version"], loaded = served, latest["weights"]
            log.info(
                "iteration %d: batch %s, trained -> policy version %s", i, out["batch_url"], latest["policy_version"]
            )
            records.append({**record, "batch_url": out["batch_url"], "stats": out["stats"], "train": trained})
    return records
