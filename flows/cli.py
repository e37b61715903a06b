"""The ``focus`` command: collect, inspect a batch, serve the local model, deploy.

``focus collect`` with no options runs the embedded default end to end: the tiny local
model on loopback, the toy task, the ephemeral Prefect API, a Dask LocalCluster and
``./runs`` as the store. Options, a ``--config`` file (TOML/YAML) and ``FOCUS_*``
environment variables override it; the configuration is validated before anything
starts. Prefect and Dask are imported inside the commands, so ``focus --help`` is quick.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from tasks.config import ConfigError, FocusConfig, load_config

app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="FOCUS: branching rollout collection for RL of LLM agents."
)

ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="TOML or YAML configuration file.")]
SetOpt = Annotated[
    list[str] | None, typer.Option("--set", help="Override a field: --set search.phases.1.transitions=400")
]


def _fail(message: str, code: int = 2) -> None:
    typer.secho(message, fg=typer.colors.RED, err=True)
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
        _fail(str(e))
        raise  # unreachable


def _prefect_offline_defaults() -> None:
    """Use the ephemeral API when no server is configured (the embedded default)."""
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    if not os.environ.get("PREFECT_API_URL"):
        os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_ENABLED", "true")
        # the first start runs database migrations; on a busy laptop that takes a while
        os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")


@app.command()
def collect(
    config: ConfigOpt = None,
    collection_id: Annotated[str | None, typer.Option(help="Name of the collection; the same id resumes it.")] = None,
    seed: Annotated[int | None, typer.Option(help="Collection seed.")] = None,
    iteration: Annotated[int | None, typer.Option(help="Training iteration recorded in the batch.")] = None,
    store: Annotated[str | None, typer.Option(help="Storage root: a folder or an fsspec URL (s3://...).")] = None,
    model_url: Annotated[
        str | None, typer.Option(help="OpenAI-compatible model server (default: start the local model).")
    ] = None,
    tasks: Annotated[int | None, typer.Option(help="Number of toy tasks.")] = None,
    transitions: Annotated[int | None, typer.Option(help="Transition budget of the last continuation phase.")] = None,
    dask_address: Annotated[str | None, typer.Option(help="Existing Dask scheduler (default: a LocalCluster).")] = None,
    local: Annotated[bool, typer.Option("--local", help="Run rollouts in-process instead of on Dask.")] = False,
    sets: SetOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Collect one iteration and write its batch; prints the batch URL and statistics."""
    flags: dict[str, Any] = {
        "collection_id": collection_id,
        "seed": seed,
        "iteration": iteration,
        "storage.root": store,
        "env.n_tasks": tasks,
        "execution.address": dask_address,
        "execution.kind": "local" if local else None,
    }
    if model_url:
        flags.update({"model.kind": "openai", "model.url": model_url})
    overrides = _overrides(sets, **flags)
    cfg = _load(config, overrides)
    if transitions is not None:
        phases = [p.model_dump() for p in cfg.search.phases]
        phases[-1]["transitions"] = transitions
        cfg = _load(config, {**overrides, "search.phases": phases})
    _prefect_offline_defaults()
    from flows.collect import collect as collect_flow

    t0 = time.perf_counter()
    result = asyncio.run(collect_flow(cfg))
    result["stats"]["cli_wall_s"] = round(time.perf_counter() - t0, 3)
    if as_json:
        typer.echo(json.dumps(result, default=str))
        return
    _print_stats(f"collection {result['collection_id']}", result["stats"])
    typer.echo(f"batch: {result['batch_url']}")
    typer.echo(f"resume or rerun with: focus collect --collection-id {result['collection_id']}")


# ==== train and config commands (train-loop work; keep edits here self-contained) ====


@app.command()
def train(
    config: ConfigOpt = None,
    collection_id: Annotated[str | None, typer.Option(help="Base name; iteration i uses <id>-it<i>.")] = None,
    iterations: Annotated[int | None, typer.Option(help="Collect/train iterations.")] = None,
    trainer: Annotated[
        str | None, typer.Option(help="'local', 'tinker' or your trainer's import path 'module:function'.")
    ] = None,
    sets: SetOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON record per iteration.")] = False,
) -> None:
    """collect -> train -> publish weights -> collect ...; the same id resumes the loop."""
    cfg = _load(
        config,
        _overrides(sets, collection_id=collection_id, **{"train.iterations": iterations, "train.trainer": trainer}),
    )
    _prefect_offline_defaults()
    from flows.train_loop import train_loop

    try:
        records = asyncio.run(train_loop(cfg))
    except ConfigError as e:
        _fail(str(e))
        raise  # unreachable
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


@app.command()
def inspect(
    url: Annotated[str, typer.Argument(help="Batch URL printed by 'focus collect'.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Summary of a stored batch: rows, tokens, advantages, critic targets, usage per phase."""
    from storage import BatchStore, StorageError

    root, sep, _ = url.rstrip("/").rpartition("/batches/")
    if not sep:
        _fail(f"{url!r} is not a batch URL (expected <root>/batches/<collection>/iter-<n>)")
    try:
        batch = BatchStore(root).read(url)
    except (StorageError, OSError) as e:
        _fail(f"cannot read batch {url}: {e}", 1)
        raise  # unreachable
    summary = batch_summary(batch)
    if as_json:
        typer.echo(json.dumps(summary, default=str))
    else:
        _print_stats(f"batch {url}", summary)


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
    return out


def _print_stats(title: str, stats: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    table.add_column("statistic")
    table.add_column("value", justify="right")
    for k, v in stats.items():
        if isinstance(v, float):
            v = f"{v:.4g}"
        elif isinstance(v, (list, dict)):
            v = json.dumps(v, default=str)[:200]
        table.add_row(k, str(v))
    Console().print(table)


@app.command("serve-model")
def serve_model(
    port: Annotated[int, typer.Option(help="Port on 127.0.0.1 (0 picks a free one).")] = 8000,
    weights: Annotated[Path | None, typer.Option(help="Weights file (default: the packaged initial weights).")] = None,
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
    config: ConfigOpt = None,
    cron: Annotated[str, typer.Option(help="Schedule of the scheduled collection.")] = "0 * * * *",
    sets: SetOpt = None,
) -> None:
    """Register and serve the scheduled and the manual collection deployments (needs a Prefect server)."""
    cfg = _load(config, _overrides(sets))
    if not os.environ.get("PREFECT_API_URL"):
        _fail("focus deploy needs a Prefect server: set PREFECT_API_URL (e.g. after 'prefect server start')")
    from deployments.serve import serve_deployments

    serve_deployments(cfg, cron=cron)


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
