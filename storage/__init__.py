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
