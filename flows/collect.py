"""The ``collect`` flow: one iteration of collection as a Prefect flow run, resumable.

The flow runs :func:`tasks.collect.collect` with a journal that makes each step a task run as it is saved:
``check-config``, ``evidence-rollouts``, ``critic-scoring``, one ``continuation-wave`` per wave (``wave-<phase>-<wave>``)
and ``prepare-export``. A rerun (a retry, the UI, the CLI with the same id) continues from the last saved step.
Services start for the run (:mod:`flows.services`); heartbeats let a watchdog mark a lost node's run ``Crashed``
(:mod:`flows.heartbeat`); a Prefect server gone stops it (:mod:`flows.watch`); a failure is one line (:mod:`flows.errors`),
a cancel an INFO line (:mod:`flows.cancel`), an open schema or dropped stored config a WARNING (``note_deployment``),
the library's operator lines go to its log (:func:`flows.report.run_lines`). Async: Prefect's sync engine waits ~1 s on exit."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar, cast

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.utilities.annotations import quote

from flows.abandoned import ClosesAbandoned
from flows.cancel import quiet_cancellation
from flows.errors import failed_state
from flows.heartbeat import heartbeats
from flows.preflight import ChecksReach, collection_id_for_run, flow_run_name, note_deployment
from flows.progress import CollectionProgress
from flows.report import publish_report, run_lines
from flows.services import services_in_thread
from flows.watch import watched
from focus.journal import Step
from tasks.collect import collect as collect_iteration
from tasks.config import FocusConfig, config_at_runtime
from tasks.config.form import ConfigParameter
from tasks.journal import CheckpointJournal

#: Idempotency lives in the checkpoint store, so it holds across flow runs, retries, UI
#: and CLI reruns alike; Prefect's own result caching would only duplicate it.
_OPTS: dict[str, Any] = {"cache_policy": NO_CACHE, "persist_result": False}
_T = TypeVar("_T")


async def _step(kind: str, phase: int, wave: int, body: Any, *args: Any) -> Any:
    return await asyncio.to_thread(body, *args)  # kind, phase, wave: for the task run's name only


#: The steps that are task runs, by kind, named exactly (Prefect adds hex: ``check-config-1e6``). A wave's scores
#: and a phase's end are saved by the flow itself (a second task run per wave doubled the flow's bookkeeping).
_STEP_TASKS = {
    "config": task(name="check-config", task_run_name="check-config", **_OPTS)(_step),
    "evidence": task(name="evidence-rollouts", task_run_name="evidence-rollouts", **_OPTS)(_step),
    "evidence_scores": task(name="critic-scoring", task_run_name="score-evidence", **_OPTS)(_step),
    "wave": task(name="continuation-wave", task_run_name="wave-{phase}-{wave}", **_OPTS)(_step),
    "export": task(name="prepare-export", task_run_name="prepare-export", **_OPTS)(_step),
}


class PrefectJournal(ClosesAbandoned, ChecksReach, CheckpointJournal):
    """A :class:`~tasks.journal.CheckpointJournal` whose steps are Prefect task runs (each step's blocking body in a
    worker thread; runs a gone process left ``Running`` closed under its lease; unreachable services fail it at once,
    :class:`~flows.preflight.ChecksReach`). Arguments are ``quote``-d: Prefect walked them twice per task run (a third
    of the flow's own CPU)."""

    async def run_step(self, kind: str, step: Step | None, body: Callable[..., _T], *args: Any) -> _T:
        run = _STEP_TASKS.get(kind)
        if run is None:
            return await super().run_step(kind, step, body, *args)
        phase, wave = (step.phase, step.wave) if step is not None else (0, 0)
        call: Any = run  # Prefect's typing does not know that quote() is unwrapped
        result: _T = await call(kind, phase, wave, quote(body), *map(quote, args))
        return result


async def run_collection(config: FocusConfig, allow_policy_change: bool = False) -> dict[str, Any]:
    """The collection with its steps as task runs (await inside a flow), then its artifacts."""
    log = get_run_logger()
    progress = CollectionProgress(config, enabled=config.progress, log=log)
    journal = PrefectJournal(config, on_step=progress.step, allow_policy_change=allow_policy_change)
    with progress:
        result = await collect_iteration(config, journal, execution=progress.execution())
    report: Any = publish_report  # Prefect's typing does not know that quote() is unwrapped
    await report(quote(journal), quote(result))
    log.info("collection %s: %s %s", config.collection_id, journal.batch_said, result["batch_url"])
    return result


@flow(name="collect", log_prints=True, flow_run_name=flow_run_name, validate_parameters=False)
async def collect(config: ConfigParameter = None, allow_policy_change: bool = False) -> dict[str, Any]:
    """Collect one iteration; returns the batch URL and statistics.

    Async: ``asyncio.run(collect(config))``, or ``await`` it in another flow. ``config``
    (a :class:`FocusConfig`, a mapping of the fields to set, or ``None``) is validated
    here, after the worker's ``FOCUS_*`` variables, not by Prefect. A failure raises the
    original error when its message names the cause, else
    :class:`flows.errors.CollectionFailed` with one line that does: the state's message.
    """
    cid = config.get("collection_id") if isinstance(config, dict) else getattr(config, "collection_id", None)
    try:
        await note_deployment(config, get_run_logger())
        cfg = collection_id_for_run(config_at_runtime(config))
        cid = cfg.collection_id
        with quiet_cancellation(), heartbeats(cfg.execution.heartbeat_s), run_lines():
            async with services_in_thread(cfg) as (cfg, _server):
                return await watched(run_collection(cfg, allow_policy_change), cfg.execution.prefect_grace_s)
    except Exception as e:
        return cast(dict[str, Any], failed_state(e, get_run_logger(), cid))  # awaiting it raises
