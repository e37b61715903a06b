"""Serve the collection deployments (what ``focus deploy`` runs).

Two deployments of the ``collect`` flow are registered with the Prefect server named by
``PREFECT_API_URL`` and served by this process:

* ``collect/scheduled`` runs on a cron schedule; each run gets a fresh, readable
  collection id (``scheduled-<UTC time>-<hex>``, :func:`flows.preflight.new_collection_id`).
* ``collect/manual`` has no schedule; start it from the UI's Run button (Quick run, or
  Custom run to edit its ``config`` parameter) or ``prefect deployment run collect/manual``.

Each may have its own configuration file. A deployment stores only the fields its file
(and ``--set``) name; the ``FOCUS_*`` variables of this process fill in the rest when a
run starts (:func:`tasks.config.config_at_runtime`), exactly as on a worker of the
``prefect.yaml`` path, whose deployments have other names (``pool-scheduled``,
``pool-manual``) so that neither path overwrites the other's.

``limit`` bounds the flow runs this process executes at once: each starts its own
model server (and Dask cluster, if configured), so the default is one. A watchdog
automation (:mod:`deployments.watchdog`) marks a run ``Crashed`` once its heartbeats stop
- the node running it is gone - so the UI offers Retry within a minute instead of
leaving it ``Running``. A Retry re-runs the same flow run, whose collection id is the
same, so it resumes after the last finished wave.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from deployments.outage import patient_polls
from deployments.stopping import Stopped, apart, stopping_runner
from tasks.config import read_file, set_dotted

SCHEDULED = "scheduled"
MANUAL = "manual"


def explicit_config(
    path: str | os.PathLike[str] | None,
    overrides: dict[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """What a deployment stores as its ``config`` parameter: the fields the file and the
    overrides (dotted keys) name, without defaults and without this shell's ``FOCUS_*``
    variables (those apply where and when each run starts).

    Checked as a run served by this process will see it, under this process's
    variables: a field another one needs may come from them (``model.kind = "openai"``
    in the file, ``FOCUS_MODEL__URL`` here), as it may on a run's worker."""
    checked, data = _checked(path, overrides, environ)
    return _named(checked.model_dump(mode="json"), data)


def heartbeat_s(
    path: str | os.PathLike[str] | None,
    overrides: dict[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> float:
    """Seconds between the heartbeats of a run of this deployment served by this process
    (``execution.heartbeat_s`` from the file, the overrides and the variables)."""
    return float(_checked(path, overrides, environ)[0].execution.heartbeat_s)


def _checked(
    path: str | os.PathLike[str] | None, overrides: dict[str, Any] | None, environ: Mapping[str, str] | None
) -> tuple[Any, dict[str, Any]]:
    """The validated configuration a run will see, and the fields the file and overrides name."""
    from tasks.config.sources import Layer, build_config, env_layers

    data = read_file(path) if path is not None else {}
    for key, value in (overrides or {}).items():
        set_dotted(data, key, value)
    source = " and ".join(x for x in (str(path) if path else "", "--set" if overrides else "") if x)
    env, problems = env_layers(os.environ if environ is None else environ)
    return build_config(env + [Layer(source or "the deployment", data)], problems), data


def _named(checked: Any, given: Any) -> Any:
    """The validated values of exactly the fields ``given`` names (tables key by key,
    lists of tables entry by entry)."""
    if isinstance(given, dict) and isinstance(checked, dict):
        return {k: _named(checked[k], v) if k in checked else v for k, v in given.items()}
    if isinstance(given, list) and isinstance(checked, list) and len(given) == len(checked):
        return [_named(c, g) for c, g in zip(checked, given, strict=True)]
    return checked


@dataclass(frozen=True)
class DeploySpec:
    """The two deployments and how this process serves them."""

    scheduled: dict[str, Any] = field(default_factory=dict)
    manual: dict[str, Any] = field(default_factory=dict)
    cron: str = "0 * * * *"
    limit: int = 1
    #: Seconds without a heartbeat before the watchdog marks a run Crashed (0: no watchdog).
    crash_after_s: float = 30.0
    #: A scheduled run due while another run of the scheduled deployment runs: ``queue``
    #: waits for it (Prefect's default; runs longer than the interval pile up, each a new
    #: collection), ``skip`` is cancelled at once (a deployment concurrency limit of 1
    #: with Prefect's ``CANCEL_NEW`` collision strategy).
    overlap: str = "queue"


def build_deployments(spec: DeploySpec) -> list[Any]:
    """The two RunnerDeployments (not yet registered)."""
    from flows.collect import collect

    scheduled = collect.to_deployment(
        name=SCHEDULED,
        cron=spec.cron,
        concurrency_limit=_one_at_a_time() if spec.overlap == "skip" else None,
        parameters={"config": spec.scheduled},
        description="Scheduled collection (one iteration per run, a fresh collection id each).",
        tags=["focus"],
    )
    manual = collect.to_deployment(
        name=MANUAL,
        parameters={"config": spec.manual},
        description="Manual collection: Quick run, or Custom run to edit 'config'.",
        tags=["focus"],
    )
    served: list[Any] = [scheduled, manual]  # to_deployment's typing allows a coroutine; sync here it is none
    for deployment in served:
        deployment._parameter_openapi_schema = _closed(deployment._parameter_openapi_schema)
    return served


def _closed(schema: Any) -> Any:
    """The flow's parameter schema with ``additionalProperties: false``, so the server
    refuses a run that names a parameter the flow does not take when the run is created
    (``409 ... Additional properties are not allowed ('bogus' was unexpected)``), as it
    refuses an unknown ``config`` field. Prefect's schema leaves it open, and such a run
    (``prefect deployment run collect/manual --param bogus=1``, the API) crashed in the
    engine before the flow began: ``Process exited with status code: 1``, the cause only
    in the serving process's console."""
    from prefect.utilities.callables import ParameterSchema

    class ClosedParameterSchema(ParameterSchema):
        additionalProperties: bool = False  # noqa: N815 - the JSON schema's keyword

    return ClosedParameterSchema(**schema.model_dump(exclude_unset=True), additionalProperties=False)


def _one_at_a_time() -> Any:
    """One run of the deployment at a time; a run due while one runs is Cancelled with
    "Deployment concurrency limit reached." (Prefect checks when the run would start,
    and when it would be marked Late)."""
    from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy

    return ConcurrencyLimitConfig(limit=1, collision_strategy=ConcurrencyLimitStrategy.CANCEL_NEW)


def differing(stored: Any, served: Any, prefix: str = "") -> list[str]:
    """Dotted names of the fields whose values differ between two ``config`` parameters
    (a field one of them sets and the other does not included; a list is one field)."""
    if not (isinstance(stored, dict) and isinstance(served, dict)):
        return [prefix.rstrip(".") or "config"] if stored != served else []
    out: list[str] = []
    for key in sorted(set(stored) | set(served), key=str):
        if key not in stored or key not in served:
            out.append(f"{prefix}{key}")
        else:
            out += differing(stored[key], served[key], f"{prefix}{key}.")
    return out


async def edited_on_server(spec: DeploySpec) -> list[str]:
    """One line per deployment of ``spec`` the server already stores with another
    ``config`` than this command registers (edited in the UI or through the API since the
    last ``focus deploy``, or registered from other files): serving replaces it, as
    Prefect's ``serve`` re-registers each deployment whole, and the edit was lost without a
    word. Nothing for a deployment not registered yet."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    lines = []
    async with get_client() as client:
        for name, config in ((SCHEDULED, spec.scheduled), (MANUAL, spec.manual)):
            try:
                stored = await client.read_deployment_by_name(f"collect/{name}")
            except ObjectNotFound:
                continue
            fields = differing((stored.parameters or {}).get("config") or {}, config)
            if fields:
                lines.append(
                    f"deployment collect/{name}: the server's config differs from the one served now in "
                    f"{', '.join(fields)} (edited in the UI or the API?): replaced by this command's; put the "
                    "change in the configuration file (or --set) to keep it"
                )
    return lines


async def served_elsewhere(spec: DeploySpec) -> list[str]:
    """One line per deployment of ``spec`` another process serves now: a second ``focus
    deploy`` of the same deployments, here or on another machine. Both take runs, so a
    run goes to either; and the first of them stopped (Ctrl-C) pauses the deployments for
    the other, whose schedule then stops without a word. Told by the deployment's
    ``last_polled`` moving on while this process has not polled yet: read twice, one and a
    half poll intervals (``PREFECT_RUNNER_POLL_FREQUENCY``, 10 s by default) apart, and
    only when the first read is recent (within three), so a start after a process was
    killed (node loss; it paused nothing) is not taken for one that serves."""
    import asyncio
    from datetime import UTC, datetime

    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_RUNNER_POLL_FREQUENCY

    poll_s = float(PREFECT_RUNNER_POLL_FREQUENCY.value())
    async with get_client() as client:
        first = await _polled(client, served_names(spec))
        recent = {n: t for n, t in first.items() if (datetime.now(UTC) - t).total_seconds() <= 3 * poll_s}
        if not recent:
            return []
        await asyncio.sleep(1.5 * poll_s)
        again = await _polled(client, list(recent))
    return [
        f"deployment {name} is served by another process too (it went on asking the server for runs over "
        f"the last {poll_s * 1.5:g} s): each run goes to one of them, and stopping either pauses the deployment for both "
        "(its schedule stops); stop the other one, or let this one be the only one"
        for name in recent
        if name in again and again[name] > recent[name]
    ]


async def _polled(client: Any, names: list[str]) -> dict[str, Any]:
    """When each of the deployments ``names`` that is registered and not paused last asked for runs."""
    from prefect.exceptions import ObjectNotFound

    out = {}
    for name in names:
        try:
            stored = await client.read_deployment_by_name(name)
        except ObjectNotFound:
            continue
        if not stored.paused and stored.last_polled is not None:
            out[name] = stored.last_polled
    return out


def served_names(spec: DeploySpec) -> list[str]:
    """The deployments ``spec`` serves, as Prefect names them (``flow/deployment``)."""
    return [f"collect/{SCHEDULED}", f"collect/{MANUAL}"]


def serve_deployments(spec: DeploySpec, started: Callable[[], object] | None = None) -> Stopped | None:
    """Register both deployments and the watchdog, call ``started`` (the command's start
    line, after the registration that can fail), then run their flow runs in this process
    (at most ``spec.limit`` at once) until stopped. Prefect's ``serve``, without its
    banner table; why it stopped (:class:`~deployments.stopping.Stopped`: the signal,
    ``SIGINT``, ``SIGTERM`` or ``SIGHUP``, and the runs in progress it cancelled), or
    None. On its stop the runner pauses both deployments (their schedule stops until a
    ``focus deploy`` serves them again: runs due meanwhile would pile up as Late and all
    start then). The flow-run processes do not get a terminal's signals
    (:mod:`deployments.stopping`)."""
    import asyncio
    import signal

    from prefect.exceptions import TerminationSignal

    if spec.crash_after_s > 0:
        from deployments.watchdog import ensure_watchdog

        ensure_watchdog(spec.crash_after_s)
    runner = stopping_runner(spec.limit)
    # in place before the start line, which an operator (or a service manager) answers
    signal.signal(signal.SIGINT, runner.handle_sigint)
    signal.signal(signal.SIGTERM, runner.handle_sigterm)
    if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:  # ignored: nohup, to outlive the terminal
        signal.signal(signal.SIGHUP, runner.handle_sighup)
    for deployment in build_deployments(spec):
        runner.add_deployment(deployment)
    if started is not None:
        started()
    try:
        with apart(), patient_polls():  # a Prefect server outage no longer ends the serving
            asyncio.run(runner.start())
    except KeyboardInterrupt:
        return runner.stopped or Stopped("SIGINT")
    except TerminationSignal as e:
        return Stopped(signal_name(e.signal))
    stopped: Stopped | None = runner.stopped
    return stopped


def signal_name(number: int) -> str:
    import signal

    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
