"""The ``train_loop`` flow (``focus train`` with a Prefect server): collect -> train ->
publish weights -> collect, as Prefect runs.

The loop is :func:`flows.loop.run_loop`, the same one ``focus train`` runs without
Prefect; here its steps are runs the UI shows. Iteration ``i`` runs the ``collect``
flow as a subflow (collection ``<id>-it<i>``, a seed and a task seed derived from the
config's and ``i``, so every iteration draws fresh tasks), then the trainer step named
by ``train.trainer`` as the task run ``train-<i>``: the local trainer
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
``train.eval_tasks`` each version is evaluated on held-out tasks (task run
``eval-v<version>``), once, and recorded as (``eval-n<tasks>``, version); the picture
of held-out success per version is a run artifact as well as a file beside the weights.
"""

from __future__ import annotations

import base64
import contextlib
from typing import Any, cast

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.utilities.annotations import quote

from flows.abandoned import closing_abandoned
from flows.cancel import quiet_cancellation
from flows.collect import collect
from flows.errors import failed_state
from flows.heartbeat import heartbeats
from flows.loop import (
    LoopSteps,
    check,
    eval_config,
    evaluate_body,
    iteration_config,
    run_loop,
    train_body,
)
from flows.loop_progress import LoopProgress, success_points
from flows.preflight import collection_id_for_run, flow_run_name, note_deployment
from flows.report import _artifact_key, run_lines
from flows.trainer_thread import in_daemon_thread
from flows.watch import watched
from tasks.config import FocusConfig
from tasks.config.form import ConfigParameter
from tasks.config.sources import config_at_runtime

__all__ = ["eval_config", "iteration_config", "train_loop", "PrefectSteps"]
_check = check  # the name tests and older callers use


@task(name="train-step", task_run_name="train-{iteration}", cache_policy=NO_CACHE, persist_result=False)
async def train_step(
    config: FocusConfig, base_id: str, iteration: int, batch_url: str, latest: dict[str, Any], report: Any = None
) -> dict[str, Any]:
    """Run the trainer on one batch (or reuse its recorded result); returns a small record."""
    return await in_daemon_thread(train_body, config, base_id, iteration, batch_url, latest, report)


@task(name="evaluate", task_run_name="eval-v{version}", cache_policy=NO_CACHE, persist_result=False)
async def evaluate_step(config: FocusConfig, base_id: str, version: int, report: Any = None) -> dict[str, Any]:
    """One plain rollout on each of ``train.eval_tasks`` held-out tasks with the weights
    ``config`` names (recorded once per version, reused on reruns)."""
    return await evaluate_body(config, base_id, version, report)


class PrefectSteps(LoopSteps):
    """The loop's steps as Prefect runs: each collection a ``collect`` subflow, each
    training and evaluation a task run. The model server starts with the flow (a
    subflow of a finished collection would otherwise start one of its own)."""

    lazy = False

    async def collect(self, cfg: FocusConfig, needs_services: bool) -> dict[str, Any]:
        return await collect(cfg)

    async def train(
        self, cfg: FocusConfig, base: str, i: int, batch_url: str, latest: dict[str, Any], report: Any
    ) -> dict[str, Any]:
        call: Any = train_step  # Prefect's typing does not know that quote() is unwrapped
        return await call(cfg, base, i, batch_url, latest, quote(report))  # type: ignore[no-any-return]

    async def evaluate(self, cfg: FocusConfig, base: str, version: int, report: Any) -> dict[str, Any]:
        call: Any = evaluate_step
        return await call(cfg, base, version, quote(report))  # type: ignore[no-any-return]

    def leased(self, config: FocusConfig) -> contextlib.AbstractAsyncContextManager[None]:
        """Runs of this loop a gone process left ``Running`` are closed (:mod:`flows.abandoned`)."""
        return closing_abandoned(config.collection_id or "train", config.execution.heartbeat_s)


async def publish_success(base: str, records: list[dict[str, Any]], png: bytes | None, url: str | None) -> None:
    """The run's artifacts: held-out success per version, as a table and a picture."""
    from prefect.artifacts import acreate_markdown_artifact, acreate_table_artifact

    points = success_points(records)
    if not points:
        return
    rows = [{"version": v, "held_out_success": s} for v, s in points]
    await acreate_table_artifact(rows, key=_artifact_key(base, "success"), description=f"Train loop {base}")
    if png is not None:
        body = base64.b64encode(png).decode()
        await acreate_markdown_artifact(
            f"### Held-out success per version, train loop {base}\n\n![success](data:image/png;base64,{body})\n\n"
            f"File: `{url}`\n",
            key=_artifact_key(base, "success-plot"),
            description=f"Train loop {base}: held-out success per version",
        )


@flow(name="train_loop", log_prints=True, flow_run_name=flow_run_name, validate_parameters=False)
async def train_loop(config: ConfigParameter = None, allow_config_change: bool = False) -> list[dict[str, Any]]:
    """``train.iterations`` rounds of collect then train; one record per iteration
    (and, with ``train.eval_tasks``, a last record evaluating the final weights).

    Async like :func:`flows.collect.collect`: ``asyncio.run(train_loop(config))``;
    ``config`` is validated here too, after the worker's ``FOCUS_*`` variables.
    ``allow_config_change``: resume with other settings than the recorded iterations
    were made with, from the first iteration not yet begun (:mod:`tasks.loop_settings`).
    """
    log = get_run_logger()
    cid = config.get("collection_id") if isinstance(config, dict) else getattr(config, "collection_id", None)
    try:
        await note_deployment(config, log)
        config = collection_id_for_run(config_at_runtime(config))
        cid = config.collection_id
        log.info("train loop %s", cid)
        progress = LoopProgress(config, enabled=config.progress, log=log)  # off a terminal: lines in the UI
        # heartbeats also close what crashed attempts left Running; a cancel ends with an INFO line
        with quiet_cancellation(), heartbeats(config.execution.heartbeat_s), run_lines():
            run = _loop_and_report(config, progress, allow_config_change)
            return await watched(run, config.execution.prefect_grace_s)
    except Exception as e:  # one line as the state's message and in the log, as the collect flow's
        return cast(list[dict[str, Any]], failed_state(e, log, cid, what="train loop"))  # awaiting it raises


async def _loop_and_report(config: FocusConfig, progress: LoopProgress, allow: bool) -> list[dict[str, Any]]:
    records = await run_loop(config, PrefectSteps(), progress, allow_config_change=allow)
    if progress.picture is not None:
        from storage.weights import WeightStore

        png = WeightStore(config.storage.root).loc.cat(progress.picture, WeightStore(config.storage.root).retry)
        await publish_success(config.collection_id or "train", records, png, progress.picture)
    return records
