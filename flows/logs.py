"""Logging of the ``focus`` command: quiet on the console, everything in a log file.

By default the console shows what an operator needs - the progress bars (or, into a
pipe, a line per tenth of a phase's budget), warnings about failed rollouts, the result or one error line
- and nothing of Prefect's or Dask's INFO chatter. Every record at INFO and above, with
tracebacks, goes to a log file whose path the error line names. ``-v`` adds Prefect's and
Dask's INFO records to the console (``-vv``: DEBUG).

Which records are "ours" is marked on the record (``extra={"focus_console": True}``, see
:func:`console_extra`), so a line logged through Prefect's run logger reaches the UI
(Prefect's API handler) and the console alike, while Prefect's own messages about the
same run stay in the file.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

#: Marks a record for the console in quiet mode.
CONSOLE_FLAG = "focus_console"
_FORMAT = "%(asctime)s.%(msecs)03d | %(levelname)-7s | %(name)s - %(message)s"
_CHATTY = ("prefect", "distributed", "dask", "httpx", "asyncio", "urllib3", "botocore", "s3fs", "aiobotocore", "fsspec")
#: Libraries whose loggers (and their children) may carry a stderr handler of their own.
_STDERR_OWNERS = frozenset({"distributed", "dask", "tornado", "bokeh"})


class UTCFormatter(logging.Formatter):
    """The log file's lines start with the UTC date and time, ISO 8601
    (``2026-12-07T09:26:07.123+00:00``), as the store's records and the collection ids
    (``collect-20261207-092607-...``) give them. They were local time with its offset:
    under a far ``TZ`` (``Pacific/Kiritimati``, UTC+14) a line's time and the id of the
    collection it names read a day apart. Dask worker processes format their lines with
    this class too (:func:`dask_workers_log_to`)."""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802 - logging's
        when = time.gmtime(record.created)
        return f"{time.strftime('%Y-%m-%dT%H:%M:%S', when)}.{int(record.msecs):03d}+00:00"


def console_extra() -> dict[str, Any]:
    """``extra=`` for a log call whose message the console should show in quiet mode."""
    return {CONSOLE_FLAG: True}


def default_log_file(kind: str = "collect") -> Path:
    """A fresh file under ``$XDG_STATE_HOME/focus/logs`` (``~/.local/state/focus/logs``),
    ``<kind>-<UTC yyyymmdd-HHMMSS>-<pid>.log``.
    A relative ``XDG_STATE_HOME`` is ignored, as the XDG specification says: the log went
    under the folder the command ran in, a different one from each folder."""
    state = os.environ.get("XDG_STATE_HOME", "")
    base = Path(state if os.path.isabs(state) else Path.home() / ".local" / "state") / "focus" / "logs"
    # UTC, as collection ids name their time (flows.preflight.new_collection_id): the
    # log of a run and its id name the same second whatever the machine's zone
    return base / f"{kind}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{os.getpid()}.log"


class _ConsoleHandler(logging.Handler):
    """Prints records through a rich console, so lines appear above a live progress bar."""

    def __init__(self, console: Any, quiet: bool) -> None:
        super().__init__()
        self.console = console
        self.quiet = quiet

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.quiet or bool(getattr(record, CONSOLE_FLAG, False))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if self.quiet:
                msg = record.getMessage()
                if record.levelno >= logging.WARNING:
                    msg = f"{record.levelname.lower()}: {msg}"
            else:
                msg = self.format(record)
            style = (
                "yellow" if record.levelno == logging.WARNING else "red" if record.levelno > logging.WARNING else None
            )
            self.console.print(msg, style=style, markup=False, highlight=False, soft_wrap=True)
        except Exception:  # noqa: BLE001 - logging must never raise
            self.handleError(record)


class _LogFile(logging.FileHandler):
    """The log file. When it cannot be written (a full disk), one warning line and no
    more attempts, instead of logging's traceback for every record that follows."""

    failed = False

    def emit(self, record: logging.LogRecord) -> None:
        if not self.failed:
            super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        if self.failed:
            return
        self.failed = True
        exc = sys.exc_info()[1]
        why = getattr(exc, "strerror", None) or exc
        sys.stderr.write(
            f"warning: cannot write the log file {self.baseFilename} ({why}); nothing more is logged to it\n"
        )


def setup(console: Any, *, verbosity: int = 0, log_file: Path | None = None) -> Path | None:
    """Route the process's logging: ``console`` (a rich Console) gets our lines (and with
    ``verbosity`` Prefect's and Dask's), ``log_file`` everything at INFO and above.

    Call after Prefect is imported (it installs its own console handler on import).
    Returns the log file's path (``None`` if it could not be created).
    """
    level = logging.DEBUG if verbosity > 1 else logging.INFO
    root = logging.getLogger()
    for h in list(root.handlers):
        if type(h).__name__ in ("PrefectConsoleHandler", "_ConsoleHandler", "_SafeStreamHandler"):
            root.removeHandler(h)
    console_handler = _ConsoleHandler(console, quiet=verbosity == 0)
    console_handler.setFormatter(logging.Formatter(_FORMAT, "%H:%M:%S"))
    console_handler.setLevel(level if verbosity else logging.INFO)
    root.addHandler(console_handler)
    path = None
    if log_file is not None:
        try:
            log_file.parent.mkdir(parents=True, exist_ok=True)
            # surrogateescape: a folder name the locale could not decode (LC_ALL=C, PYTHONUTF8=0)
            # is written as its bytes; strict stopped the log at the first line naming it
            fh: logging.FileHandler | None = _LogFile(log_file, encoding="utf-8", errors="surrogateescape", delay=True)
        except OSError:
            fh = None
        if fh is not None:
            fh.setFormatter(UTCFormatter(_FORMAT.replace(".%(msecs)03d", "")))
            fh.setLevel(level)
            root.addHandler(fh)
            path = log_file
    root.setLevel(level)
    for name in _CHATTY:
        logging.getLogger(name).setLevel(level)
    # distributed installs its own stderr handler on "distributed" and on the loggers its
    # config names ("distributed.client", "tornado", "bokeh", ...): a scheduler gone
    # mid-run printed distributed.client's traceback above the error line
    for name, lg in list(logging.root.manager.loggerDict.items()):
        if isinstance(lg, logging.Logger) and name.split(".")[0] in _STDERR_OWNERS:
            for h in list(lg.handlers):
                if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler):
                    lg.removeHandler(h)
            lg.propagate = True
    if verbosity < 2:  # one line per HTTP request says nothing until one debugs the client
        logging.getLogger("httpx").setLevel(logging.WARNING)
    # Prefect's internal logger writes to stderr on its own; keep it for -v only
    internal = logging.getLogger("prefect._internal")
    internal.propagate = True
    for h in list(internal.handlers):
        internal.removeHandler(h)
    # Prefect's API log handler writes "--- Error logging to API ---" and the error to
    # stderr for every batch of records it cannot send (a Prefect server gone mid-run),
    # unless logging.raiseExceptions is off: those lines came between the progress and
    # the error line; the cause is in that line and the file. Seen with -vv.
    logging.raiseExceptions = verbosity > 1
    logging.captureWarnings(True)
    return path


def dask_workers_log_to(log_file: Path, env: MutableMapping[str, str] | None = None) -> None:
    """Route the ``distributed`` loggers of Dask worker processes started after this
    call (they inherit ``env``, default ``os.environ``) into ``log_file``, at INFO, and
    off the console.

    Worker processes configure logging from ``DASK_LOGGING__*`` variables when they
    import ``distributed``; a dictConfig there (``version`` set) replaces Dask's stderr
    handler. Without it, a worker's own records reach the terminal: even at WARNING,
    a ``LocalCluster`` being closed can have a worker log "Failed to communicate with
    scheduler during heartbeat" with a traceback (distributed terminates the
    scheduler before its workers). Variables the user set are left alone.
    """
    target: MutableMapping[str, str] = os.environ if env is None else env
    if any(k.startswith("DASK_LOGGING") for k in target):
        return
    target.update(
        {
            "DASK_LOGGING__VERSION": "1",
            "DASK_LOGGING__DISABLE_EXISTING_LOGGERS": "False",
            "DASK_LOGGING__FORMATTERS__FOCUS__FORMAT": _FORMAT.replace(".%(msecs)03d", ""),
            # the UTC day and time, as this process's lines (dictConfig imports the class)
            "DASK_LOGGING__FORMATTERS__FOCUS__CLASS": f"{__name__}.{UTCFormatter.__name__}",
            "DASK_LOGGING__HANDLERS__FILE__CLASS": "logging.FileHandler",
            "DASK_LOGGING__HANDLERS__FILE__FILENAME": str(log_file),
            # UTF-8 as this process writes the file, whatever the locale: under LC_ALL=C with
            # PYTHONUTF8=0 a worker's line with a non-ASCII character ("tâche") was lost
            # ("--- Logging error --- UnicodeEncodeError" on the worker's standard error)
            "DASK_LOGGING__HANDLERS__FILE__ENCODING": "utf-8",
            "DASK_LOGGING__HANDLERS__FILE__ERRORS": "surrogateescape",
            "DASK_LOGGING__HANDLERS__FILE__FORMATTER": "focus",
            "DASK_LOGGING__LOGGERS__DISTRIBUTED__LEVEL": "INFO",
            "DASK_LOGGING__LOGGERS__DISTRIBUTED__HANDLERS": "['file']",
            "DASK_LOGGING__LOGGERS__DISTRIBUTED__PROPAGATE": "False",
            # tornado runs a worker's callbacks: one that raised (its memory monitor under
            # `ulimit -n 64`: Too many open files) printed "Exception in callback" and a
            # traceback on the terminal, as the command's own tornado records do not
            "DASK_LOGGING__LOGGERS__TORNADO__HANDLERS": "['file']",
            "DASK_LOGGING__LOGGERS__TORNADO__PROPAGATE": "False",
        }
    )
