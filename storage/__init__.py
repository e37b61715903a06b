"""Durable storage of a collection's outputs, addressed by URL (any fsspec protocol).

- :class:`BatchStore`: training batches as Parquet (actor and critic tables, stats),
  made visible by a manifest written last.
- :class:`CheckpointStore`: search state per (collection, phase, wave), for resume (a
  resume's checkpoints read ahead of its replay: :mod:`storage.read_ahead`).
- :func:`collection_lease` (:func:`held_lease` in a coroutine): one writer per
  collection (a lease object in the store, renewed while the run lives).

Plain paths mean the local disk; ``s3://`` goes through s3fs (credentials and endpoint
from ``AWS_*`` environment variables or ``storage_options``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from focus._lazy import lazy_exports

if TYPE_CHECKING:
    from storage.batches import PARQUET_OPTIONS, BatchStore, BatchTables
    from storage.checkpoints import CheckpointStore, collection_lease, held_lease
    from storage.errors import (
        BatchExistsError,
        BatchNotFound,
        CheckpointNotFound,
        CorruptDataError,
        LeaseAborted,
        LeaseHeld,
        LeaseLost,
        ManifestError,
        PathOutsideRoot,
        RootNotAFolder,
        RootNotFound,
        SchemaError,
        StorageAccessDenied,
        StorageError,
        StorageFull,
        StorageUnavailable,
        StorageUnsupported,
    )
    from storage.lease import Lease
    from storage.manifest import Manifest
    from storage.schema import ACTOR_SCHEMA, CRITIC_SCHEMA, SCHEMA_VERSION
    from storage.urls import Retry

# Names load on first use, so importing a light submodule (``storage.read_ahead`` for
# the configuration's defaults, ``storage.temp``) does not load the batch and checkpoint
# stores: every ``focus`` command, ``--help`` and ``config show`` included, imported
# them through the configuration (``import cli.app``: 0.33 s, now 0.25 s).
_EXPORTS = {
    "PARQUET_OPTIONS": "storage.batches",
    "BatchStore": "storage.batches",
    "BatchTables": "storage.batches",
    "CheckpointStore": "storage.checkpoints",
    "collection_lease": "storage.checkpoints",
    "held_lease": "storage.checkpoints",
    "BatchExistsError": "storage.errors",
    "BatchNotFound": "storage.errors",
    "CheckpointNotFound": "storage.errors",
    "CorruptDataError": "storage.errors",
    "LeaseAborted": "storage.errors",
    "LeaseHeld": "storage.errors",
    "LeaseLost": "storage.errors",
    "ManifestError": "storage.errors",
    "PathOutsideRoot": "storage.errors",
    "RootNotAFolder": "storage.errors",
    "RootNotFound": "storage.errors",
    "SchemaError": "storage.errors",
    "StorageAccessDenied": "storage.errors",
    "StorageError": "storage.errors",
    "StorageFull": "storage.errors",
    "StorageUnavailable": "storage.errors",
    "StorageUnsupported": "storage.errors",
    "Lease": "storage.lease",
    "Manifest": "storage.manifest",
    "ACTOR_SCHEMA": "storage.schema",
    "CRITIC_SCHEMA": "storage.schema",
    "SCHEMA_VERSION": "storage.schema",
    "Retry": "storage.urls",
}

__all__ = [
    "ACTOR_SCHEMA",
    "CRITIC_SCHEMA",
    "PARQUET_OPTIONS",
    "SCHEMA_VERSION",
    "BatchExistsError",
    "BatchNotFound",
    "BatchStore",
    "BatchTables",
    "CheckpointNotFound",
    "CheckpointStore",
    "CorruptDataError",
    "Lease",
    "LeaseAborted",
    "LeaseHeld",
    "LeaseLost",
    "Manifest",
    "ManifestError",
    "PathOutsideRoot",
    "Retry",
    "RootNotAFolder",
    "RootNotFound",
    "SchemaError",
    "StorageAccessDenied",
    "StorageError",
    "StorageFull",
    "StorageUnavailable",
    "StorageUnsupported",
    "collection_lease",
    "held_lease",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
