"""``focus config show``: the effective configuration and where each value came from."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from cli.common import ConfigOpt, SetOpt, fail, overrides, reflowed, summary
from tasks.config import ConfigError

config_app = typer.Typer(no_args_is_help=True, help="Show the effective configuration.")


def config_show(
    config: ConfigOpt = None,
    sets: SetOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print {field: {value, source}} as JSON.")] = False,
) -> None:
    """Every field of the effective configuration, its value and where it came from
    (default, the file, a FOCUS_* variable or --set), after validation."""
    from tasks.config import explain_config

    try:
        _cfg, rows = explain_config(config, overrides(sets))
    except ConfigError as e:
        fail(str(e))
        raise  # unreachable
    if as_json:
        typer.echo(json.dumps({k: {"value": v, "source": src} for k, v, src in rows}, default=str))
        return
    width = max(len(k) for k, _, _ in rows)
    texts = [json.dumps(v, default=str) for _, v, _ in rows]
    vwidth = min(48, max(len(t) for t in texts))
    for (key, _, source), text in zip(rows, texts, strict=True):
        typer.echo(f"{key:<{width}} = {text:<{vwidth}}  # {source}")


config_app.command("show", short_help=summary(config_show), help=reflowed(config_show))(config_show)
