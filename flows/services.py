"""The services a command needs and its configuration leaves implicit, started and
stopped in one place.

:class:`Services` owns three lifecycles:

- a temporary Prefect API server (:class:`flows.server.TemporaryServer`), when asked
  for (``prefect=True``) and none is configured: the ``focus`` command's flows need one;
- the embedded model server (``model.kind = "local"`` without a URL), started from a
  process the console entry warmed up when there is one (:mod:`cli.entry`);
- a Dask LocalCluster (``execution.kind = "dask"`` without an address).

:meth:`Services.start` launches the servers side by side and returns at once, so a
command can import what it needs and set up its logging meanwhile; :meth:`Services.wait`
starts the Dask cluster, waits for the servers and returns the
configuration that names them (``model.url``, ``execution.address``), which is all the
collection ever learns of them: nothing is shared in-process. Whatever the command
started before a flow runs, the flow finds named in its configuration and starts
nothing again; a flow started by a deployment starts what it needs itself, through the
same class (:func:`services_in_thread`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tasks.config import FocusConfig

if TYPE_CHECKING:
    from collections.abc import Callable

    from flows.server import TemporaryServer
    from focus.backends.local import LocalModelServer, WarmServer
    from focus.dask_execution import DaskExecution

log = logging.getLogger("focus.services")

#: What a command does when the embedded model server it started is gone for good (its
#: keeper's restarts spent): stop the run with that error (:meth:`cli.interrupts.Interrupts.stop`).
#: A context variable, so the train loop's server, started in a worker thread of the
#: command's event loop, finds it too; unset (a flow run by a deployment), the keeper
#: logs a warning and the calls wait out ``model.http.outage_wait_s``.
ON_MODEL_GONE: contextvars.ContextVar[Callable[[Exception], None] | None] = contextvars.ContextVar(
    "focus_on_model_gone", default=None
)


class Services:
    """Start what ``config`` needs and does not name; stop it again (a context manager
    whose value is the configuration that names what was started)."""

    def __init__(
        self,
        config: FocusConfig,
        *,
        prefect: bool = False,
        model: bool = True,
        warm: WarmServer | None = None,
        log_file: Path | None = None,
    ) -> None:
        self.config = config
        self.want_prefect, self.want_model, self.warm, self.log_file = prefect, model, warm, log_file
        self.prefect_server: TemporaryServer | None = None
        self.model_server: LocalModelServer | None = None
        self.cluster: DaskExecution | None = None
        self._threads: list[threading.Thread] = []
        self._errors: list[BaseException] = []
        self._server_log: Any = None
        self._t0 = time.perf_counter()
        #: Seconds from :meth:`start` until each service was ready.
        self.ready_at: dict[str, float] = {}
        #: Whether :meth:`wait` and :meth:`stop` log their ``start-up:`` and ``shut-down:`` lines.
        self.report = True

    @property
    def starting(self) -> list[str]:
        """What :meth:`wait` will wait for, in words."""
        return [w for w, on in (("Prefect server", self.prefect_server), ("model server", self.model_server)) if on]

    def starting_names(self) -> list[str]:
        """What :meth:`start` would start for the configuration (no Prefect server), in words."""
        cfg = self.config
        out = ["model server"] if self.want_model and cfg.model.kind == "local" and cfg.model.url is None else []
        if cfg.execution.kind == "dask" and cfg.execution.address is None:
            out.append("Dask cluster")
        return out

    def start(self) -> Services:
        """Launch every missing service; returns at once."""
        from flows.server import TemporaryServer, configured_api_url

        cfg = self.config
        if self.want_prefect and not configured_api_url():
            os.environ.setdefault("DO_NOT_TRACK", "1")
            os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
            if self.log_file is not None:
                self.log_file.parent.mkdir(parents=True, exist_ok=True)
                self._server_log = open(self.log_file, "ab")  # noqa: SIM115 - closed in stop()
            self.prefect_server = TemporaryServer(log=self._server_log).start()
            os.environ["PREFECT_API_URL"] = self.prefect_server.api_url  # before Prefect is imported
        if self.want_model and cfg.model.kind == "local" and cfg.model.url is None:
            from focus.backends import LocalModelServer

            self.model_server = LocalModelServer(cfg.model.weights, warm=self.warm)
            self._background("model server", self.model_server.start)
        elif self.warm is not None:
            self.warm.discard()  # another model service: free its core now
        return self

    def _background(self, what: str, start: Callable[[], object]) -> None:
        def run() -> None:
            try:
                start()
                self.ready_at[what] = time.perf_counter() - self._t0
            except BaseException as e:  # noqa: BLE001 - re-raised by wait()
                self._errors.append(e)

        thread = threading.Thread(target=run, name=f"focus-start-{what.replace(' ', '-')}", daemon=True)
        thread.start()
        self._threads.append(thread)

    def wait(self) -> FocusConfig:
        """Start the Dask cluster if one is needed (here, not in :meth:`start`: its worker
        processes inherit the logging set up in between), then wait until every service
        is ready; the configuration naming them."""
        cfg = self.config
        if cfg.execution.kind == "dask" and cfg.execution.address is None:
            from focus.dask_execution import DaskExecution

            ex = cfg.execution
            if ex.processes:  # the resource tracker the workers share writes to the log file, not below our line
                from focus.dask_preload import tracker_ignores_hangup

                tracker_ignores_hangup(self.log_file)
            self.cluster = DaskExecution(
                n_workers=ex.n_workers, threads_per_worker=ex.threads_per_worker, processes=ex.processes
            )
            self.cluster.client()
            self.ready_at["Dask cluster"] = time.perf_counter() - self._t0
        if self.prefect_server is not None:
            self.prefect_server.wait()
            self.ready_at["Prefect server"] = time.perf_counter() - self._t0
        for thread in self._threads:
            thread.join()
        if self._errors:
            raise self._errors[0]
        warm = " (started by the console entry)" if getattr(self.model_server, "warm_started", False) else ""
        (log.info if self.report else log.debug)(
            "start-up: %s (seconds after start)",
            ", ".join(f"{w} ready at {t:.2f}{warm if w == 'model server' else ''}" for w, t in self.ready_at.items())
            or "nothing to start",
        )
        updates: dict[str, Any] = {}
        if self.model_server is not None:
            # ours alone to start again, should it die mid-run; the command stops when it cannot
            self.model_server.keep_alive(on_gone=ON_MODEL_GONE.get())
            updates["model.url"] = self.model_server.url
            if self.config.model.policy_version is None:
                # the batch records which weights sampled it
                updates["model.policy_version"] = self.model_server.policy_version
        if self.cluster is not None:
            updates["execution.address"] = self.cluster.scheduler_address
        return self.config.with_updates(**updates) if updates else self.config

    def stop(self) -> None:
        """Stop what was started: the model server at once (nothing uses it any more;
        it is killed, not asked to stop: it holds nothing to save, and its graceful
        shutdown took 0.16 s of every command), the Dask cluster, then the Prefect
        server once Prefect's pending logs and events are sent."""
        t0 = time.perf_counter()
        server, self.model_server = self.model_server, None
        if server is not None:
            proc, server.proc = getattr(server, "proc", None), None  # first: its keeper must not start it again
            if proc is not None and proc.poll() is None:
                proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=5)
            server.stop()
        cluster, self.cluster = self.cluster, None
        if cluster is not None:
            cluster.close()
        if "prefect" in sys.modules:
            _drain_prefect()
        prefect, self.prefect_server = self.prefect_server, None
        if prefect is not None:
            prefect.stop()
        if self._server_log is not None:
            self._server_log.close()
            self._server_log = None
        (log.info if self.report else log.debug)("shut-down: services stopped in %.2f s", time.perf_counter() - t0)

    def kill(self) -> None:
        """Kill the servers' processes now, waiting for nothing (a command that must exit at once)."""
        model = self.model_server
        if model is not None:
            proc, model.proc = model.proc, None  # first: its keeper must not start it again
            if proc is not None and proc.poll() is None:
                proc.kill()
        proc = getattr(self.prefect_server, "proc", None)
        if proc is not None and proc.poll() is None:
            proc.kill()

    def __enter__(self) -> FocusConfig:
        self.start()
        try:
            return self.wait()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _drain_prefect(timeout_s: float = 5.0) -> None:
    """Send the logs and events Prefect still holds, while its server is up: left to
    Prefect's exit hooks, they retried against a stopped temporary server for a minute
    and printed "Error logging to API". For a server a flow's watch found gone
    (:mod:`flows.watch`) the workers are stopped without waiting: each waited out its
    timeout for nothing, and so did the log worker's flush at the command's exit."""
    try:
        from prefect.events.worker import EventsWorker
        from prefect.logging.handlers import APILogWorker
    except ImportError:
        return
    from flows.watch import found_gone

    if found_gone():
        timeout_s = 0.0
    for worker in (APILogWorker, EventsWorker):
        with contextlib.suppress(Exception):  # best effort: the run's outcome is already known
            worker.drain_all(timeout=timeout_s)


@contextlib.asynccontextmanager
async def services_in_thread(config: FocusConfig) -> AsyncIterator[tuple[FocusConfig, Services]]:
    """:class:`Services` (no Prefect server: a flow has one) entered and left in a worker
    thread, for async flows: starting a model server or a Dask cluster blocks, and
    Dask's synchronous client must not be created on a thread whose event loop runs.
    Yields the configuration naming them and the services (``model_server`` is the
    embedded model server started, if any)."""
    services = Services(config)
    # Started by the command (cli.common.started), which logs them: its lines, not twice.
    services.report = bool(services.starting_names())
    cfg = await asyncio.to_thread(services.__enter__)
    try:
        yield cfg, services
    finally:
        await asyncio.to_thread(services.stop)
