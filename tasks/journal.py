"""The pipeline's journal: each step of a collection a checkpoint in the store.

:class:`CheckpointJournal` is the :class:`focus.journal.Journal` the pipeline hands the
collector's loop: a step it records is saved to the checkpoint store, a step found there
is taken from it, so a rerun with the same collection id continues after the last saved
step. It also runs the configuration check that guards a resume and the batch's export.
Each step body runs in :meth:`run_step` (a Prefect task run in the flow) and yields a
:class:`tasks.records.StepRecord` for ``on_step``. Checkpoint keys, in order (a wave
stopped by bad responses adds ``("<p>.<name>.unfinished", w)``, 0.<name> the evidence)::

    ("config", 0)  ("critic", 0)  ("evidence", 0)  ("evidence.score", 0)  ("<p>.<name>", w)
    ("<p>.<name>.score", w)  ... ("<p>.<name>.end", 0)  ("trees.svg", 0)  ("export", 0)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from focus.journal import Journal, Step, WaveRollouts
from storage import BatchNotFound, BatchStore, CheckpointNotFound, CheckpointStore, CorruptDataError, ManifestError
from storage.checkpoints import held_lease
from tasks.config import FocusConfig
from tasks.fingerprint import CONFIG_KEY, CodecRecord, CriticIdentity, PolicyIdentity, fingerprint, resume_mismatch
from tasks.gaps import Key, load_record
from tasks.records import StepRecord, Tally

if TYPE_CHECKING:
    from focus.collector import Collector
    from focus.search import SearchState

_T = TypeVar("_T")
EXPORT, TREES_SVG = ("export", 0), ("trees.svg", 0)


async def uninterrupted(work: Awaitable[_T]) -> _T:
    """``await work``, finished even if the caller is cancelled meanwhile (raised once it is done)."""
    task = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait([task])
        raise


def checkpoint_key(config: FocusConfig, step: Step) -> Key:
    """The (phase, wave) a step is saved under (see the module docs)."""
    if step.kind in ("evidence", "evidence_scores"):
        return ("evidence" if step.kind == "evidence" else "evidence.score", 0)
    name = f"{step.phase}.{config.search.phases[step.phase].name}"
    suffix = {"wave": "", "wave_scores": ".score", "phase_end": ".end", "unfinished": ".unfinished"}[step.kind]
    return (name + suffix, step.wave if step.kind != "phase_end" else 0)


class CheckpointJournal(Journal):
    """The steps of ``config``'s collection in its checkpoint store (``store`` and
    ``batch_store`` default to those at ``storage.root``). I/O runs in worker threads,
    so the rollouts of waves planned ahead keep running while a step is saved."""

    def __init__(
        self,
        config: FocusConfig,
        store: CheckpointStore | None = None,
        batch_store: BatchStore | None = None,
        *,
        on_step: Callable[[StepRecord], None] | None = None,
        allow_policy_change: bool = False,
    ) -> None:
        if not config.collection_id:
            raise ValueError("a collection needs a collection_id before it is journaled")
        self.config, self.cid = config, config.collection_id
        self.store = store if store is not None else CheckpointStore(config.storage.root)
        self.batch_store = batch_store if batch_store is not None else BatchStore(config.storage.root)
        self.on_step = on_step
        self.records: list[StepRecord] = []  # every step's, in order
        self.damaged: str | None = None  # why the finished batch must be written again
        self.tally = Tally()
        self.policy = PolicyIdentity(self.cid, allow_change=allow_policy_change)
        self.critic = CriticIdentity(self.cid, allow_change=allow_policy_change)  # the same flag allows both
        self.codec = CodecRecord(config)
        self._mark = time.perf_counter()
        self.read_by_preflight: dict[str, Any] | None = None  # the config record, read (records checked) by a preflight
        #: The last step being saved: each save waits for the one before it.
        self._saving: asyncio.Future[Any] | None = None

    async def run_step(self, kind: str, step: Step | None, body: Callable[..., _T], *args: Any) -> _T:
        """Run one step's body (blocking: it saves) in a worker thread; ``kind`` is
        ``config``, ``export`` or ``step``'s kind."""
        return await asyncio.to_thread(body, *args)

    def load(self, key: Key) -> Any | None:
        """The checkpoint saved under ``key``, or ``None``."""
        try:
            return self.store.load(self.cid, *key, explain=False)  # a miss is a step not saved yet
        except CheckpointNotFound:
            return None

    def save(self, key: Key, value: Any) -> None:
        self.store.save(self.cid, *key, value)

    @contextlib.asynccontextmanager
    async def lease(self) -> AsyncIterator[None]:
        """The collection's write lease (a second writer is refused), held for the block;
        taken off the event loop, so a Ctrl-C ends a wait for another host's lease."""
        async with held_lease(self.store.loc.root, self.cid, storage_options=self.store.loc.storage_options):
            yield

    def note(self, kind: str, key: Key, phase: int = 0, reused: bool = False, **figures: Any) -> StepRecord:
        """Add a step record and pass it to ``on_step``."""
        now = time.perf_counter()
        rec = StepRecord(kind, key[0], key[1], phase, reused, now - self._mark, **figures)
        self._mark = now
        self.records.append(rec)
        if self.on_step is not None:
            self.on_step(rec)
        return rec

    # ---- the search's steps ----

    async def recorded(self, step: Step) -> Any | None:
        key = checkpoint_key(self.config, step)
        value = await asyncio.to_thread(self.load, key)
        if value is not None:
            if step.kind == "wave" and isinstance(value, dict):  # saved before waves were typed
                value = WaveRollouts(value["rollouts"], value["wave_wall_s"])
            self.policy.note(step, value, new=False)
            self.note(step.kind, key, step.phase, True, **self.tally.step(step, value))
        return value

    async def record(self, step: Step, value: Any) -> None:
        """Save ``step`` in the background, after the steps before it, so the loop lands
        the next wave meanwhile; a failed save fails every later one (the saved steps
        stay a prefix) and is raised by the next :meth:`record` or :meth:`flush`."""
        before = self._saving
        if before is not None and before.done() and before.exception() is not None:
            await before
        self.policy.note(step, value, new=True)
        self._saving = asyncio.ensure_future(self._after(before, step, value))

    async def _after(self, before: asyncio.Future[Any] | None, step: Step, value: Any) -> None:
        if before is not None:
            await before
        await self.run_step(step.kind, step, self._save_step, step, value)

    async def flush(self) -> None:
        """Wait until every step recorded is saved, also when cancelled meanwhile (an
        interrupt: no save is left half-way); raise what a save raised."""
        if self._saving is not None:
            await uninterrupted(self._saving)

    def _save_step(self, step: Step, value: Any) -> StepRecord:
        key = checkpoint_key(self.config, step)
        self.save(key, value)
        return self.note(step.kind, key, step.phase, **self.tally.step(step, value))

    # ---- the pipeline's own steps ----

    def stored_fingerprint(self) -> dict[str, Any] | None:
        """The configuration record (a record is written once: a preflight's read stands)."""
        if self.read_by_preflight is not None:
            return self.read_by_preflight
        return None if (stored := load_record(self, CONFIG_KEY)) is None else dict(json.loads(stored))

    async def check_config(self) -> StepRecord:
        """Refuse to resume with another configuration (a first run's is saved by ``self.codec``)."""
        return await self.run_step("config", None, self._check_config)

    def _check_config(self) -> StepRecord:
        mine, stored = fingerprint(self.config), self.stored_fingerprint()
        allow = self.policy.allow_change
        if stored is not None and (error := resume_mismatch(self.config, stored, mine, allow_policy_change=allow)):
            raise error
        self.codec.mine, self.codec.stored = mine, stored  # a new record is saved with the env codec's settings
        return self.note("config", CONFIG_KEY, reused=stored is not None)

    def finished_export(self) -> dict[str, Any] | None:
        """The stored export of a finished collection whose batch checks out against its
        manifest; ``None`` if unfinished, or if its batch must be written again (then
        :attr:`damaged` says why)."""
        stored = self.load(EXPORT)
        if stored is None:
            return None
        url = self.batch_store.locate(stored["batch_url"])  # stored relative to the root: stores move
        try:
            self.batch_store.verify(url)
        except (BatchNotFound, CorruptDataError, ManifestError) as e:
            self.damaged = str(e)
            return None
        return {**stored, "batch_url": url}

    async def finished(self) -> dict[str, Any] | None:
        """:meth:`finished_export`, noted as a reused export step."""
        stored = await asyncio.to_thread(self.finished_export)
        if stored is not None:
            self.note("export", EXPORT, reused=True)
        return stored

    async def export(self, collector: Collector, state: SearchState) -> dict[str, Any]:
        """Prepare the batch from the final state and write it (again, if the stored one
        was damaged); the export's record, with the batch URL and statistics. Once
        started it finishes, also when the collection is interrupted meanwhile."""
        return await uninterrupted(self.run_step("export", None, self._export, collector, state))

    def _export(self, collector: Collector, state: SearchState) -> dict[str, Any]:
        from focus.report import tree_svg

        batch = collector.prepare(state)
        url = self.batch_store.write(batch, overwrite=self.damaged is not None)
        self.save(TREES_SVG, tree_svg(state.trees, estimator=collector.estimator))  # after the batch
        summary = {
            k: v if isinstance(v, int | float | str | bool | None) else str(v) for k, v in batch.summary().items()
        }
        result = {"batch_url": url, "summary": summary, "failure_causes": dict(batch.stats.get("failure_causes", {}))}
        self.save(EXPORT, {**result, "batch_url": self.batch_store.ref(url)})
        self.note("export", EXPORT)
        return result
