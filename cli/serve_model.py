"""``focus serve-model``: the embedded tiny model as a server, until Ctrl-C."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from cli.common import fail, help_default
from cli.interrupts import serving


def serve_model(
    port: Annotated[int, typer.Option(help="Port on 127.0.0.1 (0 picks a free one).", metavar="PORT")] = 8000,
    weights: Annotated[
        Path | None, typer.Option(help=help_default("Weights file.", "the packaged initial weights"), metavar="PATH")
    ] = None,
) -> None:
    """Serve the embedded tiny model (OpenAI-compatible completions, weight reload) until Ctrl-C."""
    from focus.backends import LocalModelServer
    from focus.policy import PolicyError

    if not 0 <= port <= 65535:  # the server's own 'OverflowError: bind(): port must be 0-65535.', exit 1
        fail(f"--port {port}: a port is 0-65535 (0 picks a free one)")
    server = LocalModelServer(weights, port=port)
    try:
        server.start()
    except (PolicyError, OSError) as e:  # a port in use, weights that are not there: one line
        server.stop()
        busy = "Address already in use" in str(e)
        fail(f"{e}" + (f" (127.0.0.1:{port}); choose another --port, 0 picks a free one" if busy else ""), 1)
    serving()  # Ctrl-C from here on stops the server below (before: one line, cli.entry)
    with server:
        try:  # from the line on: a Ctrl-C right after it stops the server the same way
            typer.echo(
                f"serving the local model at {server.url} (policy version {server.policy_version}); Ctrl-C stops"
            )
            while server.proc is not None and server.proc.poll() is None:
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
    if server.proc is not None and server.proc.returncode not in (0, None, -15):
        fail(f"model server exited with code {server.proc.returncode}", 1)
