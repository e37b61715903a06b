"""The ``focus`` command: collect, inspect a batch, serve the local model, deploy.

``focus collect`` with no options runs the embedded default end to end: the tiny local
model on loopback, the toy task, rollouts in-process, ``./runs`` as the store, and the
Prefect server named by ``PREFECT_API_URL`` (or a temporary one). Options, a
``--config`` file (TOML/YAML) and ``FOCUS_*`` environment variables override it.

What can be decided without starting anything is decided first (:mod:`flows.preflight`):
the configuration, the storage root, a collection id reused with another configuration,
a collection that is already finished. Then the temporary Prefect server and the model
server start side by side. The console shows progress bars and the result; Prefect's
and Dask's own logging goes to a log file (``-v`` shows it). Any error ends the command
with one line naming the cause (:mod:`flows.errors`) and a non-zero status; the
traceback is in the log file, or on the terminal with ``--debug``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from typer.core import TyperOption

from flows.errors import exit_code, one_line
from tasks.config import ConfigError, FocusConfig, load_config

_T0 = time.perf_counter()
_D = FocusConfig()

# Typer prints a type placeholder for every option, "<bool>" for flags too; a flag takes
# no value, so show none (the help test checks this).
_display_type = TyperOption.display_type_rich
TyperOption.display_type_rich = lambda self, ctx: None if (self.is_flag or self.count) else _display_type(self, ctx)  # type: ignore[method-assign]

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="FOCUS: branching rollout collection for RL of LLM agents.",
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _d(text: str, default: Any) -> str:
    """Help text with the default the configuration gives when the option is not used
    (the bracket escaped: help text is rich markup)."""
    return f"{text} \\[default: {default}]"


ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="TOML or YAML configuration file.")]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", metavar="KEY=VALUE", help="Override a field, e.g. --set search.phases.1.transitions=400"),
]
VerboseOpt = Annotated[
    int, typer.Option("--verbose", "-v", count=True, help="Show Prefect's and Dask's log on the console (-vv: debug).")
]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Print the full traceback of an error.")]
LogFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--log-file", help=_d("Where the full log goes.", "~/.local/state/focus/logs/<command>-<time>-<pid>.log")
    ),
]


class _Console:
    """The command's console and log file, and its one-line errors."""

    def __init__(self, verbosity: int, debug: bool, log_file: Path | None, kind: str) -> None:
        from flows.logs import default_log_file
        from flows.progress import console

        self.verbosity, self.debug = verbosity, debug
        self.log_file = log_file or default_log_file(kind)
        self.console = console()
        self.logging_ready = False

    def setup_logging(self) -> None:
        from flows.logs import setup

        if not self.logging_ready:
            self.log_file = setup(self.console, verbosity=self.verbosity, log_file=self.log_file) or self.log_file
            self.logging_ready = True

    def fail(self, exc: BaseException) -> NoReturn:
        """One line naming the cause and a non-zero exit; the traceback to the log or the terminal."""
        line = one_line(exc)
        code = exit_code(exc)
        where = ""
        if self.debug:
            traceback.print_exception(exc, file=sys.stderr)
        elif code != 2:  # a configuration error needs no traceback
            try:
                self.log_file.parent.mkdir(parents=True, exist_ok=True)
                with open(self.log_file, "a", encoding="utf-8") as f:
                    f.write(f"error: {line}\n{''.join(traceback.format_exception(exc))}")
                where = f" (traceback: {self.log_file})"
            except OSError:
                pass
        typer.secho(f"error: {line}{where}", fg=typer.colors.RED, err=True)
        raise typer.Exit(code)


def _fail(message: str, code: int = 2) -> NoReturn:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


def _overrides(sets: list[str] | None, **flags: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in sets or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            _fail(f"--set {item!r}: expected KEY=VALUE, e.g. --set seed=3")
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value
    out.update({k: v for k, v in flags.items() if v is not None})
    return out


def _load(config: Path | None, overrides: dict[str, Any]) -> FocusConfig:
    try:
        return load_config(config, overrides)
    except ConfigError as e:
        _fail(one_line(e))


def _offline_defaults() -> None:
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


@contextmanager
def _services(
    out: _Console, cfg: FocusConfig, *, start_model: bool, orchestrated: bool = True, warm: Any = None
) -> Iterator[FocusConfig]:
    """The Prefect API (the configured one, or a temporary server; none when not
    ``orchestrated``) and, for a collection of the embedded model, the model server -
    started side by side, while this process imports the flows; ``warm``: the model
    server process the console entry already started (:mod:`flows.entry`). Yields the
    config naming the model server."""
    import logging

    from flows.server import TemporaryServer, configured_api_url

    _offline_defaults()
    prefect_server = None
    model_server: Any = None
    started: dict[str, Any] = {}
    log = None
    t0 = time.perf_counter()
    try:
        if orchestrated and not configured_api_url():
            out.log_file.parent.mkdir(parents=True, exist_ok=True)
            log = open(out.log_file, "ab")  # noqa: SIM115 - closed below
            prefect_server = TemporaryServer(log=log).start()
            os.environ["PREFECT_API_URL"] = prefect_server.api_url  # before Prefect is imported
        thread = None
        if start_model and cfg.model.kind == "local" and cfg.model.url is None:
            from focus.backends import LocalModelServer

            model_server = LocalModelServer(cfg.model.weights, warm=warm)

            def start() -> None:
                try:
                    model_server.start()
                    started["warm"] = model_server.warm_started
                    started["version"] = model_server.policy_version
                    started["at"] = time.perf_counter() - t0
                except BaseException as e:  # noqa: BLE001 - re-raised in the main thread
                    started["error"] = e

            thread = threading.Thread(target=start, name="focus-model-server", daemon=True)
            thread.start()
        elif warm is not None:
            warm.discard()  # another model service: free its core now
        if cfg.execution.kind == "dask":
            import distributed  # noqa: F401 - it installs its log handlers on import; setup replaces them
        if orchestrated:
            import flows.collect  # noqa: F401 - Prefect's import, overlapping with the servers' start
        else:
            import flows.direct  # noqa: F401 - the library's import, overlapping with the model server's start

        out.setup_logging()
        if out.verbosity == 0:
            from flows.logs import dask_workers_log_to

            out.log_file.parent.mkdir(parents=True, exist_ok=True)
            dask_workers_log_to(out.log_file)  # worker processes inherit it
        what = [w for w, on in (("Prefect server", prefect_server), ("model server", thread)) if on is not None]
        with out.console.status(f"starting the {' and the '.join(what)}", spinner="dots") if what else _nothing():
            if prefect_server is not None:
                prefect_server.wait()
            ready_at = time.perf_counter() - t0
            if thread is not None:
                thread.join()
        logging.getLogger("focus.cli").info(
            "start-up: temporary Prefect server %s, model server %s (seconds after the preflight)",
            f"ready at {ready_at:.2f}" if prefect_server is not None else "not needed",
            f"ready at {started['at']:.2f}{' (started by the console entry)' if started.get('warm') else ''}"
            if "at" in started
            else "not needed",
        )
        if thread is not None:
            if "error" in started:
                raise started["error"]
            updates: dict[str, Any] = {"model.url": model_server.url}
            if cfg.model.policy_version is None:
                updates["model.policy_version"] = started["version"]
            cfg = cfg.with_updates(**updates)
        yield cfg
    finally:
        t_end = time.perf_counter()
        # both servers shut down at once: the model server now (nothing uses it any more),
        # the Prefect server once Prefect's pending logs and events are sent. The model
        # server is killed, not asked to stop: it holds nothing to save (its weights are
        # files it read), and its graceful shutdown took 0.16 s of every command's wall time
        model_proc = getattr(model_server, "proc", None)
        if model_proc is not None and model_proc.poll() is None:
            model_proc.kill()
        if "prefect" in sys.modules:
            _drain_prefect()
        t_drained = time.perf_counter()
        if prefect_server is not None and prefect_server.proc is not None:
            prefect_server.proc.terminate()
        if model_server is not None:
            model_server.stop()
        if prefect_server is not None:
            prefect_server.stop()
        logging.getLogger("focus.cli").info(
            "shut-down: Prefect's logs and events sent in %.2f s, servers stopped in %.2f s",
            t_drained - t_end,
            time.perf_counter() - t_drained,
        )
        if log is not None:
            log.close()


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def _drain_prefect(timeout_s: float = 5.0) -> None:
    """Send the logs and events Prefect still holds, while its server is up: left to
    Prefect's exit hooks, they retried against a stopped temporary server for a minute
    and printed "Error logging to API"."""
    try:
        from prefect.events.worker import EventsWorker
        from prefect.logging.handlers import APILogWorker
    except ImportError:
        return
    for worker in (APILogWorker, EventsWorker):
        try:
            worker.drain_all(timeout=timeout_s)
        except Exception:  # noqa: BLE001 - best effort: the run's outcome is already known
            pass


# ---- output ----

#: The statistics ``focus collect`` shows, in order; each is defined in docs/pipeline.md
#: ("What a run shows"); tests/test_cli.py checks that every one is.
SHOWN = (
    "actor_rows",
    "critic_rows",
    "tasks",
    "trees",
    "failed_trees",
    "rollouts",
    "failed_rollouts",
    "transitions",
    "tokens",
    "model_calls",
    "checkpoints",
    "excluded_segments",
    "steps",
    "steps_reused",
    "wall_s",
    "flow_wall_s",
    "cli_wall_s",
)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (list, dict)):
        return json.dumps(v, default=str)
    return str(v)


def _pairs_table(title: str, items: list[tuple[str, Any]]) -> Any:
    """Statistics in two column pairs, so a result fits a screen."""
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for _ in range(2):
        table.add_column("statistic")
        table.add_column("value", justify="right")
    half = (len(items) + 1) // 2
    for i in range(half):
        left = items[i]
        right = items[i + half] if i + half < len(items) else ("", "")
        table.add_row(left[0], _fmt(left[1]), right[0], _fmt(right[1]))
    return table


def _print_result(result: dict[str, Any], note: str = "") -> None:
    from rich.console import Console

    stats = result["stats"]
    items = [(k, stats[k]) for k in SHOWN if k in stats]
    console = Console()  # standard output: the result, apart from the bars and log on standard error
    console.print(_pairs_table(f"collection {result['collection_id']}{note}", items))
    for cause, n in (result.get("failure_causes") or {}).items():
        console.print(f"failure cause ({n}x): {cause}", markup=False, highlight=False)
    console.print(f"batch: {result['batch_url']}", markup=False, highlight=False, soft_wrap=True)


# ---- commands ----


@app.command()
def collect(
    ctx: typer.Context,
    config: ConfigOpt = None,
    collection_id: Annotated[
        str | None, typer.Option(help=_d("Name of the collection; the same id resumes it.", "collect-<time>-<hex>"))
    ] = None,
    seed: Annotated[int | None, typer.Option(help=_d("Collection seed.", _D.seed))] = None,
    iteration: Annotated[
        int | None, typer.Option(help=_d("Training iteration recorded in the batch.", _D.iteration))
    ] = None,
    store: Annotated[
        str | None, typer.Option(help=_d("Storage root: a folder or an fsspec URL (s3://...).", "./runs"))
    ] = None,
    model_url: Annotated[
        str | None,
        typer.Option(help=_d("OpenAI-compatible model server.", "start the embedded model")),
    ] = None,
    model_timeout: Annotated[
        float | None,
        typer.Option(help=_d("Seconds to wait for one model answer.", _D.model.http.timeout_s), metavar="SECONDS"),
    ] = None,
    model_retries: Annotated[
        int | None,
        typer.Option(help=_d("Retries of a failed model call.", _D.model.http.max_retries), metavar="N"),
    ] = None,
    tasks: Annotated[int | None, typer.Option(help=_d("Number of toy tasks.", _D.env.n_tasks))] = None,
    transitions: Annotated[
        int | None,
        typer.Option(help=_d("Transition budget of the last continuation phase.", _D.search.phases[-1].transitions)),
    ] = None,
    dask: Annotated[
        bool, typer.Option("--dask", help="Run rollouts on a Dask LocalCluster started for the run.")
    ] = False,
    dask_address: Annotated[
        str | None, typer.Option(help=_d("Run rollouts on this Dask scheduler.", "in-process"), metavar="ADDRESS")
    ] = None,
    local: Annotated[bool, typer.Option("--local", help="Run rollouts in-process (the default).")] = False,
    prefect: Annotated[
        bool,
        typer.Option(
            "--prefect",
            help="Run as a Prefect flow even when no Prefect server is configured (starts a temporary one). "
            "With PREFECT_API_URL set, collections always run as flows on that server.",
        ),
    ] = False,
    sets: SetOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as one JSON line.")] = False,
    verbose: VerboseOpt = 0,
    debug: DebugOpt = False,
    log_file: LogFileOpt = None,
) -> None:
    """Collect one iteration and write its batch; prints the batch URL and statistics."""
    flags: dict[str, Any] = {
        "collection_id": collection_id,
        "seed": seed,
        "iteration": iteration,
        "storage.root": store,
        "env.n_tasks": tasks,
        "execution.address": dask_address,
        "execution.kind": "local" if local else "dask" if (dask or dask_address) else None,
        "model.http.timeout_s": model_timeout,
        "model.http.max_retries": model_retries,
    }
    if model_url:
        flags.update({"model.kind": "openai", "model.url": model_url})
    overrides = _overrides(sets, **flags)
    cfg = _load(config, overrides)
    if transitions is not None:
        phases = [p.model_dump() for p in cfg.search.phases]
        phases[-1]["transitions"] = transitions
        cfg = _load(config, {**overrides, "search.phases": phases})
    out = _Console(verbose, debug, log_file, "collect")
    from flows.preflight import new_collection_id, preflight

    if not cfg.collection_id:
        cfg = cfg.with_updates(collection_id=new_collection_id())
    try:
        pre = preflight(cfg)
    except Exception as e:  # noqa: BLE001 - every error becomes one line
        out.fail(e)
    if pre.finished is not None:
        stats = {**pre.finished.get("summary", {}), "cli_wall_s": round(time.perf_counter() - _T0, 3)}
        result = {
            "collection_id": cfg.collection_id,
            "batch_url": pre.finished["batch_url"],
            "stats": stats,
            "failure_causes": pre.finished.get("failure_causes", {}),
            "already_finished": True,
        }
        if as_json:
            typer.echo(json.dumps(result, default=str))
        else:
            _print_result(result, " (already finished: nothing to do)")
        return
    if pre.damaged:
        typer.secho(f"warning: {pre.damaged}; writing the batch again", fg=typer.colors.YELLOW, err=True)
    from flows.server import configured_api_url

    # With no Prefect server to keep the run, a temporary one would record it only to
    # forget it: run the flow's steps directly (flows/direct.py; same store, same resume).
    orchestrated = prefect or bool(configured_api_url())
    try:
        warm = (ctx.obj or {}).get("warm_model")
        with _services(out, cfg, start_model=True, orchestrated=orchestrated, warm=warm) as ready:
            import asyncio

            if orchestrated:
                from flows.collect import collect as collect_flow

                result = asyncio.run(collect_flow(ready))
            else:
                from flows.direct import collect_direct

                result = asyncio.run(collect_direct(ready))
    except Exception as e:  # noqa: BLE001 - every error becomes one line
        out.fail(e)
    except KeyboardInterrupt as e:
        out.fail(e)
    result["stats"]["cli_wall_s"] = round(time.perf_counter() - _T0, 3)
    if as_json:
        typer.echo(json.dumps(result, default=str))
        return
    _print_result(result)
    typer.echo(f"rerun or resume: focus collect --collection-id {result['collection_id']}")


# ==== train and config commands (train-loop work; keep edits here self-contained) ====


@app.command()
def train(
    config: ConfigOpt = None,
    collection_id: Annotated[
        str | None, typer.Option(help=_d("Base name; iteration i uses <id>-it<i>.", "derived from the flow run"))
    ] = None,
    iterations: Annotated[int | None, typer.Option(help=_d("Collect/train iterations.", _D.train.iterations))] = None,
    trainer: Annotated[
        str | None,
        typer.Option(help=_d("'local', 'tinker' or your trainer's import path 'module:function'.", _D.train.trainer)),
    ] = None,
    sets: SetOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON record per iteration.")] = False,
    verbose: VerboseOpt = 0,
    debug: DebugOpt = False,
    log_file: LogFileOpt = None,
) -> None:
    """collect -> train -> publish weights -> collect ...; the same id resumes the loop."""
    cfg = _load(
        config,
        _overrides(sets, collection_id=collection_id, **{"train.iterations": iterations, "train.trainer": trainer}),
    )
    out = _Console(verbose, debug, log_file, "train")
    try:
        from flows.preflight import check_root, check_torch, check_weights
        from tasks.config import check_factories

        check_factories(cfg)
        check_weights(cfg)
        check_torch(cfg, training=True)
        check_root(cfg.storage.root)
        # the train loop reloads new weights into the model server it starts itself
        with _services(out, cfg, start_model=False) as ready:
            import asyncio

            from flows.train_loop import train_loop

            records = asyncio.run(train_loop(ready))
    except Exception as e:  # noqa: BLE001 - every error becomes one line
        out.fail(e)
    if as_json:
        for rec in records:
            typer.echo(json.dumps(rec, default=str))
        return
    from rich.console import Console
    from rich.table import Table

    run_id = records[0]["run_id"] if records else cfg.collection_id
    table = Table(title=f"train loop {run_id}")
    for col in ("iteration", "policy version", "eval success", "transitions", "loss", "reused"):
        table.add_column(col, justify="right")
    for rec in records:
        tr = rec.get("train", {})
        ev = rec.get("eval")
        table.add_row(
            str(rec["iteration"]),
            str(rec["policy_version"])[:16],
            f"{ev['success_rate']:.3f}" if ev else "-",
            str(rec.get("stats", {}).get("transitions", "-")),
            f"{tr['metrics']['train_loss']:.4g}" if "train_loss" in tr.get("metrics", {}) else "-",
            "yes" if tr.get("reused") else ("no" if tr else "-"),
        )
    Console().print(table)
    trained = [r["train"] for r in records if r.get("train", {}).get("weights")]
    if trained:
        typer.echo(f"weights: {trained[-1]['weights']}")
    typer.echo(f"resume or rerun with the same options and: --collection-id {run_id}")


config_app = typer.Typer(no_args_is_help=True, help="Show the effective configuration.")
app.add_typer(config_app, name="config")


@config_app.command("show")
def config_show(
    config: ConfigOpt = None,
    sets: SetOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print {field: {value, source}} as JSON.")] = False,
) -> None:
    """Every field of the effective configuration, its value and where it came from
    (default, the file, a FOCUS_* variable or --set), after validation."""
    from tasks.config import explain_config

    try:
        _cfg, rows = explain_config(config, _overrides(sets))
    except ConfigError as e:
        _fail(str(e))
        raise  # unreachable
    if as_json:
        typer.echo(json.dumps({k: {"value": v, "source": src} for k, v, src in rows}, default=str))
        return
    width = max(len(k) for k, _, _ in rows)
    texts = [json.dumps(v, default=str) for _, v, _ in rows]
    vwidth = min(48, max(len(t) for t in texts))
    for (key, _, source), text in zip(rows, texts, strict=True):
        typer.echo(f"{key:<{width}} = {text:<{vwidth}}  # {source}")


# ==== end of the train and config commands ====


def _split_batch_url(url: str) -> tuple[str, str, str | None]:
    """(store root, collection id, iteration folder or ``None``) of a batch or collection URL."""
    root, sep, rest = url.rstrip("/").rpartition("/batches/")
    if not sep or not rest:
        _fail(
            f"{url!r} is neither a batch URL (<root>/batches/<collection>/iter-<n>) "
            "nor a collection folder (<root>/batches/<collection>)"
        )
    cid, _, it = rest.partition("/")
    return root, cid, it or None


@app.command()
def inspect(
    url: Annotated[str, typer.Argument(help="A batch URL printed by 'focus collect', or a collection folder.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Summary of a stored batch (rows, tokens, advantages, critic targets, every phase),
    or the iterations of a collection folder."""
    from rich.console import Console

    from storage import BatchStore

    root, cid, it = _split_batch_url(url)
    console = Console()
    try:
        store = BatchStore(root)
        if it is None:
            listing = collection_summary(store, cid)
            if not listing["iterations"]:
                _fail(f"no finished batch in {url} (a batch exists once its _manifest.json is written)", 1)
            if as_json:
                typer.echo(json.dumps(listing, default=str))
            else:
                console.print(_iterations_table(listing))
            return
        summary = batch_summary(store.read(url))
    except typer.Exit:
        raise
    except Exception as e:  # noqa: BLE001 - every error becomes one line
        _fail(f"cannot read batch: {one_line(e)}", 1)
    if as_json:
        typer.echo(json.dumps(summary, default=str))
        return
    phases = summary.pop("phases", [])
    causes = summary.pop("failure_causes", {})
    console.print(_pairs_table(f"batch {url}", list(summary.items())))
    if phases:
        console.print(_phases_table(phases))
    for cause, n in causes.items():
        console.print(f"failure cause ({n}x): {cause}", markup=False, highlight=False)


def batch_summary(batch: Any) -> dict[str, Any]:
    """Plain figures of a batch (what ``focus inspect`` shows)."""
    import numpy as np

    adv = np.array([r.advantage for r in batch.actor], dtype=float)
    tgt = np.array([r.target for r in batch.critic], dtype=float)
    out = dict(batch.summary())
    out["policy_versions"] = sorted({r.policy_version for r in batch.actor})
    out["advantage_mean"] = float(adv.mean()) if adv.size else None
    out["advantage_std"] = float(adv.std()) if adv.size else None
    out["critic_target_mean"] = float(tgt.mean()) if tgt.size else None
    out["phases"] = batch.stats.get("phases", [])
    out["failure_causes"] = batch.stats.get("failure_causes", {})
    return out


def collection_summary(store: Any, cid: str) -> dict[str, Any]:
    """The finished iterations of collection ``cid``: URL, time written and figures, from the manifests."""
    rows = []
    for batch_url in store.list(cid):
        m = store.manifest(batch_url)
        summary = m.info.get("summary", {})
        rows.append(
            {
                "iteration": m.info.get("iteration"),
                "url": batch_url,
                "written": m.created_at,
                **{
                    k: summary.get(k) for k in ("actor_rows", "critic_rows", "tokens", "transitions", "failed_rollouts")
                },
            }
        )
    return {"collection_id": cid, "iterations": sorted(rows, key=lambda r: r["iteration"] or 0)}


def _iterations_table(listing: dict[str, Any]) -> Any:
    from rich.table import Table

    rows = listing["iterations"]
    table = Table(
        title=f"collection {listing['collection_id']}: {len(rows)} finished iteration(s)", title_justify="left"
    )
    cols = [c for c in rows[0] if c != "url"] + ["url"]
    for c in cols:
        table.add_column(c, justify="left" if c in ("written", "url") else "right", overflow="fold")
    for r in rows:
        table.add_row(*[_fmt(r[c]) for c in cols])
    return table


def _phases_table(phases: list[dict[str, Any]]) -> Any:
    """Every figure the batch records per phase (nothing cut): one row per figure, one
    column per phase, so many figures stay readable on a narrow terminal."""
    from rich.table import Table

    figures: list[str] = []
    for p in phases:
        figures += [k for k in p if k not in figures and k != "name"]
    table = Table(title="phases", title_justify="left")
    table.add_column("figure")
    for p in phases:
        table.add_column(str(p.get("name", "")), justify="right", overflow="fold")
    for k in figures:
        table.add_row(k, *[_fmt(p.get(k, "")) for p in phases])
    return table


@app.command("serve-model")
def serve_model(
    port: Annotated[int, typer.Option(help="Port on 127.0.0.1 (0 picks a free one).")] = 8000,
    weights: Annotated[
        Path | None, typer.Option(help=_d("Weights file.", "the packaged initial weights"), metavar="PATH")
    ] = None,
) -> None:
    """Serve the embedded tiny model (OpenAI-compatible completions, weight reload) until Ctrl-C."""
    from focus.backends import LocalModelServer

    with LocalModelServer(weights, port=port) as server:
        typer.echo(f"serving the local model at {server.url} (policy version {server.policy_version}); Ctrl-C stops")
        try:
            while server.proc is not None and server.proc.poll() is None:
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
    if server.proc is not None and server.proc.returncode not in (0, None, -15):
        _fail(f"model server exited with code {server.proc.returncode}", 1)


@app.command()
def deploy(
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="Configuration of both deployments (TOML or YAML).")
    ] = None,
    scheduled_config: Annotated[
        Path | None,
        typer.Option(help=_d("Configuration of the scheduled deployment only.", "--config"), metavar="PATH"),
    ] = None,
    manual_config: Annotated[
        Path | None,
        typer.Option(help=_d("Configuration of the manual deployment only.", "--config"), metavar="PATH"),
    ] = None,
    cron: Annotated[str, typer.Option(help="Schedule of the scheduled deployment.")] = "0 * * * *",
    limit: Annotated[
        int, typer.Option(help="Most flow runs at once in this process (each starts its own model server).")
    ] = 1,
    crash_after: Annotated[
        float,
        typer.Option(
            help="Mark a run Crashed after this many seconds without a heartbeat (node loss; at least 10); "
            "0 installs no watchdog.",
            metavar="SECONDS",
        ),
    ] = 30.0,
    sets: SetOpt = None,
    debug: DebugOpt = False,
) -> None:
    """Register and serve the scheduled and the manual collection deployments (needs a Prefect server).

    The deployments store only what the configuration files and --set name; FOCUS_*
    variables of this process apply when each run starts (docs/pipeline.md).
    """
    from flows.server import configured_api_url

    if not configured_api_url():
        _fail("focus deploy needs a Prefect server: set PREFECT_API_URL (e.g. after 'prefect server start')")
    if limit < 1:
        _fail("--limit must be at least 1")
    if 0 < crash_after < 10:
        _fail("--crash-after must be 0 (no watchdog) or at least 10 seconds (Prefect's shortest proactive trigger)")
    from deployments.serve import DeploySpec, explicit_config, serve_deployments

    out = _Console(0, debug, None, "deploy")
    overrides = _overrides(sets)
    try:
        spec = DeploySpec(
            scheduled=explicit_config(scheduled_config or config, overrides),
            manual=explicit_config(manual_config or config, overrides),
            cron=cron,
            limit=limit,
            crash_after_s=crash_after,
        )
    except ConfigError as e:
        _fail(one_line(e))
    try:
        serve_deployments(spec)
    except Exception as e:  # noqa: BLE001 - every error becomes one line
        out.fail(e)


def main(warm_model: Any = None) -> None:  # pragma: no cover - console entry point
    """``focus``: run the command, then leave without Python's finalisation. Tearing down
    Prefect's ~1500 modules took 1.4 s after every collection, the library's 0.1 s
    (measured); everything is written and closed by then (logs flushed, servers stopped,
    Prefect's logs and events sent), so nothing is lost by skipping it. ``warm_model``:
    a model server the console entry started (:mod:`flows.entry`), stopped here if the
    command did not use it."""
    try:
        app(obj={"warm_model": warm_model})
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        if warm_model is not None:
            warm_model.discard()
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    main()
