"""``focus deploy``: register and serve the collection deployments (:mod:`deployments.serve`)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli.common import Console, DebugOpt, SetOpt, fail, help_default, overrides
from cli.interrupts import serving
from flows.errors import one_line, prefect_unanswered
from tasks.config import ConfigError

if TYPE_CHECKING:
    from deployments.serve import DeploySpec

ConfigsOpt = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="Configuration of both deployments (TOML or YAML).", metavar="PATH"),
]
ScheduledOpt = Annotated[
    Path | None,
    typer.Option(help=help_default("Configuration of the scheduled deployment only.", "--config"), metavar="PATH"),
]
ManualOpt = Annotated[
    Path | None,
    typer.Option(help=help_default("Configuration of the manual deployment only.", "--config"), metavar="PATH"),
]
CronOpt = Annotated[str, typer.Option(help="Schedule of the scheduled deployment.", metavar="CRON")]
LimitOpt = Annotated[
    int, typer.Option(help="Most flow runs at once in this process (each starts its own model server).", metavar="N")
]
CrashAfterOpt = Annotated[
    float,
    typer.Option(
        help="Mark a run Crashed after this many seconds without a heartbeat (node loss; at least 10); "
        "0 installs no watchdog.",
        metavar="SECONDS",
    ),
]
OverlapOpt = Annotated[
    str,
    typer.Option(
        help="A scheduled run due while another scheduled run runs: 'queue' waits for it (runs longer than "
        "the interval pile up, each a new collection), 'skip' cancels it at once.",
        metavar="MODE",
    ),
]
WatchdogOnlyOpt = Annotated[
    bool,
    typer.Option(
        "--watchdog-only",
        help="Only install (or update) the watchdog automation, then exit: for deployments a work pool "
        "serves (deployments/prefect.yaml).",
    ),
]
WorkPoolOpt = Annotated[
    bool,
    typer.Option(
        "--work-pool",
        help="Only set the server up for the deployments of deployments/prefect.yaml, then exit: close their "
        "parameter schemas (prefect deploy leaves them open) and install the watchdog. Run after every prefect deploy.",
    ),
]


def deploy(
    config: ConfigsOpt = None,
    scheduled_config: ScheduledOpt = None,
    manual_config: ManualOpt = None,
    cron: CronOpt = "0 * * * *",
    limit: LimitOpt = 1,
    crash_after: CrashAfterOpt = 30.0,
    overlap: OverlapOpt = "queue",
    watchdog_only: WatchdogOnlyOpt = False,
    work_pool: WorkPoolOpt = False,
    sets: SetOpt = None,
    debug: DebugOpt = False,
) -> None:
    """Register and serve the scheduled and the manual collection deployments (needs a Prefect server).

    The deployments store only what the configuration files and --set name; FOCUS_*
    variables of this process apply when each run starts (docs/pipeline.md).
    """
    from flows.server import configured_api_url

    api = configured_api_url()
    if not api:
        fail("focus deploy needs a Prefect server: set PREFECT_API_URL (e.g. after 'prefect server start')")
    if limit < 1:
        fail("--limit must be at least 1")
    if overlap not in ("queue", "skip"):
        fail(f"--overlap must be 'queue' or 'skip', got {overlap!r}")
    if watchdog_only and work_pool:
        fail("--watchdog-only and --work-pool exclude each other (--work-pool installs the watchdog too)")
    if 0 < crash_after < 10 or (watchdog_only and crash_after == 0):
        fail("--crash-after must be 0 (no watchdog) or at least 10 seconds (Prefect's shortest proactive trigger)")
    from deployments.pool import close_schemas
    from deployments.serve import DeploySpec, serve_deployments
    from deployments.watchdog import ensure_watchdog

    spec = DeploySpec(cron=cron, limit=limit, crash_after_s=crash_after, overlap=overlap)
    if not (watchdog_only or work_pool):  # what this process would serve, checked before anything is registered
        spec = served(spec, scheduled_config or config, manual_config or config, overrides(sets))
    out = Console(0, debug, None, "deploy")
    unanswered = server_unanswered(api)
    if unanswered:
        fail(prefect_unanswered(api, unanswered, then="run focus deploy again"), code=1)
    if watchdog_only or work_pool:
        try:
            closed = asyncio.run(close_schemas()) if work_pool else []
            auto = ensure_watchdog(crash_after) if crash_after > 0 else None
        except Exception as e:  # noqa: BLE001 - every error becomes one line
            out.fail(e)
        for name in closed:
            typer.echo(
                f"deployment {name}: parameter schema closed (a run naming a parameter the flow lacks is refused)"
            )
        if auto is not None:
            typer.echo(f"automation {auto.name!r} ({auto.id}): Crashed after {crash_after:g} s without a heartbeat")
        return
    from deployments.serve import edited_on_server

    with contextlib.suppress(Exception):  # a notice: a failed read is the registration's to report
        for line in asyncio.run(edited_on_server(spec)):
            typer.secho(f"warning: {line}", fg=typer.colors.YELLOW, err=True)
    serving()  # Prefect's serve stops on Ctrl-C its own way (before: one line, cli.entry)
    try:
        serve_deployments(spec)
    except Exception as e:  # noqa: BLE001 - every error becomes one line
        out.fail(e)


def served(spec: DeploySpec, scheduled: Path | None, manual: Path | None, over: dict[str, Any]) -> DeploySpec:
    """``spec`` with the configuration each deployment stores; exits with one line on a
    bad configuration, or when the watchdog's ``--crash-after`` allows less than two of
    a run's heartbeat intervals of silence (it would mark healthy runs Crashed)."""
    from dataclasses import replace

    from deployments.serve import explicit_config, heartbeat_s
    from deployments.watchdog import too_soon

    try:
        spec = replace(spec, scheduled=explicit_config(scheduled, over), manual=explicit_config(manual, over))
        beat = max(heartbeat_s(scheduled, over), heartbeat_s(manual, over))
    except ConfigError as e:
        fail(one_line(e))
    if why := too_soon(spec.crash_after_s, beat):
        fail(why)
    return spec


def server_unanswered(api: str, timeout_s: float = 5.0) -> str | None:
    """Why the Prefect server at ``api`` gave no answer to ``GET /health``, or None when
    it answered (a 4xx is an answer: a server that wants a key is there, and the calls
    that follow say the rest). Asked before anything registers, so that an unreachable
    server is one line about deploying, not one about resuming a collection."""
    import httpx

    try:
        response = httpx.get(f"{api.rstrip('/')}/health", timeout=timeout_s)
    except httpx.HTTPError as e:
        return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    return f"status {response.status_code}" if response.status_code >= 500 else None
