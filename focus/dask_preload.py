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
"""

from __future__ import annotations

import signal
import threading
from typing import Any


def dask_setup(worker: Any) -> None:
    for s in (signal.SIGINT, signal.SIGHUP):
        try:
            signal.signal(s, signal.SIG_IGN)
        except ValueError:  # not the main thread of its process: not a worker process of its own
            return


def tracker_ignores_hangup() -> None:
    """Start multiprocessing's resource tracker (if it is not running) with SIGHUP
    ignored, which it inherits; this process's handler is put back at once."""
    from multiprocessing import resource_tracker

    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers are the main thread's to set; the tracker starts as it would
    old = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        resource_tracker.ensure_running()
    finally:
        signal.signal(signal.SIGHUP, old)
