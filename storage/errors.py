"""Errors of the storage layer: each names the URL and the cause, so an operator can act.

They derive from the builtin the caller would otherwise catch (``FileNotFoundError``,
``ValueError``, ``ConnectionError``), so generic handlers keep working.
"""

from __future__ import annotations


class StorageError(Exception):
    """Base of every error raised by :mod:`storage`."""


class PathOutsideRoot(StorageError, ValueError):
    """A URL or id that would read or write outside the store's configured root."""


class RootNotFound(StorageError, FileNotFoundError):
    """A write failed because the root's bucket (or parent folder) does not exist."""


class RootNotAFolder(RootNotFound):
    """The root, or a folder the store keeps under it, names a file: a path typed wrong
    (or a stray file), which the operator fixes by naming another root; not a failure of
    the store, so ``focus`` exits 2 as for any wrong option."""


class StorageUnavailable(StorageError, ConnectionError):
    """The object store could not be reached after the configured retries."""


class BatchNotFound(StorageError, FileNotFoundError):
    """No manifest at the batch URL: the batch was never written or its write did not finish."""


class BatchExistsError(StorageError, FileExistsError):
    """A different batch already exists at the URL; it is kept unless ``overwrite=True``."""


class ManifestError(StorageError, ValueError):
    """A manifest is present but unreadable or incomplete."""


class CorruptDataError(StorageError, ValueError):
    """A data file is missing, truncated or differs from its manifest's checksum."""


class SchemaError(StorageError, ValueError):
    """A table does not have the columns, types or per-row shapes the batch schema requires."""


class CheckpointNotFound(StorageError, FileNotFoundError):
    """No finished checkpoint for this (collection, phase, wave)."""


class LeaseHeld(StorageError, RuntimeError):
    """Another run holds the collection's write lease (the message names it and its expiry)."""


class LeaseLost(StorageError, RuntimeError):
    """This run's write lease expired or was taken over; it must stop writing the collection."""


class LeaseAborted(StorageError, RuntimeError):
    """A wait for another run's lease was ended by :meth:`storage.Lease.abort` (the run
    was interrupted); the lease was not taken."""


class StorageAccessDenied(StorageError, PermissionError):
    """The store refused access: wrong or missing credentials, a folder without write
    permission, or a read-only file system."""


class StorageUnsupported(StorageError, OSError):
    """The store lacks an operation FOCUS relies on: conditional writes on S3 (the write
    lease's atomic create), which some S3-compatible servers answer ``501 NotImplemented``."""


class StorageFull(StorageError, OSError):
    """No space left (or quota exceeded) where the store writes."""
