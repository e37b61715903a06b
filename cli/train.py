"""``focus train``: collect -> train -> publish weights -> collect ..., resumable by its id.

With a Prefect server configured (``PREFECT_API_URL``) or ``--prefect`` it runs the
``train_loop`` flow (:mod:`flows.train_loop`); otherwise the same loop directly
(:func:`flows.loop.train_direct`), as ``focus collect`` does: same store, same
records, same resume, and no temporary server that would forget the run when the
command ends. A finished loop reruns without starting anything."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from cli.common import (
    DEFAULTS,
    ConfigOpt,
    Console,
    DebugOpt,
    LogFileOpt,
    SetOpt,
    StoreOpt,
    TasksOpt,
    TransitionsOpt,
    VerboseOpt,
    help_default,
    load_with_budget,
    name_settings,
    one_line_ending,
    pasteable,
    resume_command,
    started,
    warn_if_forgotten,
)
from tasks.config import FocusConfig

AllowConfigChangeOpt = Annotated[
    bool,
    typer.Option(
        "--allow-config-change",
        help="Resume a loop with other settings than its recorded iterations were made with: they are kept as "
        "made, and the new settings apply from the first iteration not yet begun (only trainer settings changed: "
        "not yet trained).",
    ),
]


def train(
    config: ConfigOpt = None,
    collection_id: Annotated[
        str | None,
        typer.Option(help=help_default("Base name; iteration i uses <id>-it<i>.", "train-<time>-<hex>"), metavar="ID"),
    ] = None,
    iterations: Annotated[
        int | None, typer.Option(help=help_default("Collect/train iterations.", DEFAULTS.train.iterations), metavar="N")
    ] = None,
    trainer: Annotated[
        str | None,
        typer.Option(
            help=help_default(
                "'local', 'tinker' or your trainer's import path 'module:function'.", DEFAULTS.train.trainer
            ),
            metavar="NAME",
        ),
    ] = None,
    seed: Annotated[
        int | None,
        typer.Option(
            help=help_default(
                "Seed of the loop; each collection's and evaluation's seed derives from it.", DEFAULTS.seed
            ),
            metavar="N",
        ),
    ] = None,
    store: StoreOpt = None,
    tasks: TasksOpt = None,
    transitions: TransitionsOpt = None,
    sets: SetOpt = None,
    prefect: Annotated[
        bool,
        typer.Option(
            "--prefect",
            help="Run as a Prefect flow even when no Prefect server is configured (starts a temporary one). "
            "With PREFECT_API_URL set, the loop always runs as a flow on that server.",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON record per iteration.")] = False,
    allow_config_change: AllowConfigChangeOpt = False,
    verbose: VerboseOpt = 0,
    debug: DebugOpt = False,
    log_file: LogFileOpt = None,
) -> None:
    """collect -> train -> publish weights -> collect ...; the same id resumes the loop."""
    from flows.preflight import CommandNames

    name_settings(CommandNames())  # its settings come from the file, --set or FOCUS_*: no flag to name
    flags = {
        "collection_id": collection_id,
        "seed": seed,
        "storage.root": store,
        "env.n_tasks": tasks,
        "train.iterations": iterations,
        "train.trainer": trainer,
    }
    cfg = load_with_budget(config, flags, sets, transitions)
    if not cfg.collection_id:  # named here, so an interrupted loop can say how to resume it
        from flows.preflight import new_collection_id

        cfg = cfg.with_updates(collection_id=new_collection_id("train"))
    resume = resume_command("train", config, flags, sets, transitions, str(cfg.collection_id), cfg)
    out = Console(verbose, debug, log_file, "train")
    warn_if_forgotten(cfg.storage.root)
    records = _run(out, cfg, resume, prefect=prefect, allow=allow_config_change)
    if as_json:
        for rec in records:
            typer.echo(json.dumps(rec, default=str))
        return
    _print_table(records, cfg.collection_id, resume)
    from flows.loop_progress import METRICS, PICTURE
    from storage.weights import WeightStore

    weights = WeightStore(cfg.storage.root)
    run_id = records[0]["run_id"] if records else str(cfg.collection_id)
    if records:
        typer.echo(f"metrics per iteration (JSON lines): {pasteable(weights.run_file(run_id, METRICS))}")
    if any(r.get("eval") for r in records):
        typer.echo(f"held-out success per version: {pasteable(weights.run_file(run_id, PICTURE))}")


def _run(
    out: Console, cfg: FocusConfig, resume: str, *, prefect: bool = False, allow: bool = False
) -> list[dict[str, Any]]:
    """Checks, then the loop - the ``train_loop`` flow on a Prefect server, else directly -
    stopped cleanly by a signal (whose line says ``resume``, the command that resumes it).
    A loop resumed with other settings is refused before anything starts."""
    from flows.preflight import check_root, check_torch, check_weights
    from flows.server import configured_api_url
    from tasks.config import check_factories
    from tasks.loop_settings import settle

    with one_line_ending(out, resume) as interrupts:
        check_factories(cfg)
        check_weights(cfg)
        check_torch(cfg, training=True)
        check_root(cfg.storage.root)
        if not allow:  # the loop records the settings (and says what it accepts) under its lease
            settle(cfg, record=False)
        orchestrated = prefect or bool(configured_api_url())
        # the train loop reloads new weights into the model server it starts itself
        with started(out, cfg, prefect=orchestrated, model=False, interrupts=interrupts) as ready:
            if orchestrated:
                from flows.train_loop import train_loop

                return interrupts.run(train_loop(ready, allow_config_change=allow))
            from flows.loop import train_direct

            return interrupts.run(train_direct(ready, allow_config_change=allow))


def _print_table(records: list[dict[str, Any]], cid: str | None, resume: str) -> None:
    """The table of versions (as the live rows show it: 78 columns, versions whole), then
    the command that reruns or extends the loop (``resume``), ready to copy as
    ``focus collect`` prints its own; it said ``resume or rerun with the same options and:
    --collection-id L``, which the operator had to complete."""
    from flows.loop_progress import header_line, row_cells, row_line

    run_id = records[0]["run_id"] if records else cid
    typer.echo(f"train loop {run_id}")
    typer.echo(header_line())
    for rec in records:
        typer.echo(row_line(row_cells(rec)))
    trained = [r["train"] for r in records if r.get("train", {}).get("weights")]
    if trained:
        typer.echo(f"weights: {pasteable(trained[-1]['weights'])}")
    typer.echo(f"rerun or resume: {resume}")
