"""The ``focus`` command line: the commands of this package on one typer app.

Any error ends a command with one line naming the cause (:mod:`flows.errors`) and a
non-zero status; the traceback is in the log file, or on the terminal with ``--debug``.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING, Any

import typer
from typer.core import TyperArgument, TyperOption

from cli.collect import collect
from cli.common import reflowed, summary
from cli.config import config_app
from cli.deploy import deploy
from cli.inspect import inspect
from cli.serve_model import serve_model
from cli.train import train

if TYPE_CHECKING:
    from focus.backends.local import WarmServer

# Typer prints a type placeholder for every option ("<str>", "<bool>" for flags too)
# beside the metavars we name (SECONDS, PATH): one style only - the named metavar (every
# option with a value has one; tests/test_cli.py checks), nothing for a flag.
TyperOption.display_type_rich = lambda self, ctx: None if (self.is_flag or self.count) else self.metavar  # type: ignore[method-assign]
# ... and an argument's name column is its metavar already (URL): no "<str>" beside it
TyperArgument.display_type_rich = lambda self, ctx: None  # type: ignore[method-assign]


def _listed(command: Any, name: str | None = None) -> Any:
    """``command`` on the app, listed in ``focus --help`` by :func:`cli.common.summary`,
    its ``--help`` text :func:`cli.common.reflowed`."""
    return app.command(name, short_help=summary(command), help=reflowed(command))(command)


app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="FOCUS: branching rollout collection for RL of LLM agents.",
    context_settings={"help_option_names": ["-h", "--help"]},
)
_listed(collect)
_listed(train)
app.add_typer(config_app, name="config")
_listed(inspect)
_listed(serve_model, "serve-model")
_listed(deploy)


def run(args: list[str] | None = None, **extra: Any) -> int:
    """Run the app on ``args`` (the command line's by default); its exit status.

    A wrong command line (an unknown option or command, a value of the wrong type, a
    missing argument) is one line and status 2, as every other error of the command:
    ``error: No such option: --bogus (Possible options: --verbose); focus collect -h
    lists the options``. Typer drew a usage line, a hint and a box around the message:
    five or six lines on standard error."""
    try:
        rv = app(args=args, standalone_mode=False, **extra)
    except Exception as e:  # noqa: BLE001 - a usage error is one line; anything else goes on up
        code = getattr(e, "exit_code", None)
        if not hasattr(e, "format_message") or not isinstance(code, int):  # not click's UsageError and kin
            raise
        if type(e).__name__ == "NoArgsIsHelpError":  # `focus`, `focus config`: the help is printed
            return code
        ctx = getattr(e, "ctx", None)
        where = f"; {ctx.command_path} -h lists the options" if ctx is not None else ""
        sys.stderr.write(f"error: {e.format_message().rstrip('.')}{where}\n")
        return code
    except typer.Abort:
        sys.stderr.write("error: aborted\n")
        return 1
    return rv if isinstance(rv, int) else 0


def main(warm_model: WarmServer | None = None) -> None:  # pragma: no cover - console entry point
    """``focus``: run the command, then leave without Python's finalisation. Tearing down
    Prefect's ~1500 modules took 1.4 s after every collection, the library's 0.1 s
    (measured); everything is written and closed by then (logs flushed, servers stopped,
    Prefect's logs and events sent), so nothing is lost by skipping it. ``warm_model``:
    a model server the console entry started (:mod:`cli.entry`), stopped here if the
    command did not use it."""
    try:
        code = run(obj={"warm_model": warm_model})
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        if warm_model is not None:
            warm_model.discard()

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    main()
