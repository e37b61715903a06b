"""The train loop's trainer steps in threads of their own, stopped when the loop is interrupted.

A trainer blocks for as long as training takes, so the loop (:mod:`flows.loop`, the
``train_loop`` flow) runs it in a daemon thread rather than the event loop's executor,
whose shutdown would join it. An interrupted loop stops that thread and waits for it
(bounded) before it unwinds: see :func:`in_daemon_thread`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from flows.logs import console_extra

_T = TypeVar("_T")
log = logging.getLogger("focus.train")


#: Seconds an interrupted loop waits for its trainer's thread to stop before it goes on
#: without it (a trainer inside one long call, which the stop reaches only when it returns).
STOP_WAIT_S = 10.0


class TrainerStopped(BaseException):
    """Raised inside a trainer's thread when the loop awaiting it is cancelled (Ctrl-C):
    a BaseException, so that a trainer's ``except Exception`` does not keep it training."""


async def in_daemon_thread(fn: Callable[..., _T], *args: Any) -> _T:
    """``fn(*args)`` in a daemon thread of its own (with this context, as
    ``asyncio.to_thread``): training blocks for as long as it takes, and an interrupted
    loop must be able to exit without waiting for it, which the event loop's executor
    would (its shutdown joins every thread). What the trainer leaves unfinished is not
    recorded, so a rerun trains that iteration again.

    Cancelled (the first Ctrl-C), it stops the thread (:class:`TrainerStopped`, raised
    in it between two Python instructions) and waits for it, at most
    :data:`STOP_WAIT_S`, before the cancellation goes on. Left running, the trainer
    went on writing the next version after the loop had released its lease, and a
    Python caller's process ended with the thread inside torch: abort, exit -6,
    ``terminate called without an active exception``. Every weight file is written
    atomically, so a stopped trainer leaves no half-written one."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[_T] = loop.create_future()
    ctx = contextvars.copy_context()
    started = threading.Event()

    def settle(out: Any, error: BaseException | None) -> None:
        if done.done():
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(out)

    def run() -> None:
        try:  # a stop that lands after fn has returned ends the thread here, quietly
            started.set()
            out, error = None, None
            try:
                out = ctx.run(fn, *args)
            except BaseException as e:  # noqa: BLE001 - handed to the awaiting task
                error = e
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits any more
                loop.call_soon_threadsafe(settle, out, error)
        except TrainerStopped:
            pass

    thread = threading.Thread(target=run, name=f"focus-{fn.__name__}", daemon=True)
    thread.start()
    try:
        return await done
    except asyncio.CancelledError:
        await _stop_thread(thread, started)
        raise


async def _stop_thread(thread: threading.Thread, started: threading.Event) -> None:
    """Raise :class:`TrainerStopped` in ``thread`` (once, and only inside its ``run``)
    and wait for it to end, at most :data:`STOP_WAIT_S`; a line says so when that takes
    over a second (a trainer inside one long call: a sleep, a request, a large kernel)."""
    import ctypes

    if thread.is_alive() and started.is_set() and thread.ident is not None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(TrainerStopped))
    clock = asyncio.get_running_loop().time
    start, said = clock(), False
    while thread.is_alive() and clock() < start + STOP_WAIT_S:
        if not said and clock() > start + 1.0:
            said = True
            log.warning(
                "interrupted: waiting for the trainer to stop, at most %.0f s: it is inside one long call "
                "(interrupt again to stop at once)",
                STOP_WAIT_S,
                extra=console_extra(),
            )
        await asyncio.sleep(0.02)
    if thread.is_alive():
        log.warning(
            "the trainer did not stop within %.0f s; the loop stops without it "
            "(what it finishes now is not recorded: a rerun trains the iteration again)",
            STOP_WAIT_S,
            extra=console_extra(),
        )
