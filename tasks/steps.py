"""The steps of one collection, each idempotent on (collection id, phase, wave).

A step loads its input checkpoint, runs one piece of the Collector's step-wise API,
saves its output checkpoint to object storage and returns a small JSON-able record.
If its output checkpoint already exists, it returns at once (``reused: True``): that is
what makes a rerun - a flow retry, a rerun from the UI or the CLI with the same
collection id - resume after the last finished step and recompute nothing finished.
Nothing here imports Prefect: the Prefect tasks in :mod:`tasks.phases` are thin
wrappers, and these functions are testable and benchmarkable on their own.

Checkpoint keys (phase, wave), in the order a collection writes them::

    ("config", 0)          the configuration fingerprint (guards resumes)
    ("evidence", 0)        the full search state after the evidence rollouts
    ("evidence.score", 0)  the critic's predictions added by scoring (a delta)
    ("<p>.<name>", w)      the rollouts of wave w of continuation phase p (a delta)
    ("<p>.<name>.score", w)the predictions for that wave's new checkpoints (a delta)
    ("<p>.<name>.end", 0)  marker: phase p planned an empty wave at that wave index
    ("export", 0)          the batch URL and statistics

Only the evidence state is stored whole; later checkpoints are deltas, so a wave's
checkpoint costs in proportion to the wave, not to everything collected so far (the
full state grows with every wave; pickling it after each one made the flow several
times slower than ``Collector.collect()``). The live state passes from step to step in
memory through a :class:`Handoff`; after a crash it is rebuilt from the checkpoints by
:func:`focus.search.replay` - re-planning each wave (planning is a pure function of the
state and the seed) and grafting its stored rollouts - which recomputes no rollout.

Every step runs one of the library's step functions (``Collector.evidence``,
``predict``, ``phase_waves``, ``prepare``); nothing here runs rollouts itself. A wave
step takes the next wave of ``Collector.phase_waves``, which a
:class:`~tasks.runtime.WaveDriver` runs on the run's loop ahead of the steps: it lands,
scores and launches the following waves while a step checkpoints and the flow moves
on, so neither holds a wave back. A wave whose rollouts fail because the model service
is out raises ``ModelServiceOutage``; its checkpoint is not written, so a rerun
computes it again.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from focus.collector import Running
from focus.report import tree_svg
from focus.search import WaveRecord, replay, with_predictions
from focus.usage import LogTotals
from tasks.config import FocusConfig
from tasks.runtime import Runtime, WaveDriver

#: Fields that may differ between a run and its resume (where things run, not what).
#: The HTTP clients' timeouts, retries and hedging change how patiently a result is
#: fetched, not the result (requests are seeded).
RUNTIME_FIELDS = ("model.url", "model.http", "critic.http", "execution", "progress", "storage")


class ResumeMismatch(RuntimeError):
    """A collection id reused with a different configuration."""


@dataclass(frozen=True)
class Key:
    phase: str
    wave: int = 0


EVIDENCE = Key("evidence")
EVIDENCE_SCORED = Key("evidence.score")
EXPORT = Key("export")
TREES_SVG = Key("trees.svg")
CONFIG = Key("config")


def wave_key(config: FocusConfig, phase_index: int, wave: int) -> Key:
    return Key(f"{phase_index}.{config.search.phases[phase_index].name}", wave)


def score_key(config: FocusConfig, phase_index: int, wave: int) -> Key:
    return Key(f"{phase_index}.{config.search.phases[phase_index].name}.score", wave)


def end_key(config: FocusConfig, phase_index: int) -> Key:
    return Key(f"{phase_index}.{config.search.phases[phase_index].name}.end")


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


class Handoff:
    """The live search state of one flow run, the checkpoint key it corresponds to, the
    :class:`~tasks.runtime.Runtime` the run's steps share, and the waves still running
    on that runtime's loop (:class:`focus.collector.Running`).

    Passed explicitly to every step of a run so a step need not reload what the
    previous step just computed, nor rebuild the agent and collector; a fresh process
    starts empty and replays from storage. Close it (or use it as a context manager)
    when the run ends, to stop running waves and close the runtime's clients and loop.
    """

    def __init__(self) -> None:
        self.key: Key | None = None
        self.state: Any = None
        self._runtime: Runtime | None = None
        #: Waves launched on the runtime's loop and not landed yet.
        self.running = Running()
        #: The current continuation phase's waves, landing ahead of the wave steps.
        self.driver: WaveDriver | None = None
        #: Usage totals over the live state's trees, updated per step (see :meth:`stats`).
        self._totals = LogTotals()

    def put(self, key: Key, state: Any) -> None:
        self.key, self.state = key, state

    def get(self, key: Key) -> Any:
        return self.state if self.key == key else None

    def runtime(self, config: FocusConfig, make_execution: Callable[[], Any]) -> Runtime:
        """The runtime for ``config``: the one already built if its config is equal."""
        if self._runtime is None or not self._runtime.matches(config):
            self.release()
            self._runtime = Runtime(config, make_execution)
        return self._runtime

    def release(self) -> None:
        """Stop the running waves and close the runtime (the live state stays)."""
        rt, self._runtime = self._runtime, None
        if rt is not None:
            try:
                self.stop_driver()
                if self.running.waves and not rt.closed:
                    rt.call(self.running.cancel())
            finally:
                rt.close()
        self.running = Running()

    def drive(self, runtime: Runtime, state: Any, phase_index: int, wave: int) -> WaveDriver:
        """The driver whose next outcome is wave ``wave`` of ``phase_index`` from
        ``state``: the running one if it is, else a new one (the old one stopped)."""
        if self.driver is None or not self.driver.continues(phase_index, wave, state):
            self.stop_driver()
            self.driver = WaveDriver(runtime, state, phase_index, wave, self.running)
        return self.driver

    def stop_driver(self) -> None:
        driver, self.driver = self.driver, None
        if driver is not None:
            driver.stop()

    def outcome_of(self, grafted: Any) -> Any:
        """The driver's last outcome if ``grafted`` is its grafted state (else ``None``)."""
        last = self.driver.last if self.driver is not None else None
        return last if last is not None and last.grafted is grafted else None

    def close(self) -> None:
        self.release()
        self._totals.clear()

    def __enter__(self) -> Handoff:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stats(self, state: Any, phase_index: int | None = None) -> dict[str, Any]:
        """What a step record shows about ``state``: ``usage``, the collection's
        :class:`focus.usage.Usage` so far (as a dict), ``nodes``, and with
        ``phase_index`` that phase's usage (``phase_usage``; its ``budget_spent`` is the
        budget as the planner counts it).

        Only the log records added since the last call are counted, so a step's record
        costs in proportion to the step, not to the collection.
        """
        total, phases = self._totals.update(state.trees)
        out: dict[str, Any] = {"nodes": sum(len(t.nodes) for t in state.trees), "usage": total.as_dict()}
        if phase_index is not None:
            out["phase_usage"] = phases.get(phase_index, type(total)()).as_dict()
        return out


class Steps:
    """The steps of one collection against one checkpoint store.

    ``store`` is a :class:`storage.CheckpointStore`; ``make_execution`` builds the
    execution service a step runs rollouts on (in-process or Dask), and is closed after
    the step.
    """

    def __init__(
        self,
        config: FocusConfig,
        store: Any,
        batch_store: Any,
        make_execution: Callable[[], Any],
        handoff: Handoff | None = None,
    ) -> None:
        if not config.collection_id:
            raise ValueError("a collection needs a collection_id before its steps run")
        self.config = config
        self.cid: str = config.collection_id
        self.store = store
        self.batch_store = batch_store
        self.make_execution = make_execution
        #: A Steps made without a handoff keeps the live state but closes its runtime
        #: after each step, as nobody else would close it.
        self._owns_handoff = handoff is None
        self.handoff = handoff if handoff is not None else Handoff()

    # ---- checkpoints ----

    def load(self, key: Key) -> Any:
        return self.store.load(self.cid, key.phase, key.wave)

    def done(self, key: Key) -> bool:
        return bool(self.store.exists(self.cid, key.phase, key.wave))

    def save(self, key: Key, obj: Any) -> None:
        self.store.save(self.cid, key.phase, key.wave, obj)

    def state_at(self, key: Key) -> Any:
        """The search state as of checkpoint ``key``: from the handoff, else replayed
        (:func:`focus.search.replay`) from the stored evidence state and wave deltas."""
        state = self.handoff.get(key)
        if state is not None:
            return state
        state = self.load(EVIDENCE)
        if key != EVIDENCE:
            state = with_predictions(state, self.load(EVIDENCE_SCORED))
            if key != EVIDENCE_SCORED:
                records = list(self._wave_records(key))
                last = records[-1] if records else None
                if last is None or key not in (
                    wave_key(self.config, last.phase_index, last.wave_index),
                    score_key(self.config, last.phase_index, last.wave_index),
                ):
                    raise RuntimeError(
                        f"collection {self.cid!r}: cannot rebuild the state at {key} from its checkpoints"
                    )
                state = replay(state, self.config.priority(), records)
        self.handoff.put(key, state)
        return state

    def _wave_records(self, key: Key) -> Any:
        """The stored continuation waves, in order, up to checkpoint ``key``."""
        for p in range(1, len(self.config.search.phases)):
            w = 0
            while self.done(wave_key(self.config, p, w)):
                delta = self.load(wave_key(self.config, p, w))
                at_wave = key == wave_key(self.config, p, w)
                scored = not at_wave and self.done(score_key(self.config, p, w))
                preds = self.load(score_key(self.config, p, w)) if scored else None
                yield WaveRecord(p, w, delta["rollouts"], delta["wave_wall_s"], preds)
                if at_wave or key == score_key(self.config, p, w) or not scored:
                    return
                w += 1

    # ---- running collector pieces ----

    def runtime(self) -> Runtime:
        return self.handoff.runtime(self.config, self.make_execution)

    def _run(self, fn: Callable[[Any, list[Any]], Any]) -> Any:
        """Run ``fn(collector, tasks)`` (a coroutine) on the run's shared runtime."""
        try:
            return self.runtime().run(fn)
        finally:
            if self._owns_handoff:
                self.handoff.release()

    def _record(self, key: Key, reused: bool, t0: float, state: Any = None, **extra: Any) -> dict[str, Any]:
        out: dict[str, Any] = {
            "phase": key.phase,
            "wave": key.wave,
            "reused": reused,
            "wall_s": time.perf_counter() - t0,
        }
        if state is not None:
            out.update(self.handoff.stats(state, extra.pop("phase_index", None)))
        out.update(extra)
        return out

    def tree_picture(self) -> str:
        """The SVG written by :meth:`export` (empty if none)."""
        return str(self.load(TREES_SVG)) if self.done(TREES_SVG) else ""

    # ---- the steps ----

    def check_config(self) -> dict[str, Any]:
        """Record the config on first run; refuse to resume a collection with another one."""
        mine = fingerprint(self.config)
        if self.done(CONFIG):
            error = resume_mismatch(self.config, json.loads(self.load(CONFIG)), mine)
            if error is not None:
                raise error
            return {"phase": CONFIG.phase, "reused": True}
        self.save(CONFIG, json.dumps(mine, sort_keys=True))
        return {"phase": CONFIG.phase, "reused": False}

    def evidence(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        if self.done(EVIDENCE):
            return self._record(EVIDENCE, True, t0)

        async def fn(c: Any, tasks: list[Any]) -> Any:
            return await c.evidence(tasks)

        state = self._run(fn)
        self.save(EVIDENCE, state)
        self.handoff.put(EVIDENCE, state)
        causes = (r["cause"] for t in state.trees for r in t.log if r["failed"])
        rollouts = sum(len(t.log) for t in state.trees)
        return self._record(EVIDENCE, False, t0, state, rollouts=rollouts, **failures(causes))

    def score(self, source: Key, target: Key) -> dict[str, Any]:
        """Critic predictions for the nodes that have none; stores only those predictions.

        After a wave step, the wave driver has scored already (its outcome holds the
        predictions, or the critic's error, raised here); this step stores them.
        """
        t0 = time.perf_counter()
        if self.done(target):
            return self._record(target, True, t0)
        state = self.state_at(source)
        outcome = self.handoff.outcome_of(state)
        if outcome is not None:
            if outcome.error is not None:
                self.handoff.stop_driver()
                raise outcome.error
            preds, scored = outcome.predictions, outcome.scored
        else:

            async def fn(c: Any, _tasks: list[Any]) -> Any:
                return await c.predict(state)  # the runtime closes the critic's client at the end

            preds = self._run(fn)
            scored = with_predictions(state, preds) if preds else state
        self.save(target, preds)
        self.handoff.put(target, scored)
        return self._record(target, False, t0, scored)

    def wave(self, source: Key, phase_index: int, wave: int) -> dict[str, Any]:
        """Land wave ``wave`` of continuation phase ``phase_index`` and store its
        rollouts: the next outcome of the handoff's :class:`~tasks.runtime.WaveDriver`
        (``Collector.phase_waves``: plan ahead, launch, graft the oldest planned wave,
        score it, launch the next), started from the state at ``source`` unless the
        running driver already continues from it.

        Returns ``done: True`` (and writes the phase's end marker) when nothing more is
        planned: the phase's budget is spent or nothing is left to continue. Raises
        ``ModelServiceOutage`` without writing anything when the model service was out.
        """
        t0 = time.perf_counter()
        key, end = wave_key(self.config, phase_index, wave), end_key(self.config, phase_index)
        if self.done(key):
            return self._record(key, True, t0, done=False)
        if self.done(end) and self.load(end) == wave:
            return self._record(key, True, t0, done=True)
        state = self.state_at(source)
        try:
            driver = self.handoff.drive(self.runtime(), state, phase_index, wave)
            outcome = driver.take()
        except BaseException:
            self.handoff.stop_driver()
            raise
        finally:
            if self._owns_handoff:
                self.handoff.release()
        if outcome is None:
            self.handoff.stop_driver()
            self.save(end, wave)
            return self._record(key, False, t0, done=True, jobs=0)
        new_state, landed = outcome.grafted, outcome.landed
        if (landed.plan.phase_index, landed.plan.wave_index) != (phase_index, wave):
            raise RuntimeError(
                f"collection {self.cid!r}: asked for wave {wave} of phase {phase_index}, but the search's next wave is "
                f"{landed.plan.wave_index} of phase {landed.plan.phase_index}"
            )
        self.save(key, {"rollouts": landed.rollouts, "wave_wall_s": landed.wall_s})
        self.handoff.put(key, new_state)
        causes = (ro.leaf.cause for ro in landed.rollouts if ro.leaf.kind == "failed")
        return self._record(
            key,
            False,
            t0,
            new_state,
            done=False,
            jobs=len(landed.rollouts),
            phase_index=phase_index,
            **failures(causes),
        )

    def export(self, source: Key) -> dict[str, Any]:
        """Prepare the batch from the final state and write it; the batch URL comes back."""
        t0 = time.perf_counter()
        damaged = None
        if self.done(EXPORT):
            stored = self.finished_export()
            damaged = self.batch_problem(stored["batch_url"])
            if damaged is None:
                return {**stored, "reused": True}
            # the batch no longer matches its manifest: write it again from the checkpoints
        state = self.state_at(source)
        try:
            collector = self.runtime().collector
            batch = collector.prepare(state.trees)
        finally:
            if self._owns_handoff:
                self.handoff.release()
        url = self.batch_store.write(batch, overwrite=damaged is not None)
        self.save(TREES_SVG, tree_svg(state.trees, estimator=collector.estimator))
        result = {
            "phase": EXPORT.phase,
            "batch_url": url,
            "summary": _jsonable(batch.summary()),
            "failure_causes": dict(batch.stats.get("failure_causes", {})),
            "wall_s": 0.0,
        }
        result["wall_s"] = time.perf_counter() - t0
        # the record names the batch relative to the store's root, so the store can move
        self.save(EXPORT, {**result, "batch_url": self.batch_store.ref(url)})
        return {**result, "reused": False, "repaired": damaged}

    def finished_export(self) -> dict[str, Any]:
        """The stored export record, its batch located under this store's root."""
        stored = self.load(EXPORT)
        return {**stored, "batch_url": self.batch_store.locate(stored["batch_url"])}

    def batch_problem(self, url: str) -> str | None:
        """Why the finished batch at ``url`` cannot be trusted (missing, or a file that
        differs from its manifest), or ``None`` if every file checks out."""
        from storage import BatchNotFound, CorruptDataError, ManifestError

        try:
            self.batch_store.verify(url)
        except (BatchNotFound, CorruptDataError, ManifestError) as e:
            return str(e)
        return None


def failures(causes: Any) -> dict[str, Any]:
    """``failed_rollouts`` and the most frequent ``failure_causes`` of one step's rollouts."""
    from collections import Counter

    counted = Counter(c or "unknown" for c in causes)
    return {"failed_rollouts": sum(counted.values()), "failure_causes": dict(counted.most_common(5))}


def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v if isinstance(v, (int, float, str, bool)) or v is None else str(v) for k, v in d.items()}


def config_hash(config: FocusConfig) -> str:
    return hashlib.sha256(json.dumps(fingerprint(config), sort_keys=True).encode()).hexdigest()[:12]
