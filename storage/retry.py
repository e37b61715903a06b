"""Storage failures: which are transient (retried, within a bound), and which an
operator acts on (access denied, a read-only file system, no space, a file too large).

One policy (:class:`Retry`, :func:`retrying`) bounds every storage call, so that an
unreachable bucket fails after a known time with :class:`StorageUnavailable` instead of
hanging or retrying inside three layers of clients; :func:`refused` turns the failures
no retry fixes into one line that says what to do. Split from :mod:`storage.urls`
(addressing) by role; that module re-exports these names.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field

from focus.local_limits import local_errno, local_error
from storage.errors import StorageAccessDenied, StorageFull, StorageUnavailable

T = TypeVar("T")

#: Exception class names (anywhere in the MRO) that mean "try again later".
_TRANSIENT_NAMES = {
    "ConnectionError",
    "TimeoutError",
    "EndpointConnectionError",
    "ConnectionClosedError",
    "ConnectTimeoutError",
    "ReadTimeoutError",
    "ClientConnectorError",
    "ServerDisconnectedError",
    "ClientOSError",
}
#: Connection-level errnos, and the two s3fs gives a throttled or failing service
#: (``SlowDown``/503 and 409 -> EBUSY, ``InternalError``/500 -> EREMOTEIO): with botocore
#: making one attempt (``Location.S3_DEFAULTS``), these are retried by :func:`retrying`.
_TRANSIENT_ERRNO = {
    errno.ECONNREFUSED,
    errno.ECONNRESET,
    errno.ETIMEDOUT,
    errno.EHOSTUNREACH,
    errno.ENETUNREACH,
    errno.EBUSY,
    errno.EREMOTEIO,
}
#: HTTP statuses of a store that is throttled, failing, or behind a gateway that lost it:
#: retried whatever error code (or none) the answer carries. s3fs knows S3's own codes
#: (``SlowDown``, ``InternalError``) but makes ``OSError(EIO)`` of any other, which was not
#: retried: one 502 or 504 of a load balancer (an HTML page, no code), MinIO's 503
#: ``XMinioServerNotInitialized`` or a 429 stopped a collection at once with ``OSError:
#: [Errno 5] ...`` (``tests/test_storage_s3_faults.py``). botocore, which would retry them,
#: makes one attempt here (``Location.S3_DEFAULTS``).
_TRANSIENT_STATUS = {429, 500, 502, 503, 504}


class Retry(BaseModel):
    """How often and how patiently to retry a transient storage failure.

    The default waits about 14 s in all (0.2 s doubling to 4 s between 8 attempts): an
    object store that throttles (S3's ``503 SlowDown``) or fails (``500``) for a few
    seconds, or restarts, does not stop a collection that has run for hours. With 3 attempts
    over 0.6 s, a 3 s ``SlowDown`` on moto's S3 stopped it (``tests/test_storage_throttle.py``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    attempts: int = Field(8, ge=1)
    backoff_s: float = Field(0.2, ge=0.0)
    max_backoff_s: float = Field(4.0, ge=0.0)

    def total_wait_s(self) -> float:
        """Seconds slept between the attempts when all fail."""
        return sum(self.delay(a) for a in range(1, self.attempts))

    def delay(self, attempt: int) -> float:
        """Pause after failed attempt number ``attempt`` (1-based): exponential, capped."""
        return min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))


def http_answer(exc: BaseException) -> tuple[int, str] | None:
    """(HTTP status, error code) of the object store's answer behind ``exc`` (botocore's
    ``ClientError``, which s3fs chains as the cause of the ``OSError`` it raises), or
    ``None`` if no answer came. The code is the status itself (``'400'``) when the answer
    had no body to name one: S3 answers a ``HEAD`` request so."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        response = getattr(e, "response", None)
        if isinstance(response, dict):
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if isinstance(status, int):
                return status, str(response.get("Error", {}).get("Code") or status)
        e = e.__cause__ or e.__context__
    return None


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is a connection-level failure worth retrying (not a missing key)."""
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return False
    if local_errno(exc) is not None:  # out of files, ports or memory here: a retry meets the same (focus.local_limits)
        return False
    if isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNO:
        return True
    answer = http_answer(exc)
    if answer is not None and answer[0] in _TRANSIENT_STATUS:
        return True
    return any(c.__name__ in _TRANSIENT_NAMES for c in type(exc).__mro__)


def retrying(op: Callable[[], T], what: str, retry: Retry, *, sleep: Callable[[float], None] = time.sleep) -> T:
    """Run ``op``; retry transient failures up to ``retry.attempts`` times in all.

    Non-transient errors (missing files, permissions, bad data) propagate at once.
    """
    last: BaseException | None = None
    start = time.monotonic()
    for attempt in range(1, retry.attempts + 1):
        try:
            return op()
        except Exception as e:  # noqa: BLE001 - classified below
            if not is_transient(e):
                if (local := local_error(e, f" (to {what})")) is not None:
                    raise local from e
                typed = refused(e, what)
                if typed is not None:
                    raise typed from e
                raise
            last = e
            if attempt < retry.attempts:
                sleep(retry.delay(attempt))
    # a throttled or failing store answered (an HTTP status; s3fs: EBUSY, EREMOTEIO); else none did
    answered = last is not None and (
        http_answer(last) is not None or (isinstance(last, OSError) and last.errno in (errno.EBUSY, errno.EREMOTEIO))
    )
    state = "kept answering with errors (throttled or failing)" if answered else "unreachable"
    raise StorageUnavailable(
        f"{what}: storage {state} after {retry.attempts} attempt(s) in {time.monotonic() - start:.1f} s "
        f"(once it answers, {AGAIN}): {type(last).__name__}: {last}"
    ) from last


#: What an operator does after a storage failure: the advice closes each such line (the
#: same words for a collection, a train loop and ``focus inspect``, which all use the store).
AGAIN = "run again: a collection resumes from its last saved step with the same collection id"


_FULL_ERRNO = {errno.ENOSPC, errno.EDQUOT}
_MOVED = " (or copy the store elsewhere and set the storage root there)"
#: The credential that expires: named where access is refused (S3 says ``ExpiredToken``).
_SESSION = " and, for temporary credentials, AWS_SESSION_TOKEN, which expires"


def refused(exc: BaseException, what: str) -> StorageAccessDenied | StorageFull | None:
    """``exc`` as the storage error an operator can act on, if it is one: access denied
    (credentials, permissions, a read-only file system), no space left or a file too
    large; else ``None``."""
    if isinstance(exc, StorageAccessDenied | StorageFull):
        return None
    if isinstance(exc, OSError) and exc.errno == errno.EROFS:
        # a disk remounted read-only (an I/O error, a full snapshot): no credential helps
        return StorageAccessDenied(
            f"{what}: the file system is read-only; make it writable{_MOVED}, then rerun with the same collection id "
            "to resume"
        )
    if isinstance(exc, PermissionError) and ("file://" in what or os.path.isabs(str(exc.filename or ""))):
        # a local folder (``what`` names it as a path where `focus inspect` was given one):
        # no credential opens it (the line named S3's variables first)
        return StorageAccessDenied(
            f"{what}: permission denied (this process runs as user {_user()}); make the folder "
            f"writable for that user again{_MOVED}, then {AGAIN}"
        )
    if isinstance(exc, PermissionError):
        cause = str(exc) or "forbidden"
        return StorageAccessDenied(
            f"{what}: access denied ({cause}); check the credentials (for S3: AWS_ACCESS_KEY_ID and "
            f"AWS_SECRET_ACCESS_KEY{_SESSION}) or that the folder is writable, then {AGAIN}"
        )
    names = {c.__name__ for c in type(exc).__mro__}
    if names & {"NoCredentialsError", "PartialCredentialsError"}:
        # botocore found no (or half a) key pair: it said 'Unable to locate credentials'
        return StorageAccessDenied(
            f"{what}: no credentials for the object store ({exc}); set AWS_ACCESS_KEY_ID and "
            f"AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, or give the machine a role), then {AGAIN}"
        )
    answer = http_answer(exc)
    if answer is not None and answer[0] == 400 and answer[1] == "400":
        # S3 answers a HEAD without a body, so an expired token (ExpiredToken) or a request
        # signed for another region reached s3fs as 'OSError: [Errno 22] Bad Request'
        return StorageAccessDenied(
            f"{what}: the store refused the request with 400 Bad Request and gave no reason (S3 gives none to a "
            "HEAD request); most often the credentials expired (a session token, AWS_SESSION_TOKEN: renew them) "
            f"or the region is not the bucket's (AWS_DEFAULT_REGION); fix it, then {AGAIN}"
        )
    if isinstance(exc, OSError) and exc.errno in _FULL_ERRNO:
        return StorageFull(f"{what}: no space left on the device (or quota exceeded); free space{_MOVED}, then {AGAIN}")
    if isinstance(exc, OSError) and exc.errno == errno.EFBIG:
        # RLIMIT_FSIZE (`ulimit -f` of a batch job or a container) or the file system's
        # largest file: it said `OSError: [Errno 27] File too large`, naming no file
        return StorageFull(
            f"{what}: the file is larger than this process may write (File too large): a file-size limit "
            f"(`ulimit -f`, a batch system's or a container's) or the file system's largest file; raise the limit"
            f"{_MOVED}, then {AGAIN}"
        )
    return None


def _user() -> str:
    """This process's user name (its uid where it has none: a container's arbitrary id)."""
    import getpass

    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - KeyError or OSError, by Python version
        return f"uid {os.getuid()}"
