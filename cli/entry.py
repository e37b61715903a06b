"""The ``focus`` console command's entry: start the slow part first, then parse.

Most of the start-up of ``focus collect`` on the embedded model is the model server
importing torch (about a second), and that import does not depend on the
configuration. So this entry starts a :class:`focus.backends.local.WarmServer` before it
imports the command line (typer, pydantic and the configuration: about 0.4 s more), and
``focus collect`` hands it its command line once the configuration is known. When no
embedded model is needed (another model service, an error, a finished collection) it
is stopped unused: what it cost is a fraction of a second of the other core.
"""

from __future__ import annotations

import sys
from typing import Any


def wants_embedded_model(argv: list[str]) -> bool:
    """Whether a command line may start the embedded model server: ``collect`` without
    ``--model-url`` or help. The configuration decides in the end."""
    if not argv or argv[0] != "collect":
        return False
    return not any(a in ("-h", "--help") or a.startswith("--model-url") for a in argv[1:])


def main() -> None:  # pragma: no cover - console entry point (tested through the installed command)
    warm: Any = None
    if wants_embedded_model(sys.argv[1:]):
        from focus.backends.local import WarmServer

        try:
            warm = WarmServer()
        except OSError:
            warm = None  # a cold start later says what is wrong, if anything is
    from cli.app import main as cli_main

    cli_main(warm_model=warm)
