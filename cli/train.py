"""``focus train``: collect -> train -> publish weights -> collect ..., resumable by its id
(the ``train_loop`` flow, :mod:`flows.train_loop`)."""

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
    VerboseOpt,
    help_default,
    load,
    one_line_ending,
    overrides,
    started,
)
from tasks.config import FocusConfig


def train(
    config: ConfigOpt = None,
    collection_id: Annotated[
        str | None,
        typer.Option(help=help_default("Base name; iteration i uses <id>-it<i>.", "train-<time>-<hex>")),
    ] = None,
    iterations: Annotated[
        int | None, typer.Option(help=help_default("Collect/train iterations.", DEFAULTS.train.iterations))
    ] = None,
    trainer: Annotated[
        str | None,
        typer.Option(
            help=help_default(
                "'local', 'tinker' or your trainer's import path 'module:function'.", DEFAULTS.train.trainer
            )
        ),
    ] = None,
    sets: SetOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON record per iteration.")] = False,
    verbose: VerboseOpt = 0,
    debug: DebugOpt = False,
    log_file: LogFileOpt = None,
) -> None:
    """collect -> train -> publish weights -> collect ...; the same id resumes the loop."""
    cfg = load(
        config,
        overrides(sets, collection_id=collection_id, **{"train.iterations": iterations, "train.trainer": trainer}),
    )
    out = Console(verbose, debug, log_file, "train")
    records = _run(out, cfg)
    if as_json:
        for rec in records:
            typer.echo(json.dumps(rec, default=str))
        return
    _print_table(records, cfg.collection_id)


def _run(out: Console, cfg: FocusConfig) -> list[dict[str, Any]]:
    """Checks, the Prefect server, then the ``train_loop`` flow, stopped cleanly by a signal."""
    from flows.preflight import check_root, check_torch, check_weights, new_collection_id
    from tasks.config import check_factories

    if not cfg.collection_id:  # named here, so an interrupted loop can say how to resume it
        cfg = cfg.with_updates(collection_id=new_collection_id("train"))
    resume = f"focus train --collection-id {cfg.collection_id} (and the same options)"
    with one_line_ending(out, resume) as interrupts:
        check_factories(cfg)
        check_weights(cfg)
        check_torch(cfg, training=True)
        check_root(cfg.storage.root)
        # the train loop reloads new weights into the model server it starts itself
        with started(out, cfg, prefect=True, model=False, interrupts=interrupts) as ready:
            from flows.train_loop import train_loop

            return interrupts.run(train_loop(ready))


def _print_table(records: list[dict[str, Any]], cid: str | None) -> None:
    from rich.console import Console as RichConsole
    from rich.table import Table

    run_id = records[0]["run_id"] if records else cid
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
    RichConsole().print(table)
    trained = [r["train"] for r in records if r.get("train", {}).get("weights")]
    if trained:
        typer.echo(f"weights: {trained[-1]['weights']}")
    typer.echo(f"resume or rerun with the same options and: --collection-id {run_id}")
