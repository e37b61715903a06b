"""``focus deploy``: register and serve the collection deployments (:mod:`deployments.serve`)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli.common import Console, DebugOpt, LogFileOpt, SetOpt, VerboseOpt, fail, help_default, overrides
from cli.interrupts import serving
from deployments.console import server_unanswered
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
    verbose: VerboseOpt = 0,
    log_file: LogFileOpt = None,
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
    from deployments.serve import DeploySpec
    from deployments.watchdog import ensure_watchdog

    spec = DeploySpec(cron=cron, limit=limit, crash_after_s=crash_after, overlap=overlap)
    if not (watchdog_only or work_pool):  # what this process would serve, checked before anything is registered
        spec = served(spec, scheduled_config or config, manual_config or config, overrides(sets))
    out = Console(verbose, debug, log_file, "deploy")
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
    _serve(out, spec, api)


def _serve(out: Console, spec: DeploySpec, api: str) -> None:
    """Serve until stopped, quietly (:mod:`deployments.console`): a start line, a line
    when the Prefect server goes and when it is back, a line at the stop."""
    from deployments.console import ServerWatch, quiet_flow_runs, start_line, ui_url
    from deployments.serve import serve_deployments, served_names

    quiet_flow_runs(out.verbosity)  # before Prefect is imported: the flow-run processes inherit it
    with contextlib.suppress(Exception):  # notices: a failed read is the registration's to report
        for line in asyncio.run(_notices(spec)):
            typer.secho(f"warning: {line}", fg=typer.colors.YELLOW, err=True)
    import prefect.main  # noqa: F401 - Prefect sets its logging up on this import: ours replaces it

    out.setup_logging()  # Prefect's runner lines (its tracebacks of a server restart) to the log file
    names = served_names(spec)
    serving()  # Prefect's serve stops on Ctrl-C its own way (before: one line, cli.entry)
    try:
        with ServerWatch(api, lambda line: typer.secho(line, fg=typer.colors.YELLOW, err=True)):
            stopped = serve_deployments(spec, started=lambda: typer.echo(start_line(names, api, ui_url())))
    except Exception as e:  # noqa: BLE001 - every error becomes one line
        out.fail(e)
    if stopped:
        line = (
            f"stopped ({stopped.by}): {stopped.runs()}{' and '.join(names)} paused on the server (no scheduled runs "
            f"until focus deploy serves them again); log: {out.log_file}"
        )
        # in the log file too: a SIGHUP's terminal is gone, and the line with it
        with contextlib.suppress(OSError), open(out.log_file, "a", encoding="utf-8", errors="surrogateescape") as f:
            f.write(f"{line}\n")
        typer.echo(line, err=True)


async def _notices(spec: DeploySpec) -> list[str]:
    """What the server says about the deployments before this command serves them."""
    from deployments.serve import edited_on_server, served_elsewhere

    return await served_elsewhere(spec) + await edited_on_server(spec)


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
