"""One line per error: what ``focus`` prints when a collection stops, and what the
failed Prefect run's state message says.

An operator meets errors from many layers - the configuration, the object store (a
missing bucket, refused credentials, a full disk), the model service, a Dask worker -
and each layer phrases them its own way, some over several lines. :func:`one_line`
maps an exception to a single line that names the cause; the full traceback goes to the
log file (or the terminal with ``--debug``). Exceptions are matched by class name along
their MRO, so new error types of the library (a model-service outage, say) get a clear
line without this module importing them: any exception whose message already names its
cause is shown as ``<message>``, anything else as ``<Type>: <message>``.
"""

from __future__ import annotations

import errno
import os
import traceback
from typing import Any, NoReturn

from focus.local_limits import local_errno, local_line

#: Errors whose message is written for the operator: shown as they are (one line).
SELF_EXPLAINED = frozenset(
    {
        "ConfigError",
        "ResumeMismatch",
        "TasksChanged",
        "StorageError",
        "PolicyError",
        "CriticError",
        "EnvError",
        "CollectionFailed",
        "RunCancelled",
        "TrainingDiverged",
        "WorkerImportError",
        "WorkerMismatch",
        "SchedulerUnreachable",
        "ShardOutOfMemory",
        "NoDaskWorkers",
        "ModelServiceOutage",
        "ModelServerGone",
        "BadResponses",
        "RequestsRefused",
        "BrokenEnv",
        "ModelServiceError",
        "CollectionLocked",
        "LeaseHeld",
        "PrefectServerGone",
        "PrefectHomeUnwritable",
        "MissingExtra",
        "NothingToTrain",
        "LocalResourceError",
    }
)
#: Errors the user caused and can fix by changing what they asked for (exit status 2).
USAGE = frozenset(
    {
        "ConfigError",
        "ResumeMismatch",
        "TasksChanged",
        "CollectionLocked",
        "LeaseHeld",
        "UnreadableAnswers",
        "RequestsRefused",
        "CriticRefused",
        "RootNotAFolder",
        "StoreIncomplete",
        "PrefectHomeUnwritable",
    }
)
#: The longest line: a foreign error's text (a server's page) is cut to it, in the middle,
#: keeping the end, where the lines written here say what to do. Lines that name store
#: paths three times (a missing record's) reached 600 with a 60-character store root, and
#: lost their remedy at the old cut at the end.
MAX_CHARS = 1200
#: What a cut line keeps of its end.
TAIL_CHARS = 300


class RunCancelled(Exception):
    """A flow run no runner or worker started was set ``Cancelling`` (the UI's Cancel) and
    stopped as by Ctrl-C (:func:`flows.watch.watched`); the flow ends ``Cancelled``."""

    def __init__(self, run: str) -> None:
        super().__init__(
            f"flow run {run!r} was cancelled (the Prefect UI's Cancel, or the API): finished steps are saved; "
            "rerun with the same collection id to resume"
        )


class CollectionFailed(RuntimeError):
    """A collection stopped; ``str()`` is the one line naming the cause, the original
    exception is ``__cause__``. Raised by the flow so Prefect's state message is that line."""


def prefect_unanswered(api: str, cause: str, then: str = "rerun with the same collection id to resume") -> str:
    """The line for a Prefect server at ``api`` that did not answer, ``cause`` saying how,
    and ``then`` what to do once it does (a collection resumes; a deploy runs again)."""
    return f"the Prefect server at {api} did not answer ({cause}); start it or set PREFECT_API_URL, then {then}"


class PrefectServerGone(RuntimeError):
    """The Prefect server stopped answering while a flow ran (:mod:`flows.watch`);
    ``str()`` is the one line."""

    def __init__(self, api: str, cause: str) -> None:
        super().__init__(prefect_unanswered(api, cause))
        self.api = api


#: What a flow's watch (:mod:`flows.watch`) found of each Prefect API gone in this
#: process: the engine's report of the failed run then fails too, with an httpx error
#: that says less (not how long the server was silent).
GONE: dict[str, PrefectServerGone] = {}


def _names(exc: BaseException) -> list[str]:
    return [c.__name__ for c in type(exc).__mro__]


def _flatten(text: str, sep: str = " ") -> str:
    parts = [line.strip() for line in text.splitlines() if line.strip()]
    out = sep.join(parts)
    return out if len(out) <= MAX_CHARS else out[: MAX_CHARS - TAIL_CHARS - 3] + " … " + out[-TAIL_CHARS:]


def root_cause(exc: BaseException) -> BaseException:
    """The exception to describe: the first of an exception group, else ``exc``."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def prefect_api_of(exc: BaseException) -> str | None:
    """The Prefect API a failed request of Prefect's own client went to, if ``exc`` is
    one (Prefect's clients retry for minutes, then raise httpx's error, which names
    neither Prefect nor the server)."""
    text = str(exc)
    if "Failed to reach API at " in text:
        return text.split("Failed to reach API at ", 1)[1].split()[0].rstrip("/")
    try:
        url = str(exc.request.url)  # type: ignore[attr-defined]
    except (AttributeError, RuntimeError):
        return None
    part = f"{os.sep}prefect{os.sep}"
    if not any(part in frame.filename for frame in traceback.extract_tb(exc.__traceback__)):
        return None  # not Prefect's client: the model or critic client says what it called
    cut = url.find("/api/")
    return url[: cut + 4] if cut >= 0 else url


def one_line(exc: BaseException) -> str:
    """The cause of ``exc`` in one line an operator can act on."""
    exc = root_cause(exc)
    names = _names(exc)
    text = str(exc)
    if "ConfigError" in names:
        head, _, rest = text.partition("\n")
        return _flatten(head + (" " + _flatten(rest, "; ") if rest else ""))
    if SELF_EXPLAINED.intersection(names):
        return _flatten(text) or names[0]
    if "FutureCancelledError" in names and "scheduler-connection-lost" in text:
        return (
            "the Dask scheduler is gone: the client lost its connection to it while rollouts ran; start it "
            "and its workers again (workers close with their scheduler), or run without execution.address "
            "(--dask-address), then rerun with the same collection id to resume"
        )
    if "KilledWorker" in names:
        return _flatten(f"a Dask worker died running rollouts more often than allowed ({text}); rerun to resume")
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        where = f" writing {exc.filename}" if exc.filename else ""
        return f"no space left on the device{where}; free space and rerun to resume"
    if (err := local_errno(exc)) is not None:  # out of files, ports or memory here, however wrapped
        return _flatten(local_line(err, _where(exc)))
    if isinstance(exc, PermissionError) or (isinstance(exc, OSError) and exc.errno == errno.EROFS):
        where = f" on {exc.filename}" if exc.filename else ""
        return _flatten(f"permission denied{where}: {exc.strerror or text or 'forbidden'}")
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted; rerun with the same collection id to resume"
    if (api := prefect_api_of(exc)) is not None:
        if api in GONE:
            return _flatten(str(GONE[api]))
        return _flatten(prefect_unanswered(api, _unanswered_cause(exc)))
    return _flatten(f"{names[0]}: {text}") if text else names[0]


def _unanswered_cause(exc: BaseException) -> str:
    """How Prefect's client failed to reach its API. Its version check raises a bare
    ``RuntimeError("Failed to reach API at ...")`` from the error that says how (a host no
    lookup finds, a refused port): `focus collect --prefect` named only "RuntimeError"."""
    text = str(exc)
    if text.startswith("Failed to reach API") and exc.__cause__ is not None:
        exc, text = exc.__cause__, str(exc.__cause__)
    name = type(exc).__name__
    return f"{name}: {text}" if text and not text.startswith("Failed to reach API") else name


def _where(exc: BaseException) -> str:
    """Where this machine's limit was met: the file opened, or the Prefect API asked (its
    client raises httpx's ``ConnectError``, which read as "the Prefect server did not
    answer" under ``ulimit -n``, the limit never named)."""
    if isinstance(exc, OSError) and exc.filename:
        return f" (opening {exc.filename})"
    api = prefect_api_of(exc)
    return f" reaching the Prefect API at {api}" if api else ""


def exit_code(exc: BaseException) -> int:
    """2 for what the user asked for wrongly (configuration, resume), 1 for everything else;
    a flow's :class:`CollectionFailed` (:func:`as_failure`) by the error it stands for."""
    exc = root_cause(exc)
    if isinstance(exc, CollectionFailed) and exc.__cause__ is not None:
        exc = root_cause(exc.__cause__)
    return 2 if USAGE.intersection(_names(exc)) else 1


def as_failure(exc: BaseException) -> BaseException:
    """What the flow raises for ``exc``: ``exc`` itself if its message is already the one
    line (so callers can still catch its type), else :class:`CollectionFailed` with the line."""
    line = one_line(exc)
    if isinstance(exc, Exception) and str(exc) == line:
        return exc
    failed = CollectionFailed(line)
    failed.__cause__ = exc
    return failed


def explained(exc: BaseException) -> bool:
    """Whether :func:`one_line` names the cause by itself: an error of the library or the
    store written for the operator, or one mapped above; not ``<Type>: <message>`` of
    an exception nobody described (a bug, whose traceback is what helps)."""
    exc = root_cause(exc)
    names = _names(exc)
    generic = _flatten(f"{names[0]}: {exc}") if str(exc) else names[0]
    return bool(SELF_EXPLAINED.intersection(names)) or one_line(exc) != generic


def log_failure(exc: BaseException, log: Any, collection_id: str | None, kind: str = "collection") -> str:
    """Log that collection (or train loop: ``kind``) ``collection_id`` failed, in one line; the
    traceback beside it only when the line does not explain the error (else at debug level).
    Returns the line."""
    line = one_line(exc)
    what = f"{kind} {collection_id}" if collection_id else f"the {kind}"  # none yet: a bad config
    if explained(exc):
        log.error("%s failed: %s", what, line)
        log.debug("%s failed here:", what, exc_info=exc)
    else:
        log.error("%s failed: %s", what, line, exc_info=exc)
    return line


def raise_one_line(exc: Exception, log: Any, collection_id: str | None) -> NoReturn:
    """Log that collection ``collection_id`` failed (:func:`log_failure`) and raise
    :func:`as_failure` of ``exc``: what a collection without a flow does when it stops."""
    log_failure(exc, log, collection_id)
    failure = as_failure(exc)
    if failure is exc:
        raise exc
    raise failure from exc


def failed_state(exc: Exception, log: Any, collection_id: str | None, what: str = "collection") -> Any:
    """What a flow returns for ``exc``: a Failed state whose message is the one line (logged
    by :func:`log_failure`) and whose data is :func:`as_failure` of ``exc``, which
    awaiting the flow raises. Returned, not raised: Prefect logs a raised exception's
    traceback in the run's log, under the line that already says what to do."""
    from prefect.states import Cancelled, Failed

    if isinstance(exc, RunCancelled):
        log.info("%s", exc)
        return Cancelled(message=str(exc), data=exc)
    return Failed(message=log_failure(exc, log, collection_id, what), data=as_failure(exc))
