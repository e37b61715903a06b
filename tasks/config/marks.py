"""Which configuration fields a resume may change: the :class:`Resumable` mark a field's
declaration carries (``Annotated[T, RUNTIME]``), read off the schema by
:func:`tasks.config.schema.resumable_fields`. Kept apart so that every module of a
section can mark its fields without importing the schema."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Resumable:
    """Field metadata (``Annotated[T, RUNTIME]``): the field may differ between a run
    and its resume, because it does not change what a step already made computed.
    Every other field does, and a resume that changes one is refused
    (:mod:`tasks.fingerprint`, :mod:`tasks.loop_settings`). ``scope`` says which
    resumes ignore it: ``any`` (a collection's and a train loop's), ``collection`` (a
    collection never reads it; a train loop compares it) or ``loop`` (a train loop's:
    how much of the loop runs, or a value the loop sets for each iteration itself)."""

    scope: Literal["any", "collection", "loop"]
    why: str


#: Where things run and how patiently, not what they compute.
RUNTIME = Resumable("any", "where and how patiently things run")
#: Read by the train loop alone.
LOOP_ONLY = Resumable("collection", "read by the train loop alone")
#: How much of a train loop runs: more iterations extend it, another evaluation size evaluates again.
LOOP_EXTENT = Resumable("loop", "how much of the loop runs")
