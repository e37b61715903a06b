"""``focus serve-model``: the embedded tiny model as a server, until Ctrl-C."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from cli.common import fail, help_default


def serve_model(
    port: Annotated[int, typer.Option(help="Port on 127.0.0.1 (0 picks a free one).", metavar="PORT")] = 8000,
    weights: Annotated[
        Path | None, typer.Option(help=help_default("Weights file.", "the packaged initial weights"), metavar="PATH")
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
        fail(f"model server exited with code {server.proc.returncode}", 1)
