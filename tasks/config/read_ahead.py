"""``storage.read_ahead``: the sizes of a resume's read-ahead (:class:`storage.read_ahead.ReadAhead`).

A section of its own module, as :class:`focus.backends.retry.RetryPolicy` is ``model.http``'s:
the schema module is kept under the structure test's line limit. What each field means is in
:mod:`tasks.config.reference`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from storage.read_ahead import MAX_BYTES, THREADS, WINDOW


class ReadAheadConfig(BaseModel):
    """How far, and in how many threads, a resume reads its saved steps ahead of the replay."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    threads: int = Field(THREADS, gt=0)
    window: int = Field(WINDOW, gt=0)
    max_mib: float = Field(MAX_BYTES / 2**20, ge=0)

    def options(self) -> dict[str, int]:
        """The keyword options of :class:`storage.read_ahead.ReadAhead`."""
        return {"threads": self.threads, "window": self.window, "max_bytes": int(self.max_mib * 2**20)}
