"""What :class:`focus.dask_execution.DaskExecution` checks of a Dask cluster before a wave
ships: that the scheduler answers, and that the scheduler and the workers run the code the
shards were planned with (focus, Python, and the Dask packages that pickle the shards).

Dask itself only logs "Mismatched versions found" in the worker's log: a worker on
distributed 2024.8 under a 2026.8 client could not unpickle a shard's task ("No module
named 'dask._task_spec'"), left, and the wave waited ``no_workers_timeout_s`` (300 s)
for a line that said to start workers; a 2026.8 client failed against a 2024.8 scheduler
with "TypeError: Scheduler.identity() got an unexpected keyword argument 'n_workers'".
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from focus.local_limits import local_error

#: The packages that must match between this process and the cluster: the Dask task and
#: the payloads are pickled with them (cloudpickle by major.minor, the others exactly).
WIRE = ("dask", "distributed", "cloudpickle")


def wire(versions: dict[str, Any]) -> str:
    """``versions`` (package -> version) of :data:`WIRE` as they must match, in one line."""
    parts = []
    for name in WIRE:
        v = str(versions.get(name))
        parts.append(f"{name} {'.'.join(v.split('.')[:2]) if name == 'cloudpickle' else v}")
    return ", ".join(parts)


def my_wire() -> str:
    import cloudpickle
    import dask
    import distributed

    return wire(
        {"dask": dask.__version__, "distributed": distributed.__version__, "cloudpickle": cloudpickle.__version__}
    )


class WorkerMismatch(RuntimeError):
    """A Dask worker or scheduler runs another focus, Python or Dask than the process that sends it rollouts."""


class SchedulerUnreachable(RuntimeError):
    """The Dask scheduler address cannot be used: nothing answers there, something that
    is no Dask scheduler does, or Dask does not parse it. The message says what to do; as
    a bare ``RuntimeError`` the command printed ``RuntimeError: ...`` with a pointer to a
    traceback, as for a bug."""


#: Seconds past ``connect_timeout_s`` that a scheduler's handshake may take.
HANDSHAKE_MARGIN_S = 1.0


def check_workers(client: Any, workers: set[str], versions: Any) -> None:
    """Refuse, in one line, a worker whose focus does not import or whose focus, Python or
    Dask packages (:data:`WIRE`) differ from the caller's, as ``versions`` (run on each of
    ``workers``: :func:`focus.dask_execution._worker_versions`) reports them.

    A worker that cannot import focus cannot even unpickle a shard's task: it closed its
    connection and left, the next one likewise, and the wave waited the whole
    ``no_workers_timeout_s`` (300 s) for a line that said to start workers. A worker on
    another focus or Python ran the shards with other code, without a word.
    """
    import sys

    from focus import __version__

    if not workers:
        return
    mine = f"{sys.version_info[0]}.{sys.version_info[1]}", __version__
    found = client.run(versions, workers=sorted(workers), on_error="return")
    for address, answer in sorted(found.items()):
        if isinstance(answer, BaseException):
            continue  # gone since it was listed: the scheduler reruns its shards elsewhere
        python, version, error, packages = answer
        if error:
            raise WorkerMismatch(
                f"a Dask worker ({address}) cannot import focus: {error}; install focus-rl {__version__} in the "
                f"workers' environment (Python {mine[0]}), then rerun with the same collection id"
            )
        if (python, version) != mine:
            raise WorkerMismatch(
                f"a Dask worker ({address}) runs focus {version} on Python {python}, this process focus "
                f"{__version__} on Python {mine[0]}: shards must run the code that planned them; install the same "
                "versions in the workers' environment, then rerun with the same collection id"
            )
        if wire(packages) != my_wire():
            raise WorkerMismatch(
                f"a Dask worker ({address}) runs {wire(packages)}, this process {my_wire()}: a worker unpickles "
                "the shards' tasks with them (one on other versions left, unable to, and the wave waited for "
                "workers); install the same versions in the workers' "
                "environment, then rerun with the same collection id"
            )


def answers(address: str, timeout_s: float, setting: str = "DaskExecution.connect_timeout_s") -> None:
    """Fail in one line unless ``address`` answers Dask's handshake within ``timeout_s`` (from
    ``setting``, which the line names), or when its scheduler runs other Dask packages
    (:data:`WIRE`) than this process.

    ``Client(address, timeout=...)`` bounds the TCP connect only: a port that accepts and
    never answers (another service, a stopped scheduler, a proxy) hung the collection
    forever in distributed's handshake, without a line, whatever ``connect_timeout_s``.
    """
    from distributed.comm import connect

    async def shake() -> Any:
        comm = await connect(address, timeout=timeout_s)
        try:  # the scheduler's versions (Dask's "versions" op), before the client's handshake
            await comm.write({"op": "versions", "reply": True})
            return await comm.read()
        finally:
            await comm.close()

    async def bounded() -> Any:  # past connect's own timeout, which names a refused port
        return await asyncio.wait_for(shake(), timeout_s + HANDSHAKE_MARGIN_S)

    with ThreadPoolExecutor(max_workers=1) as pool:  # the caller's thread may run a loop
        try:
            versions = pool.submit(asyncio.run, bounded()).result()
        except TimeoutError:
            raise SchedulerUnreachable(
                f"the Dask scheduler address {address!r} accepted a connection but did not answer as a Dask "
                f"scheduler within {timeout_s + HANDSHAKE_MARGIN_S:g} s ({setting} + {HANDSHAKE_MARGIN_S:g}); give the address the scheduler "
                "prints at its start (tcp://host:8786 by default, not the dashboard's :8787), then rerun"
            ) from None
        except OSError as e:
            raise local_error(e, f" connecting to the Dask scheduler at {address!r}") or SchedulerUnreachable(
                f"cannot reach the Dask scheduler at {address!r}: {e}"
            ) from e
        except ValueError as e:  # an address Dask does not parse
            raise SchedulerUnreachable(f"the Dask scheduler address {address!r} is not one Dask takes: {e}") from e
    packages = versions.get("packages") if isinstance(versions, dict) else None
    if isinstance(packages, dict) and wire(packages) != my_wire():
        raise WorkerMismatch(
            f"the Dask scheduler at {address} runs {wire(packages)}, this process {my_wire()}: its client "
            "cannot talk to it; install the same versions in the scheduler's and the workers' environment, then "
            "rerun with the same collection id"
        )
