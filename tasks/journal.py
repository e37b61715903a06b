"""The pipeline's journal: every step of a collection a checkpoint in the store.

:class:`CheckpointJournal` is the :class:`focus.journal.Journal` the pipeline hands the
collector's loop: each step it records is saved to the checkpoint store
(:class:`storage.CheckpointStore`), and each step found there is taken from it, so a
rerun with the same collection id - a flow retry, a rerun from the UI or the CLI -
continues after the last saved step and recomputes nothing finished. It also keeps the
two steps that belong to the pipeline rather than the search: the configuration
check that guards a resume, and the export of the batch.

Checkpoint keys (phase, wave), in the order a collection writes them::

    ("config", 0)           the configuration fingerprint (guards resumes)
    ("evidence", 0)         the full search state after the evidence rollouts
    ("evidence.score", 0)   the critic's predictions for its checkpoints (a delta)
    ("<p>.<name>", w)       the rollouts of wave w of continuation phase p (a delta)
    ("<p>.<name>.score", w) the predictions for that wave's new checkpoints (a delta)
    ("<p>.<name>.end", 0)   phase p planned nothing more after that many waves
    ("export", 0)           the batch URL and statistics
    ("trees.svg", 0)        the picture of the trees the export drew

Each step also yields a :class:`StepRecord` (what it did, whether it was reused, the
usage so far), passed to ``on_step`` as it ends: the progress display and the Prefect
UI's step table are made of these.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from focus.journal import Journal, Step, WaveRollouts
from focus.usage import Usage
from storage import BatchStore, CheckpointNotFound, CheckpointStore, collection_lease
from tasks.config import FocusConfig

if TYPE_CHECKING:
    from focus.collector import Collector
    from focus.search import SearchState

#: Fields that may differ between a run and its resume (where things run, not what).
#: The HTTP clients' timeouts, retries and hedging change how patiently a result is
#: fetched, not the result (requests are seeded).
RUNTIME_FIELDS = ("model.url", "model.http", "critic.http", "execution", "progress", "storage")

CONFIG = ("config", 0)
EXPORT = ("export", 0)
TREES_SVG = ("trees.svg", 0)


class ResumeMismatch(RuntimeError):
    """A collection id reused with a different configuration."""


def fingerprint(config: FocusConfig) -> dict[str, Any]:
    """What determines a collection's result: the config without where things run."""
    data = config.model_dump(mode="json")
    for dotted in RUNTIME_FIELDS:
        *path, last = dotted.split(".")
        node = data
        for part in path:
            node = node.get(part, {})
        node.pop(last, None)
    return data


def resume_mismatch(config: FocusConfig, stored: dict[str, Any], mine: dict[str, Any]) -> ResumeMismatch | None:
    """The error for resuming ``config``'s collection, whose stored fingerprint is
    ``stored``, with the fingerprint ``mine`` (``None`` if they agree)."""
    fields = ", ".join(_diff(stored, mine))
    if not fields:
        return None
    return ResumeMismatch(
        f"collection {config.collection_id!r} already exists in {config.storage.root} with a different "
        f"configuration (differs in: {fields}); resume it with the same configuration or use a new collection id"
    )


def _diff(a: Any, b: Any, prefix: str = "") -> list[str]:
    """Dotted names of the fields that differ. A field one side lacks counts as ``None``,
    so a field added to the config since a collection was stored, left unset, is no
    difference (the collection resumes)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for k in sorted(set(a) | set(b)):
            out += _diff(a.get(k), b.get(k), f"{prefix}{k}.")
        return out
    return [] if a == b else [prefix.rstrip(".")]


def checkpoint_key(config: FocusConfig, step: Step) -> tuple[str, int]:
    """The (phase, wave) a step is saved under (see the module docs)."""
    if step.kind == "evidence":
        return ("evidence", 0)
    if step.kind == "evidence_scores":
        return ("evidence.score", 0)
    name = f"{step.phase}.{config.search.phases[step.phase].name}"
    if step.kind == "wave":
        return (name, step.wave)
    if step.kind == "wave_scores":
        return (f"{name}.score", step.wave)
    return (f"{name}.end", 0)


@dataclass(frozen=True)
class StepRecord:
    """What one step of a collection did, as the progress display and the UI show it."""

    #: ``config``, ``export`` or a :class:`focus.journal.Step` kind.
    kind: str
    #: Its checkpoint key.
    key: str
    wave: int = 0
    #: The phase the step belongs to (0: evidence, and the pipeline's own steps).
    phase_index: int = 0
    #: Taken from the store (a rerun) rather than computed now.
    reused: bool = False
    #: Seconds since the previous step ended (a wave's: the wall time it accounts for).
    wall_s: float = 0.0
    #: Rollouts the step ran (evidence and waves).
    rollouts: int = 0
    failed_rollouts: int = 0
    #: The most frequent causes of its failed rollouts, ``{cause: count}``.
    failure_causes: Mapping[str, int] = field(default_factory=dict)
    #: The collection's usage so far, and its phase's (steps that run rollouts).
    usage: Usage | None = None
    phase_usage: Usage | None = None


def failures(causes: Iterable[str | None]) -> tuple[int, dict[str, int]]:
    """Failed rollouts and the five most frequent of their causes."""
    counted = Counter(c or "unknown" for c in causes)
    return sum(counted.values()), dict(counted.most_common(5))


class CheckpointJournal(Journal):
    """The steps of ``config``'s collection in a checkpoint store (see the module docs).

    ``store`` and ``batch_store`` default to the stores at ``config.storage.root``;
    ``on_step`` receives each :class:`StepRecord` as its step ends. I/O runs in worker
    threads, so the rollouts of waves planned ahead keep running while a step saves.
    """

    def __init__(
        self,
        config: FocusConfig,
        store: CheckpointStore | None = None,
        batch_store: BatchStore | None = None,
        *,
        on_step: Callable[[StepRecord], None] | None = None,
    ) -> None:
        if not config.collection_id:
            raise ValueError("a collection needs a collection_id before it is journaled")
        self.config = config
        self.cid: str = config.collection_id
        self.store = store if store is not None else CheckpointStore(config.storage.root)
        self.batch_store = batch_store if batch_store is not None else BatchStore(config.storage.root)
        self.on_step = on_step
        #: Every step record, in order.
        self.records: list[StepRecord] = []
        #: Why the finished batch must be written again (set by :meth:`finished`).
        self.damaged: str | None = None
        self._usage = Usage()
        self._phase_usage: dict[int, Usage] = {}
        self._mark = time.perf_counter()

    # ---- the store ----

    def load(self, key: tuple[str, int]) -> Any | None:
        """The checkpoint saved under ``key``, or ``None``."""
        try:
            return self.store.load(self.cid, *key)
        except CheckpointNotFound:
            return None

    def save(self, key: tuple[str, int], value: Any) -> None:
        self.store.save(self.cid, *key, value)

    @contextlib.contextmanager
    def lease(self) -> Iterator[None]:
        """The collection's write lease (a second writer is refused), held for the block."""
        loc = self.store.loc
        with collection_lease(loc.root, self.cid, storage_options=loc.storage_options):
            yield

    # ---- the search's steps (focus.journal.Journal) ----

    async def recorded(self, step: Step) -> Any | None:
        key = checkpoint_key(self.config, step)
        value = await asyncio.to_thread(self.load, key)
        if value is None:
            return None
        if step.kind == "wave" and isinstance(value, dict):  # saved before waves were typed
            value = WaveRollouts(value["rollouts"], value["wave_wall_s"])
        self._note(step, key, value, reused=True)
        return value

    async def record(self, step: Step, value: Any) -> None:
        key = checkpoint_key(self.config, step)
        await self.write(step, key, value)

    async def write(self, step: Step, key: tuple[str, int], value: Any) -> StepRecord:
        """Save one step and note its record (what a Prefect task run of the step runs)."""
        await asyncio.to_thread(self.save, key, value)
        return self._note(step, key, value, reused=False)

    def _note(self, step: Step, key: tuple[str, int], value: Any, *, reused: bool) -> StepRecord:
        extra: dict[str, Any] = {}
        if step.kind in ("evidence", "wave"):
            if step.kind == "evidence":
                logs = [r for t in value.trees for r in t.log]
                phases: dict[int, Usage] = {}
                for r in logs:
                    phases[r["phase"]] = phases.get(r["phase"], Usage()) + r["usage"]
                causes = [r["cause"] for r in logs if r["failed"]]
            else:
                rollouts = value.rollouts
                phases = {step.phase: Usage.total(Usage.of_rollout(ro) for ro in rollouts)}
                causes = [ro.leaf.cause for ro in rollouts if ro.leaf.kind == "failed"]
                logs = rollouts
            for p, used in phases.items():
                self._usage = self._usage + used
                self._phase_usage[p] = self._phase_usage.get(p, Usage()) + used
            failed, top = failures(causes)
            extra = {
                "rollouts": len(logs),
                "failed_rollouts": failed,
                "failure_causes": top,
                "usage": self._usage,
                "phase_usage": self._phase_usage.get(step.phase, Usage()),
            }
        return self.note(step.kind, key, step.phase, reused, **extra)

    def note(
        self, kind: str, key: tuple[str, int], phase_index: int = 0, reused: bool = False, **extra: Any
    ) -> StepRecord:
        """Add a step record (and pass it to ``on_step``)."""
        now = time.perf_counter()
        rec = StepRecord(kind, key[0], key[1], phase_index, reused, now - self._mark, **extra)
        self._mark = now
        self.records.append(rec)
        if self.on_step is not None:
            self.on_step(rec)
        return rec

    # ---- the pipeline's own steps ----

    def stored_fingerprint(self) -> dict[str, Any] | None:
        stored = self.load(CONFIG)
        return None if stored is None else dict(json.loads(stored))

    async def check_config(self) -> StepRecord:
        """Record the configuration on the first run; refuse to resume with another one."""
        mine = fingerprint(self.config)
        stored = await asyncio.to_thread(self.stored_fingerprint)
        if stored is not None:
            error = resume_mismatch(self.config, stored, mine)
            if error is not None:
                raise error
            return self.note("config", CONFIG, reused=True)
        await asyncio.to_thread(self.save, CONFIG, json.dumps(mine, sort_keys=True))
        return self.note("config", CONFIG)

    def batch_problem(self, url: str) -> str | None:
        """Why the finished batch at ``url`` cannot be trusted (missing, or a file that
        differs from its manifest), or ``None`` if every file checks out."""
        from storage import BatchNotFound, CorruptDataError, ManifestError

        try:
            self.batch_store.verify(url)
        except (BatchNotFound, CorruptDataError, ManifestError) as e:
            return str(e)
        return None

    def finished_export(self) -> dict[str, Any] | None:
        """The stored export of a finished collection whose batch checks out; ``None``
        if it is not finished, or its batch must be written again (then :attr:`damaged`
        says why)."""
        stored = self.load(EXPORT)
        if stored is None:
            return None
        self.damaged = self.batch_problem(stored["batch_url"])
        return stored if self.damaged is None else None

    async def finished(self) -> dict[str, Any] | None:
        """:meth:`finished_export`, noted as a reused export step when it is finished."""
        stored = await asyncio.to_thread(self.finished_export)
        if stored is not None:
            self.note("export", EXPORT, reused=True)
        return stored

    async def export(self, collector: Collector, state: SearchState) -> dict[str, Any]:
        """Prepare the batch from the final state and write it (again, if the stored one
        was damaged); the export's record, with the batch URL and statistics."""
        from focus.report import tree_svg

        batch = await asyncio.to_thread(collector.prepare, state)
        url = await asyncio.to_thread(self.batch_store.write, batch, overwrite=self.damaged is not None)
        svg = await asyncio.to_thread(tree_svg, state.trees, estimator=collector.estimator)
        await asyncio.to_thread(self.save, TREES_SVG, svg)
        result = {
            "batch_url": url,
            "summary": _jsonable(batch.summary()),
            "failure_causes": dict(batch.stats.get("failure_causes", {})),
        }
        await asyncio.to_thread(self.save, EXPORT, result)
        self.note("export", EXPORT)
        return result

    def tree_picture(self) -> str:
        """The SVG the export drew (empty if none)."""
        return str(self.load(TREES_SVG) or "")


def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v if isinstance(v, (int, float, str, bool)) or v is None else str(v) for k, v in d.items()}
