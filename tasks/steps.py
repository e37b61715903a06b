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
replaying the deltas - re-planning each wave (planning is a pure function of the state
and the seed) and grafting its stored rollouts - which recomputes no rollout.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from focus.report import tree_svg
from tasks.config import FocusConfig
from tasks.runtime import Runtime

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
    """The live search state of one flow run, the checkpoint key it corresponds to, and
    the :class:`~tasks.runtime.Runtime` the run's steps share.

    Passed explicitly to every step of a run so a step need not reload what the
    previous step just computed, nor rebuild the agent and collector; a fresh process
    starts empty and replays from storage. Close it (or use it as a context manager)
    when the run ends, to close the runtime's clients and event loop.
    """

    def __init__(self) -> None:
        self.key: Key | None = None
        self.state: Any = None
        self._runtime: Runtime | None = None
        #: tree index -> running sums over that tree's log (see :meth:`stats`).
        self._totals: dict[int, _LogTotals] = {}

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
        """Close the runtime (the live state stays)."""
        rt, self._runtime = self._runtime, None
        if rt is not None:
            rt.close()

    def close(self) -> None:
        self.release()
        self._totals.clear()

    def __enter__(self) -> Handoff:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stats(self, state: Any, phase_index: int | None = None) -> dict[str, int]:
        """:func:`state_stats` of ``state`` plus, with ``phase_index``, that phase's
        transitions and tokens (``phase_transitions``, ``phase_tokens``) and its budget
        spent as the planner counts it (``phase_spent``: at least one per rollout).

        Per tree, only the log records added since the tree was last seen are counted
        (a graft copies a tree's log list but shares its records and appends new ones),
        so a step's record costs in proportion to the step, not to the collection.
        """
        out: dict[str, int] = {"nodes": 0}
        seen = self._totals
        for ti, tree in enumerate(state.trees):
            hit = seen.get(ti)
            log = tree.log
            if hit is None or hit.n > len(log) or (hit.n and log[hit.n - 1] is not hit.last):
                hit = seen[ti] = _LogTotals()
            hit.add(log)
            out["nodes"] += len(tree.nodes)
            for k, v in hit.all.items():
                out[k] = out.get(k, 0) + v
            if phase_index is not None:
                pt, pk, ps = hit.phases.get(phase_index, (0, 0, 0))
                out["phase_transitions"] = out.get("phase_transitions", 0) + pt
                out["phase_tokens"] = out.get("phase_tokens", 0) + pk
                out["phase_spent"] = out.get("phase_spent", 0) + ps
        return out


class _LogTotals:
    """Running sums over one tree's rollout log (records are appended, never edited)."""

    __slots__ = ("n", "last", "all", "phases")

    def __init__(self) -> None:
        self.n = 0
        self.last: dict[str, Any] | None = None
        self.all = {"transitions": 0, "tokens": 0, "model_calls": 0}
        #: phase -> (transitions, tokens, budget spent: at least 1 per rollout, as planned)
        self.phases: dict[int, tuple[int, int, int]] = {}

    def add(self, log: list[dict[str, Any]]) -> None:
        for r in log[self.n :]:
            tr, tok = int(r["transitions"]), int(r["tokens"])
            self.all["transitions"] += tr
            self.all["tokens"] += tok
            self.all["model_calls"] += int(r["model_calls"])
            pt, pk, ps = self.phases.get(r["phase"], (0, 0, 0))
            self.phases[r["phase"]] = (pt + tr, pk + tok, ps + max(1, tr))
        self.n = len(log)
        self.last = log[-1] if log else None


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
        """The search state as of checkpoint ``key``: from the handoff, else replayed."""
        state = self.handoff.get(key)
        if state is not None:
            return state
        from focus.search import graft, plan_wave

        state = self.load(EVIDENCE)
        at = EVIDENCE
        if key != at:
            state, at = _apply_scores(state, self.load(EVIDENCE_SCORED)), EVIDENCE_SCORED
        priority = self.config.search.priority()
        for p in range(1, len(self.config.search.phases)):
            w = 0
            while key != at and self.done(wave_key(self.config, p, w)):
                delta = self.load(wave_key(self.config, p, w))
                plan = plan_wave(state, priority, p, w)
                name = self.config.search.phases[p].name
                state, at = (
                    graft(state, plan, delta["rollouts"], name, delta["wave_wall_s"]),
                    wave_key(self.config, p, w),
                )
                if key != at:
                    state, at = (
                        _apply_scores(state, self.load(score_key(self.config, p, w))),
                        score_key(self.config, p, w),
                    )
                w += 1
        if key != at:
            raise RuntimeError(f"collection {self.cid!r}: cannot rebuild the state at {key} from its checkpoints")
        self.handoff.put(key, state)
        return state

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
            state = await c.start(tasks)
            if c.search_config.phases[0].is_evidence:
                state, _, _ = await _rollouts(c, state, c.plan_wave(state, 0, 0))
            return state

        state = self._run(fn)
        self.save(EVIDENCE, state)
        self.handoff.put(EVIDENCE, state)
        causes = (r["cause"] for t in state.trees for r in t.log if r["failed"])
        rollouts = sum(len(t.log) for t in state.trees)
        return self._record(EVIDENCE, False, t0, state, rollouts=rollouts, **failures(causes))

    def score(self, source: Key, target: Key) -> dict[str, Any]:
        """Critic predictions for the nodes that have none; stores only those predictions."""
        t0 = time.perf_counter()
        if self.done(target):
            return self._record(target, True, t0)
        state = self.state_at(source)

        async def fn(c: Any, _tasks: list[Any]) -> Any:
            return await c.score(state)  # the runtime closes the critic's client at the end

        from focus.search import unscored

        todo = unscored(state)  # cached per tree in the state: cheap
        scored = self._run(fn)
        self.save(target, _score_delta(todo, scored))
        self.handoff.put(target, scored)
        return self._record(target, False, t0, scored)

    def wave(self, source: Key, phase_index: int, wave: int) -> dict[str, Any]:
        """Plan and run wave ``wave`` of continuation phase ``phase_index``.

        Returns ``done: True`` (and writes the phase's end marker) when the plan is
        empty: the phase's budget is spent or nothing is left to continue.
        """
        t0 = time.perf_counter()
        key, end = wave_key(self.config, phase_index, wave), end_key(self.config, phase_index)
        if self.done(key):
            return self._record(key, True, t0, done=False)
        if self.done(end) and self.load(end) == wave:
            return self._record(key, True, t0, done=True)
        state = self.state_at(source)

        async def fn(c: Any, _tasks: list[Any]) -> Any:
            plan = c.plan_wave(state, phase_index, wave)
            if plan.empty:
                return None
            return await _rollouts(c, state, plan)

        ran = self._run(fn)
        if ran is None:
            self.save(end, wave)
            return self._record(key, False, t0, done=True, jobs=0)
        new_state, rollouts, wall = ran
        self.save(key, {"rollouts": rollouts, "wave_wall_s": wall})
        self.handoff.put(key, new_state)
        causes = (ro.leaf.cause for ro in rollouts if ro.leaf.kind == "failed")
        return self._record(
            key, False, t0, new_state, done=False, jobs=len(rollouts), phase_index=phase_index, **failures(causes)
        )

    def export(self, source: Key) -> dict[str, Any]:
        """Prepare the batch from the final state and write it; the batch URL comes back."""
        t0 = time.perf_counter()
        damaged = None
        if self.done(EXPORT):
            stored = self.load(EXPORT)
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
        self.save(EXPORT, result)
        return {**result, "reused": False, "repaired": damaged}

    def batch_problem(self, url: str) -> str | None:
        """Why the finished batch at ``url`` cannot be trusted (missing, or a file that
        differs from its manifest), or ``None`` if every file checks out."""
        from storage import BatchNotFound, CorruptDataError, ManifestError

        try:
            self.batch_store.verify(url)
        except (BatchNotFound, CorruptDataError, ManifestError) as e:
            return str(e)
        return None


async def _rollouts(collector: Any, state: Any, plan: Any) -> Any:
    """Run a wave's jobs and graft them, leaving scoring to the scoring step.

    This is ``Collector.run_wave`` without its final ``score``: the pipeline scores in
    its own task, so a failing critic service fails (and is retried as) the scoring
    step, never a finished wave. Critic predictions depend only on a node's context, so
    the result equals ``Collector.run_wave``'s (the pipeline tests check it).
    """
    from focus.search import graft

    t0 = time.perf_counter()
    rollouts = await collector.execution.run(collector.agent, list(plan.jobs))
    wall = time.perf_counter() - t0
    name = collector.search_config.phases[plan.phase_index].name
    return graft(state, plan, rollouts, name, wave_wall_s=wall), rollouts, wall


def _score_delta(keys: list[tuple[int, int]], after: Any) -> dict[tuple[int, int], tuple[float | None, float | None]]:
    """(tree index, node id) -> (value, std) of the nodes ``keys`` that scoring filled in."""
    out = {}
    for ti, nid in keys:
        node = after.trees[ti].nodes[nid]
        if node.value is not None:
            out[(ti, nid)] = (node.value, node.value_std)
    return out


def _apply_scores(state: Any, delta: dict[tuple[int, int], tuple[float | None, float | None]]) -> Any:
    """``state`` with stored predictions filled in, as ``Collector.score`` fills them."""
    from focus.search import with_predictions

    return with_predictions(state, delta)


def state_stats(state: Any) -> dict[str, int]:
    """Totals over a search state's trees, from the trees' nodes and edges (what
    progress and statistics show; :meth:`Handoff.stats` gives the same incrementally)."""
    totals: dict[str, int] = {}
    for tree in state.trees:
        for k, v in tree.stats().items():
            totals[k] = totals.get(k, 0) + v
    return {k: totals.get(k, 0) for k in ("transitions", "tokens", "model_calls", "nodes")}


def failures(causes: Any) -> dict[str, Any]:
    """``failed_rollouts`` and the most frequent ``failure_causes`` of one step's rollouts."""
    from collections import Counter

    counted = Counter(c or "unknown" for c in causes)
    return {"failed_rollouts": sum(counted.values()), "failure_causes": dict(counted.most_common(5))}


def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v if isinstance(v, (int, float, str, bool)) or v is None else str(v) for k, v in d.items()}


def config_hash(config: FocusConfig) -> str:
    return hashlib.sha256(json.dumps(fingerprint(config), sort_keys=True).encode()).hexdigest()[:12]
