"""Preloaded into the worker processes of the ``LocalCluster`` that
:class:`focus.dask_execution.DaskExecution` starts (Dask's ``preload``; ``dask_setup``).

Those processes are children of the program that owns the cluster, in its process
group, so a terminal's Ctrl-C (SIGINT to the whole foreground group) and its hang-up
(SIGHUP) reached each worker as well as the program: every worker printed a 30-line
``KeyboardInterrupt`` traceback above the program's own line (``focus collect --dask``:
two workers, about 70 lines), and a hang-up left multiprocessing's resource tracker
printing ``KeyError`` tracebacks. The program that owns the cluster stops it on its way
out (and a worker exits by itself once that program is gone), so the workers ignore
these two signals; :func:`tracker_ignores_hangup` starts the resource tracker the
workers share so that it ignores SIGHUP as it ignores SIGINT and SIGTERM (killed by
it, it was started again without the workers' records, and printed a traceback for
each).

A worker's warnings (a model service that does not answer, a server that ignores seeds)
went to Python's last-resort handler: the bare message on standard error, where the
same warning of an in-process run says ``warning: ...``, and not in the log file.
:func:`warnings_as_the_command_says_them` makes them the command's lines.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any


def dask_setup(worker: Any) -> None:
    for s in (signal.SIGINT, signal.SIGHUP):
        try:
            signal.signal(s, signal.SIG_IGN)
        except ValueError:  # not the main thread of its process: not a worker process of its own
            return
    warnings_as_the_command_says_them()


#: The variable the command sets (``flows.logs.dask_workers_log_to``) when its console is
#: quiet: its workers' Dask records go to this log file.
LOG_FILE_VARIABLE = "DASK_LOGGING__HANDLERS__FILE__FILENAME"


class _Prefixed(logging.Formatter):
    """``warning: <message>``, as the command's quiet console writes a warning."""

    def format(self, record: logging.LogRecord) -> str:
        return f"{record.levelname.lower()}: {record.getMessage()}"


def warnings_as_the_command_says_them(
    stream: Any = None, environ: dict[str, str] | os._Environ[str] | None = None
) -> None:
    """A worker process's warnings and errors on standard error (``stream``) as the
    command writes its own: ``warning: <message>``. With the command's log file
    (:data:`LOG_FILE_VARIABLE`: the console is quiet) they go to the file too, and the
    console shows only those marked for it (``focus_console``), as in-process. A root
    logger with handlers (the user's logging configuration) is left alone."""
    root = logging.getLogger()
    if root.handlers:
        return
    env = os.environ if environ is None else environ
    log_file = env.get(LOG_FILE_VARIABLE)
    console = logging.StreamHandler(stream if stream is not None else sys.stderr)
    console.setFormatter(_Prefixed())
    if log_file:
        console.addFilter(lambda record: bool(getattr(record, "focus_console", False)))
        to_file = logging.FileHandler(log_file, encoding="utf-8", errors="surrogateescape", delay=True)
        form, date = (env.get(f"DASK_LOGGING__FORMATTERS__FOCUS__{k}") for k in ("FORMAT", "DATEFMT"))
        to_file.setFormatter(logging.Formatter(form, date))
        root.addHandler(to_file)
    root.addHandler(console)


def tracker_ignores_hangup(stderr: str | os.PathLike[str] | None = None) -> None:
    """Start multiprocessing's resource tracker (if it is not running) with SIGHUP
    ignored, which it inherits; this process's handler is put back at once.

    ``stderr``: a file (the command's log file) the tracker writes to instead of this
    process's standard error. A command stopped while its ``LocalCluster`` started left
    the cluster's semaphores to the tracker, which printed ``UserWarning: resource_tracker:
    There appear to be 12 leaked semaphore objects to clean up at shutdown`` (two lines)
    below the command's last line, after the command had exited."""
    from multiprocessing import resource_tracker

    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers are the main thread's to set; the tracker starts as it would
    old = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with _stderr_to(stderr):  # the tracker inherits descriptor 2 as it is at its start
            resource_tracker.ensure_running()
    finally:
        signal.signal(signal.SIGHUP, old)


@contextlib.contextmanager
def _stderr_to(path: str | os.PathLike[str] | None) -> Iterator[None]:
    """Descriptor 2 goes to ``path`` (appended) for the block; nothing if ``None`` or it
    cannot be opened."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600) if path is not None else None
    except OSError:
        fd = None
    if fd is None:
        yield
        return
    saved = os.dup(2)
    try:
        os.dup2(fd, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)
