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

import asyncio
import gc
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from focus.config import FocusConfig
from focus.report import tree_svg

#: Fields that may differ between a run and its resume (where things run, not what).
RUNTIME_FIELDS = ("model.url", "execution", "progress", "storage")


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
    data.pop("execution", None)
    data.pop("progress", None)
    data.pop("storage", None)
    data.get("model", {}).pop("url", None)
    return data


def _diff(a: Any, b: Any, prefix: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for k in sorted(set(a) | set(b)):
            out += _diff(a.get(k), b.get(k), f"{prefix}{k}.")
        return out
    return [] if a == b else [prefix.rstrip(".")]


class Handoff:
    """The live search state of one flow run and the checkpoint key it corresponds to.

    Passed explicitly to every step of a run so a step need not reload what the
    previous step just computed; a fresh process starts empty and replays from storage.
    """

    def __init__(self) -> None:
        self.key: Key | None = None
        self.state: Any = None

    def put(self, key: Key, state: Any) -> None:
        self.key, self.state = key, state

    def get(self, key: Key) -> Any:
        return self.state if self.key == key else None


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

    def _run(self, fn: Callable[[Any, list[Any]], Any], rollouts: bool = True) -> Any:
        """Build a collector, run ``fn(collector, tasks)`` (a coroutine) and release everything.

        ``rollouts=False`` (scoring) skips connecting to the execution service."""
        from focus.execution import Execution

        policy = self.config.build_policy()
        agent, tasks = self.config.build_agent(policy)
        execution = self.make_execution() if rollouts else Execution()
        collector = self.config.build_collector(agent, execution)

        async def go() -> Any:
            try:
                return await fn(collector, tasks)
            finally:
                await policy.aclose()

        # The search state is a large graph of small objects that lives through the step;
        # without freezing it every full collection scans all of it (Prefect allocates a
        # lot between steps), which cost seconds per step at 10k transitions.
        gc.freeze()
        try:
            return asyncio.run(go())
        finally:
            gc.unfreeze()
            close = getattr(execution, "close", None)
            if close is not None:
                close()

    def _record(self, key: Key, reused: bool, t0: float, state: Any = None, **extra: Any) -> dict[str, Any]:
        out: dict[str, Any] = {
            "phase": key.phase,
            "wave": key.wave,
            "reused": reused,
            "wall_s": time.perf_counter() - t0,
        }
        if state is not None:
            out.update(state_stats(state))
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
            stored = json.loads(self.load(CONFIG))
            if stored != mine:
                fields = ", ".join(_diff(stored, mine)) or "?"
                raise ResumeMismatch(
                    f"collection {self.cid!r} already exists in {self.config.storage.root} with a different "
                    f"configuration (differs in: {fields}); resume it with the same configuration or use a new "
                    "collection id"
                )
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
        return self._record(EVIDENCE, False, t0, state)

    def score(self, source: Key, target: Key) -> dict[str, Any]:
        """Critic predictions for the nodes that have none; stores only those predictions."""
        t0 = time.perf_counter()
        if self.done(target):
            return self._record(target, True, t0)
        state = self.state_at(source)

        async def fn(c: Any, _tasks: list[Any]) -> Any:
            try:
                return await c.score(state)
            finally:
                await c.critic.aclose()

        scored = self._run(fn, rollouts=False)
        self.save(target, _score_delta(state, scored))
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
        used = new_state.usage(phase_index)
        return self._record(
            key,
            False,
            t0,
            new_state,
            done=False,
            jobs=len(rollouts),
            phase_transitions=int(used["transitions"]),
            phase_tokens=int(used["tokens"]),
        )

    def export(self, source: Key) -> dict[str, Any]:
        """Prepare the batch from the final state and write it; the batch URL comes back."""
        t0 = time.perf_counter()
        if self.done(EXPORT):
            return {**self.load(EXPORT), "reused": True}
        state = self.state_at(source)
        policy = self.config.build_policy()
        agent, _ = self.config.build_agent(policy)
        collector = self.config.build_collector(agent)
        batch = collector.prepare(state.trees)
        url = self.batch_store.write(batch)
        self.save(TREES_SVG, tree_svg(state.trees))
        result = {"phase": EXPORT.phase, "batch_url": url, "summary": _jsonable(batch.summary()), "wall_s": 0.0}
        result["wall_s"] = time.perf_counter() - t0
        self.save(EXPORT, result)
        return {**result, "reused": False}


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


def _score_delta(before: Any, after: Any) -> dict[tuple[int, int], tuple[float | None, float | None]]:
    """(tree index, node id) -> (value, std) of the nodes scoring filled in."""
    out = {}
    for ti, (a, b) in enumerate(zip(before.trees, after.trees, strict=True)):
        for nid, node in b.nodes.items():
            old = a.nodes.get(nid)
            if node.value is not None and (old is None or old.value is None):
                out[(ti, nid)] = (node.value, node.value_std)
    return out


def _apply_scores(state: Any, delta: dict[tuple[int, int], tuple[float | None, float | None]]) -> Any:
    """``state`` with stored predictions filled in, as ``Collector.score`` fills them."""
    from focus.search import copy_state

    new = copy_state(state)
    for (ti, nid), (value, std) in delta.items():
        node = new.trees[ti].nodes[nid]
        node.value, node.value_std = value, std
    return new


def state_stats(state: Any) -> dict[str, int]:
    """Totals over a search state's trees (what progress and statistics show)."""
    totals: dict[str, int] = {}
    for tree in state.trees:
        for k, v in tree.stats().items():
            totals[k] = totals.get(k, 0) + v
    return {k: totals.get(k, 0) for k in ("transitions", "tokens", "model_calls", "nodes")}


def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v if isinstance(v, (int, float, str, bool)) or v is None else str(v) for k, v in d.items()}


def config_hash(config: FocusConfig) -> str:
    return hashlib.sha256(json.dumps(fingerprint(config), sort_keys=True).encode()).hexdigest()[:12]
