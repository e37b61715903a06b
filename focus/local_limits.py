"""Errors of this machine, not of a service: out of open files, local ports or memory.

A connection that cannot be opened because this process has no file descriptor left
(``EMFILE``; ``ENFILE`` for the whole system), no ephemeral port left to connect from
(``EADDRNOTAVAIL``: many connections to one server lingering in ``TIME_WAIT``), or no
kernel memory for a socket (``ENOMEM``, ``ENOBUFS``) reaches a client as a connection
error, the same exception type as a server that refuses or resets. The model client
took it so: under ``ulimit -n 48`` with 64 rollouts in flight it counted ``Too many open
files`` as a connection failure, retried and waited at the outage gate, and the run
ended 0 with the limit never named (``tests/test_cli_machine.py``). A retry cannot help
(the limit is this machine's, and the calls in flight keep it reached), and neither does
waiting for the service: the fix is a setting here. So the clients (model, critic, the
object store) and the agent stop the run at once with :class:`LocalResourceError`,
whose message names the cause and what to change; rollouts already finished are kept
as for any other stop (the journal's last saved step), and a rerun resumes.
"""

from __future__ import annotations

import errno
import re

#: The errnos that say this machine, not the peer, ran out of something.
LOCAL_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.EADDRNOTAVAIL, errno.ENOMEM, errno.ENOBUFS})

#: ``[Errno 24] ...`` in a message whose exception dropped the errno (a wrapper's text).
_ERRNO_TEXT = re.compile(r"\[Errno (\d+)\]")

#: What closes each line: the run stops, and a rerun resumes.
RERUN = "then rerun to resume"


class LocalResourceError(RuntimeError):
    """This machine ran out of open files, local ports or socket memory (``errno``): a
    setting to change here, never a service's failure. Not retried, not counted toward
    an outage, and let through the agent and the execution layer so that the run stops
    at once; its message is the one line for the operator."""

    def __init__(self, message: str, errno: int) -> None:
        super().__init__(message)
        self.errno = errno

    def __reduce__(self) -> tuple[type[LocalResourceError], tuple[str, int]]:  # to and from Dask workers
        return type(self), (str(self), self.errno)


def local_errno(error: BaseException) -> int | None:
    """The errno of :data:`LOCAL_ERRNOS` behind ``error`` (itself, an aiohttp
    ``ClientConnectorError``'s ``os_error``, or any exception it was raised from); None
    when nothing in its chain is one. httpx and aiobotocore chain the ``OSError`` of the
    socket as the cause; aiohttp copies its errno."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [error]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, LocalResourceError):
            return e.errno
        if isinstance(e, OSError):
            if e.errno in LOCAL_ERRNOS:
                return e.errno
            if e.errno is None and (m := _ERRNO_TEXT.search(str(e))) and int(m.group(1)) in LOCAL_ERRNOS:
                return int(m.group(1))
        todo += [e.__cause__, e.__context__, getattr(e, "os_error", None)]
    return None


def open_files_limit() -> str:
    """``, 48 (`ulimit -n`; hard limit 48)``: this process's limits, or nothing where unknown."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return ""
    show = ["unlimited" if v == resource.RLIM_INFINITY else str(v) for v in (soft, hard)]
    return f", {show[0]} (`ulimit -n`; hard limit {show[1]})"


def local_line(err: int, where: str = "") -> str:
    """The line for ``err`` (one of :data:`LOCAL_ERRNOS`) met ``where`` (`` (opening
    /runs/x.pkl)``, `` connecting to the model service at http://...``)."""
    if err in (errno.EMFILE, errno.ENFILE):
        if err == errno.ENFILE:
            limit = "the system's limit on open files is reached (ENFILE: fs.file-max, all processes together)"
        else:
            limit = "this process reached its limit on open files" + open_files_limit()
        return (
            f"too many open files{where}: {limit}; each rollout in flight holds a connection to the model service, "
            f"so raise the limit (`ulimit -n 4096`) or lower execution.max_concurrency, {RERUN}"
        )
    if err == errno.EADDRNOTAVAIL:
        return (
            f"no local port left{where} (EADDRNOTAVAIL: this machine's ephemeral ports are used up, mostly by "
            "closed connections to the same server waiting in TIME_WAIT); widen net.ipv4.ip_local_port_range "
            f"(sysctl) or open fewer connections (lower execution.max_concurrency), {RERUN}"
        )
    name = errno.errorcode.get(err, str(err))
    return (
        f"this machine is out of memory for sockets{where} ({name}); free memory or lower "
        f"execution.max_concurrency, {RERUN}"
    )


def local_error(error: BaseException, where: str = "") -> LocalResourceError | None:
    """:class:`LocalResourceError` for ``error`` when it is this machine's (:func:`local_errno`),
    its line naming ``where``; None otherwise (the caller's own handling applies)."""
    if isinstance(error, LocalResourceError):
        return error
    err = local_errno(error)
    return None if err is None else LocalResourceError(local_line(err, where), err)
