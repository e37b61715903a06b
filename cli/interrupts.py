"""Stopping a command cleanly on SIGINT (Ctrl-C), SIGTERM or SIGHUP (its terminal closed).

The first signal cancels the command's main task: the collection stops launching,
abandons the rollouts in flight (never recorded, so never counted as failures),
finishes the saves already under way and releases its lease; the command then stops
the services it started and exits 130 (SIGINT) or 143 (SIGTERM) with one line saying
how to resume. A second signal exits at once, the services' processes killed first:
the store stays resumable, since every save is atomic and what an interrupted save
leaves is swept by the next run. A signal while the services start stops the start.

SIGHUP, which a terminal that closes (an ssh session that drops) sends, killed the
command where it stood: no line, the write lease left behind, a Prefect run left
running. It stops the command as SIGTERM does (exit 129), unless it was ignored when
the command started (``nohup``), which is left as it is.

Signals are counted from the interpreter's wake-up descriptor (:class:`_Deliveries`),
not from the calls of the handler: Python runs a signal's handler once however often
the signal came before the main thread got back to its bytecode (one "tripped" flag per
signal), so two Ctrl-Cs 50 ms apart on a loaded machine, or during a long call into C,
read as one and the second's "stop now" was lost; the descriptor gets a byte per delivery.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable, Coroutine
from types import FrameType
from typing import Any, TypeVar

_T = TypeVar("_T")
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


#: The handlers the console entry replaced with its one-line stop (:mod:`cli.entry`).
REPLACED: dict[int, Any] = {}


def serving() -> None:
    """Put back the signal handlers the console entry replaced: a server that runs until
    Ctrl-C (`focus serve-model`, `focus deploy`) stops on it its own way."""
    for s, handler in REPLACED.items():
        signal.signal(s, handler)
    REPLACED.clear()


def handled() -> list[int]:
    """The signals a command stops on: :data:`SIGNALS`, but SIGHUP when it is ignored
    (``nohup focus ...``: the command is to outlive its terminal)."""
    return [s for s in SIGNALS if not (s == signal.SIGHUP and signal.getsignal(s) == signal.SIG_IGN)]


def drawing(console: Any) -> bool:
    """Whether ``console`` (rich's) shows a live display now: a progress bar, a spinner.
    Read from rich's stack of live displays, which has no public accessor; a rich
    without it reads as not drawing (the line then follows the cursor as before)."""
    return bool(getattr(console, "_live_stack", None))


class Interrupts:
    """The signals a command received, and what it does about them (a context manager)."""

    def __init__(self) -> None:
        self.signals: list[int] = []
        #: Called (best effort) before a second signal ends the process at once.
        self.on_exit_now: list[Callable[[], None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None
        self._done = False
        self._old: dict[int, Any] = {}
        #: The command that resumes the work, and the log file: the line a second signal leaves.
        self.resume: str | None = None
        self.log_file: str | None = None
        #: The rich console the command draws its bars and spinners on (:func:`drawing`).
        self.console: Any = None
        #: What stopped the work from inside (:meth:`stop`): raised by :meth:`run` in its place.
        self.error: BaseException | None = None

    def __enter__(self) -> Interrupts:
        self._deliveries = _Deliveries()
        for s in handled():
            self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._old.items():
            signal.signal(s, handler)
        self._deliveries.close()

    @property
    def code(self) -> int:
        """The exit status of the first signal: 128 + its number (130, 143, 129)."""
        return 128 + self.signals[0]

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # every delivery since the last call (this one's among them); none read: the
        # descriptor is not ours (another set it meanwhile), then this call is one.
        # Signals pending together reach the descriptor in the kernel's order (SIGTERM
        # before SIGINT) and the handlers in the signals' (SIGINT first): this call's
        # signal counts first, as it did when each call was one
        got = self._deliveries.read(self._old)
        if signum in got:
            got.remove(signum)
            got.insert(0, signum)
        self.signals.extend(got or [signum])
        if len(self.signals) > 1:
            for kill in self.on_exit_now:
                with contextlib.suppress(Exception):
                    kill()
            self._last_words(self.signals[1])  # the second (a first and a second can come in one call)
            os._exit(self.code)
        if self._done:
            return  # the work is finished: let the command end as it would
        if self._task is not None and self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._task.cancel)
        else:
            raise KeyboardInterrupt  # nothing running yet (services starting): unwind

    def _last_words(self, signum: int) -> None:
        """The line of a second signal (it exited without a word): on the terminal and in
        the log file, each best effort (a closed terminal takes nothing)."""
        line = (
            f"interrupted again ({signal.Signals(signum).name}): stopped at once, the command's servers killed; "
            "finished steps are saved" + (f"; resume with: {self.resume}" if self.resume else "")
        )
        # a live bar or spinner leaves the cursor at the end of its last line: the line
        # went on after the bar's text ('... 0/32 rollouts running 0:00:00interrupted
        # again ...'); nothing redraws the bar once the process has exited
        lead = "\n" if drawing(self.console) else ""
        with contextlib.suppress(OSError):
            os.write(2, f"{lead}{line}\n".encode())
        if self.log_file:
            with contextlib.suppress(OSError), open(self.log_file, "a", encoding="utf-8") as f:
                f.write(f"{line}\n")

    def stop(self, error: BaseException) -> None:
        """Stop the work as a first signal does, from any thread, and end :meth:`run` with
        ``error`` (the embedded model server gone for good: the calls would wait
        ``outage_wait_s`` for it). Nothing if a signal or the end of the work came first."""
        if self.error is not None or self.signals or self._done:
            return
        self.error = error
        loop, task = self._loop, self._task
        if task is not None and loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(task.cancel)

    def run(self, main: Coroutine[Any, Any, _T]) -> _T:
        """``asyncio.run(main)``, cancelled by the first signal."""

        async def guarded() -> _T:
            self._loop, self._task = asyncio.get_running_loop(), asyncio.current_task()
            try:
                return await main
            finally:
                self._task = None

        self._own_prefects_sigterm()
        try:
            out = asyncio.run(guarded())
        except BaseException as e:
            # Prefect's flow engine puts its own SIGTERM handler in place of ours while a
            # flow runs; it raises TerminationSignal from wherever the loop was (asyncio.run
            # then cancels the flow, as a first signal does): the same stop, said the same
            # way (it was a 50-line traceback and exit 1)
            sig = getattr(e, "signal", None)
            if sig in SIGNALS and not self.signals:
                self.signals.append(sig)
            if self.error is not None and not self.signals:
                raise self.error from e  # the cancellation it caused, or what the work raised meanwhile
            raise
        self._done = True
        return out

    def _own_prefects_sigterm(self) -> None:
        """While a flow runs, Prefect's engine answers SIGTERM with its own handler, which
        raises ``TerminationSignal`` in whatever frame runs (the event loop's select, a
        rollout's task): `focus collect --prefect` and `focus train --prefect` stopped
        with a 50-line traceback (``TerminationSignal`` or ``CancelledError``) and exit 1.
        In a command there is no Prefect runner whose cancellation that handler serves, so
        the engine installs this one instead (it looks its handler up by name when the
        flow starts): SIGTERM stops the flow as a Ctrl-C does."""
        import sys

        engine = sys.modules.get("prefect.utilities.engine")
        if engine is not None and callable(getattr(engine, "_prefect_sigterm_handler", None)):
            engine._prefect_sigterm_handler = self._handle  # type: ignore[attr-defined]

    def line(self, resume: str, finished: str | None = None) -> str:
        """The one line an interrupted command ends with; ``finished``: what its work
        completed all the same (the line then says that, not how to resume)."""
        name = signal.Signals(self.signals[0]).name
        if finished:
            return f"interrupted ({name}): {finished}"
        return f"interrupted ({name}): finished steps are saved, nothing half-made is kept; resume with: {resume}"


class _Deliveries:
    """The signals delivered to this process, one byte each, from the wake-up descriptor
    (:func:`signal.set_wakeup_fd`) this installs until :meth:`close`, which puts the
    previous one back. The interpreter's C-level handler writes the byte at each delivery,
    before the Python-level handler runs (once for any number of deliveries). Outside the
    main thread, where no descriptor can be set, :meth:`read` reads nothing."""

    def __init__(self) -> None:
        self._read = self._write = -1
        self._old = -1
        try:
            self._read, self._write = os.pipe()
            os.set_blocking(self._read, False)
            os.set_blocking(self._write, False)
            self._old = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        except (OSError, ValueError):  # not the main thread, or no descriptor left
            self.close()

    def read(self, wanted: Any) -> list[int]:
        """The deliveries of the signals in ``wanted`` not read before, in order."""
        if self._read < 0:
            return []
        got = b""
        with contextlib.suppress(OSError):  # BlockingIOError: nothing (more) to read
            while chunk := os.read(self._read, 512):
                got += chunk
        return [b for b in got if b in wanted]

    def close(self) -> None:
        if self._write >= 0:
            with contextlib.suppress(OSError, ValueError):
                now = signal.set_wakeup_fd(self._old, warn_on_full_buffer=False)
                if now != self._write:  # another replaced ours meanwhile: theirs stays
                    signal.set_wakeup_fd(now)
        for fd in (self._read, self._write):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._read = self._write = -1
