"""The train loop's iterations, with or without Prefect: evaluate, collect, train, publish.

:func:`run_loop` is the one loop; its steps come from a :class:`LoopSteps`. Without a
Prefect server (``focus train``'s default) they are plain calls (:class:`DirectSteps`:
the collection through :func:`flows.direct.collect_direct`, the trainer in a daemon
thread stopped and joined when the loop is cancelled, the evaluation on the event
loop); the ``train_loop`` flow (:mod:`flows.train_loop`) makes
each a subflow or task run. Both record the same things in the same store, so a loop
started on one path resumes on the other.

What is recorded is never recomputed: a finished collection (its export), a trainer
step (``("train", i)`` in the checkpoint store) and an evaluation (``("eval-n<tasks>",
version)``). On the direct path the embedded model server starts only when a step needs
it (:class:`ModelService`), so a loop whose every step is recorded reruns in the time it
takes to read its records, with no server started at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flows.trainer_thread import in_daemon_thread
from tasks.config import ConfigError, FocusConfig, TrainConfig, TrainContext, TrainResult, import_object

if TYPE_CHECKING:
    from flows.loop_progress import LoopProgress
    from flows.services import Services
    from tasks.loop_settings import LoopSettings

TRAIN_PHASE = "train"
EVAL_PHASE = "eval"
log = logging.getLogger("focus.train")


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


def eval_phase(config: FocusConfig) -> str:
    """The checkpoint phase of an evaluation of ``config`` (from :func:`eval_config`):
    another evaluation size is another evaluation."""
    return f"{EVAL_PHASE}-n{config.env.n_tasks}"


def check(config: FocusConfig) -> None:
    """Refuse a loop that cannot run, before any work."""
    if config.train.trainer == "local" and config.model.kind != "local":
        raise ConfigError(
            f"train.trainer 'local' trains the embedded model, but model.kind is {config.model.kind!r}: "
            "use the 'tinker' trainer or name your own (train.trainer = 'package.module:function')"
        )
    if config.train.trainer == "local":  # the trainer's own check came after the first collection had run
        from tasks.trainers import check_local_sampling

        check_local_sampling(config)
    if config.train.trainer == "tinker" and not (config.train.tinker.base_model or config.model.model):
        # tasks.trainers.tinker_trainer's own check came after the first collection had run
        raise ConfigError("the tinker trainer needs train.tinker.base_model (or model.model): the model to fine-tune")
    import_object(config.train.trainer_path())  # fail before any work if it does not import


# ---- the steps' bodies (training blocks: a daemon thread; the evaluation runs on the loop) ----


def _out_of_room(exc: OSError, workdir: Path, iteration: int) -> OSError | None:
    """A full disk or a file-size limit met by the trainer, as one line naming where it
    wrote and what to do; ``None`` for any other error (and for the store's own, which
    name their file already). A trainer writes its files in its work folder, under the
    temporary folder, before the store gets them: ``Path.write_bytes`` there names no
    file, and the line was ``OSError: [Errno 27] File too large``."""
    from storage.errors import StorageError, StorageFull

    if isinstance(exc, StorageError) or exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return None
    if exc.errno == errno.EFBIG:
        what = (
            "File too large: past the file-size limit, `ulimit -f` of a batch system or a container, "
            "or the file system's largest file"
        )
        todo = "raise the limit"
    else:
        what, todo = "no space left on the device (or quota exceeded)", "free space"
    where = (
        f"{exc.filename}"
        if exc.filename
        else f"in its work folder {workdir} (under the temporary folder: set TMPDIR to move it)"
    )
    return StorageFull(
        f"iteration {iteration}: the trainer cannot write {where} ({what}); {todo}, then rerun to resume: "
        f"the loop trains iteration {iteration} again"
    )


def train_body(
    config: FocusConfig,
    base_id: str,
    iteration: int,
    batch_url: str,
    latest: dict[str, Any],
    report: Callable[..., None] | None = None,
) -> dict[str, Any]:
    """The trainer call (or its recorded result); blocks for as long as training takes.
    The record names the weights relative to the store root (the store can move); the
    returned one names them under this root."""
    import time

    from storage import CheckpointStore
    from storage.temp import user_temp_folder
    from storage.weights import WeightStore
    from tasks.loop_settings import MARK, SETTINGS

    store, weights = CheckpointStore(config.storage.root), WeightStore(config.storage.root)
    if store.exists(base_id, TRAIN_PHASE, iteration):
        return {**located(weights, store.load(base_id, TRAIN_PHASE, iteration)), "reused": True}
    t0 = time.perf_counter()
    trainer = import_object(config.train.trainer_path())
    workdir = user_temp_folder("focus-train") / base_id / f"it{iteration}"
    workdir.mkdir(parents=True, exist_ok=True)
    ctx = TrainContext(
        iteration=iteration,
        config=config,
        weights=latest["weights"],
        policy_version=latest["policy_version"],
        workdir=str(workdir),
        model_url=config.model.url,
        out=weights.folder(base_id, iteration + 1),
        critic=latest["critic"],
        state=latest["state"],
        report=report,
    )
    options = config.train.options if config.train.trainer not in ("local", "tinker") else {}
    from focus.train_local import TrainingDiverged

    try:
        result = trainer(batch_url, ctx, **options)
    except TrainingDiverged as e:  # nothing recorded: a rerun with a smaller step trains again
        raise TrainingDiverged(f"iteration {iteration}: {e}") from None
    except OSError as e:
        full = _out_of_room(e, workdir, iteration)
        if full is None:
            raise
        raise full from e
    if not isinstance(result, TrainResult):
        raise TypeError(f"trainer {config.train.trainer!r} returned {type(result).__name__}, expected TrainResult")
    record = {**asdict(result), "metrics": dict(result.metrics), "wall_s": time.perf_counter() - t0}
    # a rerun tells a lost settings record from a loop made before loops kept one by this
    record[MARK] = store.exists(base_id, SETTINGS, 0)
    store.save(base_id, TRAIN_PHASE, iteration, relative(weights, record))
    return {**record, "reused": False}


#: The fields of a trainer step's record that name files of the weight store.
WEIGHT_FIELDS = ("weights", "critic", "state")


def relative(weights: Any, record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with the weight store's files named relative to its root (others, such
    as ``tinker://`` paths or files elsewhere, as they are)."""
    out = dict(record)
    for k in WEIGHT_FIELDS:
        v = out.get(k)
        if isinstance(v, str) and v:
            with contextlib.suppress(Exception):  # not under the root: kept as it is
                out[k] = weights.ref(v)
    return out


def located(weights: Any, record: dict[str, Any]) -> dict[str, Any]:
    """A stored trainer record with its weight-store files named under this root: those
    recorded relative to the root, and absolute ones (records made before stores were
    relocatable) of a store that has moved since. Others (``tinker://`` paths, a user's
    files elsewhere) stay as they are."""
    out = dict(record)
    for k in WEIGHT_FIELDS:
        v = out.get(k)
        if not isinstance(v, str) or not v or v.startswith("tinker://"):
            continue
        if "://" not in v and not v.startswith("weights/"):
            if Path(v).exists() or "/weights/" not in v:
                continue  # a file outside the store that is still there
            v = "weights/" + v.rpartition("/weights/")[2]
        with contextlib.suppress(Exception):  # not a weight-store file: kept as it is
            out[k] = weights.locate(v)
    return out


async def evaluate_body(
    config: FocusConfig, base_id: str, version: int, report: Callable[[int, int], None] | None = None
) -> dict[str, Any]:
    """One plain rollout on each of ``train.eval_tasks`` held-out tasks with the weights
    ``config`` names (recorded once per version, reused on reruns). ``report(done,
    total)`` hears of each finished episode.

    On the caller's event loop (the store's calls in threads), so a cancelled loop (a
    first Ctrl-C or SIGTERM) cancels the evaluation's rollouts with it. It ran in a daemon
    thread with a loop of its own, which went on calling the model server after the
    command had stopped it: a `focus train` stopped while it evaluated printed the model
    service's outage warning above its last line."""
    from focus.train_local import evaluate
    from storage import CheckpointStore

    store = CheckpointStore(config.storage.root)
    phase = eval_phase(config)
    if await asyncio.to_thread(store.exists, base_id, phase, version):
        return {**await asyncio.to_thread(store.load, base_id, phase, version), "reused": True}
    policy = config.build_policy()
    try:
        agent, tasks = config.build_agent(policy)
        counted: Any = _Counted(agent, len(tasks), report) if report is not None else agent
        result = await evaluate(counted, tasks, config.seed, config.execution.max_concurrency)
    finally:
        await policy.aclose()
    record = {**asdict(result), "policy_version": config.model.policy_version}
    await asyncio.to_thread(store.save, base_id, phase, version, record)
    return {**record, "reused": False}


class _Counted:
    """An agent that reports each finished rollout (the evaluation's progress)."""

    def __init__(self, agent: Any, total: int, report: Callable[[int, int], None]) -> None:
        self._agent, self._total, self._report, self._done = agent, total, report, 0

    async def start(self, task: Any) -> Any:
        return await self._agent.start(task)

    async def rollout(self, *args: Any, **kwargs: Any) -> Any:
        out = await self._agent.rollout(*args, **kwargs)
        self._done += 1
        self._report(self._done, self._total)
        return out


# ---- the model service the loop trains ----


class ModelService:
    """The embedded model server a loop on ``model.kind = "local"`` (without a URL)
    samples from: started with the weights of the version that first needs it (at once
    unless ``lazy``), loaded with each new version as it is published. Steps that need
    no model (recorded ones) get configurations without it; those that do get it named
    by :meth:`ready`."""

    def __init__(self, config: FocusConfig, *, lazy: bool, show: LoopProgress | None = None) -> None:
        self.config, self.lazy, self.show = config, lazy, show
        self.embedded = config.model.kind == "local" and config.model.url is None
        self._stack = contextlib.AsyncExitStack()
        self.services: Services | None = None
        self.updates: dict[str, Any] = {}
        self.loaded: str | None = None
        self.started = False

    async def __aenter__(self) -> ModelService:
        if not self.lazy:
            await self._start(self.config.model.weights)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    def first_version(self) -> str | None:
        """The policy version of the starting weights: the configured one, the started
        server's, or (an embedded server not started yet) computed from the weights file
        as the server computes it."""
        if self.config.model.policy_version is not None:
            return self.config.model.policy_version
        if self.started:
            return self.updates.get("model.policy_version")
        if not self.embedded:
            return None
        from focus.tinylm.arch import DEFAULT_WEIGHTS, weights_version
        from tasks.trainers import local_weights

        return weights_version(local_weights(self.config.model.weights, self.config.storage.root) or DEFAULT_WEIGHTS)

    async def _start(self, weights: str | None) -> None:
        from flows.preflight import unreachable
        from flows.services import Services, services_in_thread
        from tasks.config import ConfigError
        from tasks.trainers import local_weights

        # the first step that needs the model: a URL nothing answers is one line, not an
        # outage waited out for model.http.outage_wait_s (a finished loop never asks)
        if line := await asyncio.to_thread(unreachable, self.config):
            raise ConfigError(line)

        # the embedded server starts from a local file; iterations name the weights by URL
        path = await asyncio.to_thread(local_weights, weights, self.config.storage.root)
        start = self.config.with_updates(**{"model.weights": path})
        what = Services(start).starting_names() if self.show is not None else []
        with self.show.live(f"starting the {' and the '.join(what)}", "") if what and self.show else _nothing():
            cfg, self.services = await self._stack.enter_async_context(services_in_thread(start))
        self.started, self.loaded = True, weights
        for key in ("model.url", "model.policy_version", "execution.address"):
            mine, got = _get(start, key), _get(cfg, key)
            if got != mine:
                self.updates[key] = got

    def apply(self, cfg: FocusConfig) -> FocusConfig:
        """``cfg`` naming the started services (the model's URL, the Dask scheduler)."""
        keep = {k: v for k, v in self.updates.items() if k != "model.policy_version"}
        return cfg.with_updates(**keep) if keep else cfg

    async def ready(self, cfg: FocusConfig, weights: str | None) -> FocusConfig:
        """``cfg`` with the services started and serving ``weights``."""
        if not self.started:
            await self._start(weights)
        return self.apply(cfg)

    async def publish(self, weights: str | None, version: str) -> str:
        """Load a new version into the embedded server, if it runs (else it starts with
        it when a step first needs it); the policy version it serves."""
        server = self.services.model_server if self.services is not None else None
        if server is None or weights is None or weights == self.loaded:
            return version
        from tasks.trainers import local_weights

        path = await asyncio.to_thread(local_weights, weights, self.config.storage.root)
        assert path is not None  # weights that differ from those loaded are never None
        served = await asyncio.to_thread(server.reload, path)
        if served != version:
            log.warning("trainer said policy version %s, the server reports %s", version, served)
        self.loaded = weights
        return served


@contextlib.contextmanager
def _nothing() -> Any:
    yield None


def _get(cfg: FocusConfig, dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


# ---- the loop ----


class LoopSteps:
    """How the loop runs its steps: plain calls (this class), or Prefect runs
    (:class:`flows.train_loop.PrefectSteps`). ``lazy``: start the model server only when
    a step needs it."""

    lazy = True

    async def collect(self, cfg: FocusConfig, needs_services: bool) -> dict[str, Any]:
        if not needs_services:  # finished: its stored result, nothing to start
            from tasks.collect import collect
            from tasks.journal import CheckpointJournal

            return await collect(cfg, CheckpointJournal(cfg))
        from flows.direct import collect_direct

        return await collect_direct(cfg)

    async def train(
        self, cfg: FocusConfig, base: str, i: int, batch_url: str, latest: dict[str, Any], report: Any
    ) -> dict[str, Any]:
        return await in_daemon_thread(train_body, cfg, base, i, batch_url, latest, report)

    async def evaluate(self, cfg: FocusConfig, base: str, version: int, report: Any) -> dict[str, Any]:
        return await evaluate_body(cfg, base, version, report)

    def leased(self, config: FocusConfig) -> contextlib.AbstractAsyncContextManager[None]:
        """Entered once the loop holds its lease, around the loop (nothing here)."""
        return contextlib.nullcontext()


def _collection_finished(cfg: FocusConfig) -> bool:
    from tasks.journal import CheckpointJournal

    return CheckpointJournal(cfg).finished_export() is not None


def _eval_recorded(cfg: FocusConfig, base: str, version: int) -> bool:
    from storage import CheckpointStore

    return CheckpointStore(cfg.storage.root).exists(base, eval_phase(cfg), version)


def _train_recorded(cfg: FocusConfig, base: str, i: int) -> bool:
    from storage import CheckpointStore

    return CheckpointStore(cfg.storage.root).exists(base, TRAIN_PHASE, i)


async def run_loop(
    config: FocusConfig, steps: LoopSteps, progress: LoopProgress | None = None, *, allow_config_change: bool = False
) -> list[dict[str, Any]]:
    """``train.iterations`` rounds of collect then train; one record per iteration (and,
    with ``train.eval_tasks``, a last record evaluating the final weights).

    First the loop's settings are compared with those its recorded iterations were made
    with (:func:`tasks.loop_settings.settle`): other ones are refused, or with
    ``allow_config_change`` apply from the first iteration not yet begun; each iteration
    runs with the settings it began with.

    The loop holds the write lease of its own records (collection ``collection_id``: its
    trainer steps and evaluations) while it runs, so a second ``focus train`` of the same
    loop is refused with :class:`~storage.LeaseHeld`. Without it the second ran beside the
    first, trained the iterations again and wrote their weights and records a second time
    (the same bytes only where training is bit-exact, and twice the work where it is)."""
    from storage import held_lease
    from tasks.loop_settings import settle

    check(config)
    async with held_lease(config.storage.root, config.collection_id or "train"), steps.leased(config):
        settings = await asyncio.to_thread(settle, config, allow_change=allow_config_change)
        try:
            records = await _run_loop(config, steps, progress, settings)
        except BaseException:
            if progress is not None:
                progress.release()  # the reused steps' lines (the log file) and their one line, before the error's
            raise
        await asyncio.to_thread(settings.record, config)  # a loop made before loops recorded their settings
        return records


async def _run_loop(
    config: FocusConfig, steps: LoopSteps, progress: LoopProgress | None, settings: LoopSettings
) -> list[dict[str, Any]]:
    from flows.loop_progress import LoopProgress

    show = progress if progress is not None else LoopProgress(config, enabled=False)
    base = config.collection_id or "train"
    records: list[dict[str, Any]] = []
    async with ModelService(config, lazy=steps.lazy, show=show) as model:
        latest: dict[str, Any] = {
            "weights": config.model.weights,
            "policy_version": await asyncio.to_thread(model.first_version),
            "critic": config.critic.weights,
            "state": None,
        }
        n = config.train.iterations
        for i in range(n + 1):
            record: dict[str, Any] = {"run_id": base, "iteration": i, "policy_version": latest["policy_version"]}
            if config.train.eval_tasks:  # version i: the weights iteration i - 1 trained
                made_with = settings.config_for(config, max(i - 1, 0))
                record["eval"] = await _evaluate(made_with, steps, model, show, base, i, latest)
            if i == n:  # the last record only evaluates the final weights
                if "eval" in record:
                    records.append(record)
                    show.row(record)
                break
            it_cfg = model.apply(iteration_config(settings.config_for(config, i), base, i, latest))
            # the collection does not depend on the train section: leaving it out of the
            # collection's config lets a loop be extended (more iterations) or its trainer
            # retuned and rerun, reusing every finished collection
            coll_cfg = it_cfg.with_updates(train=TrainConfig().model_dump())
            needs = not await asyncio.to_thread(_collection_finished, coll_cfg)
            if needs:
                coll_cfg = await model.ready(coll_cfg, latest["weights"])
            show.stage(i, "collect", coll_cfg.collection_id or "", recorded=not needs)
            out = await steps.collect(coll_cfg, needs)
            recorded = await asyncio.to_thread(_train_recorded, config, base, i)
            if _user_trainer(config) and not recorded:
                it_cfg = await model.ready(it_cfg, latest["weights"])  # a user's trainer may call the model
            with show.training(i, fresh=not recorded) as report:
                trained = await steps.train(it_cfg, base, i, out["batch_url"], latest, report)
            show.trained(i, trained)
            # a trainer that returns no weights or critic leaves them as they were
            latest = {
                "weights": trained["weights"] or latest["weights"],
                "policy_version": trained["policy_version"],
                "critic": trained["critic"] or latest["critic"],
                "state": trained["state"],
            }
            latest["policy_version"] = await model.publish(latest["weights"], latest["policy_version"])
            show.published(i, latest, loaded=model.started)
            log.info(
                "iteration %d: batch %s, trained -> policy version %s", i, out["batch_url"], latest["policy_version"]
            )
            record = {**record, "batch_url": out["batch_url"], "stats": out["stats"], "train": trained}
            records.append(record)
            show.row(record)
    show.finish(records)
    return records


def _user_trainer(config: FocusConfig) -> bool:
    return config.train.trainer not in ("local", "tinker")


async def _evaluate(
    config: FocusConfig,
    steps: LoopSteps,
    model: ModelService,
    show: LoopProgress,
    base: str,
    version: int,
    latest: dict[str, Any],
) -> dict[str, Any]:
    cfg = model.apply(eval_config(config, latest))
    fresh = not await asyncio.to_thread(_eval_recorded, cfg, base, version)
    if fresh:
        cfg = await model.ready(cfg, latest["weights"])
    with show.evaluating(version, cfg.env.n_tasks, fresh) as report:
        result = await steps.evaluate(cfg, base, version, report)
    show.evaluated(version, result)
    return result


async def train_direct(config: FocusConfig, allow_config_change: bool = False) -> list[dict[str, Any]]:
    """The train loop without Prefect (:func:`run_loop` with plain steps): the same
    records in the same store as the ``train_loop`` flow, so either resumes the other;
    the model server starts only if a step needs it."""
    from flows.loop_progress import LoopProgress

    if not config.collection_id:
        raise ValueError("an unorchestrated train loop needs a collection_id")
    show = LoopProgress(config, enabled=config.progress)
    return await run_loop(config, LoopSteps(), show, allow_config_change=allow_config_change)
