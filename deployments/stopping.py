"""How ``focus deploy`` stops: on Ctrl-C, SIGTERM or SIGHUP, with the runs it serves in flight.

Prefect's runner starts each flow run in a process of its own (``python -m
prefect.engine``), in the serving process's process group. A terminal's Ctrl-C is a
SIGINT to the whole foreground group, so it reached every flow-run process too:

* a run in progress ended with ``KeyboardInterrupt``: ``Crashed`` on the server (``Execution
  was cancelled by the runtime environment.``) and two ERROR lines of Prefect's on the
  console above the stop line;
* a run that had just completed, whose process still sent its last events, printed a
  ``KeyboardInterrupt`` traceback from Prefect's ``atexit`` drain on the console.

The flow-run processes now start in a session of their own (:func:`apart`): the signals
a terminal sends (Ctrl-C to the foreground group; SIGHUP, which the shell sends its jobs'
groups when the terminal hangs up) reach only the serving process, which stops the runs
itself, the way it stops them on a SIGTERM (a service manager's stop) and the UI's Cancel
does: each run in progress is told that it is cancelled and sent SIGTERM, so it stops as on
Ctrl-C - finished steps saved, its lease released - and ends ``Cancelled``, with
:data:`CANCELLED` as the state's message; a Retry resumes it after its last finished step.
A second signal kills the runs' processes at once (what they saved stays resumable).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

#: The state message of a run cancelled because ``focus deploy`` stopped.
CANCELLED = (
    "focus deploy stopped ({by}) while it ran: its finished steps are saved; a Retry resumes it after the last one"
)


@contextlib.contextmanager
def apart() -> Iterator[None]:
    """While it lasts, the flow-run processes Prefect's runner starts here (``python -m
    prefect.engine``) start in a session of their own, so a terminal's signals do not
    reach them: ``start_new_session``, through the module-level ``run_process`` of
    Prefect's engine starter (its documented way to override how it starts them; Prefect
    starts the runs of its own workspaces so). The runner still stops a run by signalling
    its process alone, as before. A Prefect without that name starts them as before."""
    try:
        from prefect.runner import _starter_engine
    except ImportError:  # a private module: a Prefect that lacks it starts them as before
        yield
        return

    original = getattr(_starter_engine, "run_process", None)
    if original is None:
        yield
        return

    def run_process(*args: Any, **kwargs: Any) -> Any:
        if sys.platform != "win32":
            kwargs.setdefault("start_new_session", True)
        return original(*args, **kwargs)

    _starter_engine.run_process = run_process
    try:
        yield
    finally:
        _starter_engine.run_process = original


@dataclass
class Stopped:
    """Why ``focus deploy`` stopped, and what became of the runs it served then."""

    by: str
    #: The names of the runs in progress that it cancelled.
    cancelled: list[str] = field(default_factory=list)
    #: A second signal killed their processes at once.
    killed: bool = False

    def runs(self) -> str:
        """The stop line's part about the runs in progress ('' when there were none)."""
        if not self.cancelled:
            return ""
        names = ", ".join(f"'{n}'" for n in self.cancelled)
        how = "cancelled, then killed at once (a second signal)" if self.killed else "cancelled"
        one = len(self.cancelled) == 1
        return (
            f"flow run{'' if one else 's'} {names} {how} (finished steps saved: a Retry in the UI resumes "
            f"{'it' if one else 'each'} after its last finished step); "
        )


def stopping_runner(limit: int) -> Any:
    """Prefect's runner (pausing its deployments when it stops) that stops the same way
    on SIGINT, SIGTERM and SIGHUP: the runs in progress cancelled (:data:`CANCELLED`),
    and a second signal kills their processes. ``stopped`` says why, once it has."""
    from prefect.runner import Runner

    class Stopping(Runner):  # type: ignore[misc]
        """Prefect's runner stopped on SIGTERM only (without a word, and Ctrl-C crashed the
        runs in progress, which it reached too); a SIGHUP killed the process where it
        stood: no line, the deployments left unpaused (their scheduled runs piled up as
        Late with nothing to serve them)."""

        stopped: Stopped | None = None

        def handle_sigint(self, *args: Any) -> None:
            self._on_signal("SIGINT")

        def handle_sigterm(self, *args: Any, **kwargs: Any) -> None:
            self._on_signal("SIGTERM")

        def handle_sighup(self, *args: Any) -> None:
            self._on_signal("SIGHUP")

        def _on_signal(self, name: str) -> None:
            if self.stopped is not None:  # a second signal: at once
                if not self.started and not self.stopping:
                    raise KeyboardInterrupt  # not serving yet: nothing to stop in order
                self.stopped.killed = self._kill_runs() > 0
                return
            self.stopped = Stopped(name)
            if not self.started and not self.stopping:
                # before its loop is up Prefect's handler exits 0 where it stands: no
                # line, the deployments left unpaused; the stop waits for the loop
                return
            self._stop()

        def _stop(self) -> None:
            """Prefect's graceful stop, as its SIGTERM handler starts it (which logs
            "SIGTERM received" whatever the signal): cancel the runs, end the loops."""
            if not self.started or self._loop is None:
                return  # stopped already, or stopping
            by = self.stopped.by if self.stopped is not None else "a stop"
            self._logger.info("%s received: the runs in progress are cancelled, the deployments paused", by)
            self.stopping = True
            self.execute_in_background(self.astop)

        def _kill_runs(self) -> int:
            """SIGKILL the runs' processes; how many there were."""
            manager, killed = self._process_manager, 0
            for run_id in manager.flow_run_ids():
                handle = manager.get(run_id)
                if handle is not None:
                    with contextlib.suppress(OSError):
                        handle.hard_kill()
                        killed += 1
            return killed

        async def cancel_all(self) -> None:
            """Cancel the runs in progress, with a state message that says why (Prefect's
            said ``Runner is shutting down.``), noting their names for the stop line. A run
            that has ended, whose process still sends its last events, is left to finish."""
            by = self.stopped.by if self.stopped is not None else "SIGTERM"
            for run_id in self._process_manager.flow_run_ids():
                try:
                    run = await self._client.read_flow_run(run_id)
                    if run.state is not None and run.state.is_final():
                        continue
                    if self.stopped is not None:
                        self.stopped.cancelled.append(run.name)
                    await self._cancellation_manager.cancel(run, state_msg=CANCELLED.format(by=by))
                except Exception:
                    self._logger.exception("Exception while cancelling flow run '%s'", run_id)

        async def __aenter__(self) -> Any:
            entered = await super().__aenter__()
            if self.stopped is not None:  # stopped while it started: it stops now, as on a signal
                self._stop()
            return entered

    return Stopping(pause_on_shutdown=True, limit=limit)
