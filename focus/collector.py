"""The collector: search over tasks, then prepare a training batch from the trees.

``Collector`` wires an agent to a search configuration (a :class:`Priority` with its
phases), a critic, an estimator and an execution service. ``collect()`` is
``search()`` then ``prepare()``. The step-wise methods (``run_evidence``, ``score``,
``plan_wave``, ``run_wave``) are what the durable pipeline calls, one Prefect task
each; every step is a function of its inputs and the collection seed, so a resumed
collection rebuilds the same trees and the same batch.

With ``Execution(streaming=True)``, ``run_search`` runs each continuation phase with
:meth:`Collector.stream_phase` instead of in waves: no barrier, results depend on the
order rollouts finish in (see :class:`focus.execution.Execution`).
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from focus.agent import Agent
from focus.batch import ActorRow, Batch, CriticRow
from focus.critic import ConstantCritic, Critic
from focus.env import Task
from focus.estimation import DirectBranchTd, Estimator, critic_targets, truncated_segments
from focus.execution import Execution
from focus.priority import Priority, Selective
from focus.search import (
    InFlight,
    SearchState,
    WavePlan,
    graft,
    plan_refill,
    plan_wave,
    unscored,
    usage_of,
    with_predictions,
)
from focus.tree import Tree


class Collector:
    """Collects branching rollouts for ``tasks`` and prepares them for training."""

    def __init__(
        self,
        agent: Agent,
        search: Priority | None = None,
        critic: Critic | None = None,
        estimator: Estimator | None = None,
        execution: Execution | None = None,
        *,
        collection_id: str = "collection",
        iteration: int = 0,
        seed: int = 0,
    ) -> None:
        self.agent = agent
        self.estimator = estimator if estimator is not None else DirectBranchTd()
        # one γ, truncation rule and κ setting for search and batch (see Priority.resolved)
        self.search_config = (search if search is not None else Selective()).resolved(self.estimator)
        self.critic = critic if critic is not None else ConstantCritic(0.0)
        self.execution = execution if execution is not None else Execution()
        self.collection_id = collection_id
        self.iteration = iteration
        self.seed = seed

    # -- step-wise API ---------------------------------------------------------------

    async def start(self, tasks: Sequence[Task]) -> SearchState:
        """A state with one root checkpoint per task (env reset, opening context)."""
        if not tasks:
            raise ValueError("Collector needs at least one task")
        trees = []
        for task in tasks:
            if not isinstance(task, Task):
                raise TypeError(f"tasks must be focus.env.Task objects, got {type(task).__name__}")
            root = await self.agent.start(task)
            trees.append(Tree.new(task.id, root, tuple(root.context.prompt_ids)))
        return SearchState(self.collection_id, self.seed, tuple(tasks), trees)

    async def run_evidence(self, tasks: Sequence[Task]) -> SearchState:
        """Start the trees and, if the first phase is an evidence phase, run it (scored)."""
        state = await self.score(await self.start(tasks))
        if self.search_config.phases[0].is_evidence:
            state = await self.run_wave(state, self.plan_wave(state, 0, 0))
        return state

    async def score(self, state: SearchState) -> SearchState:
        """Critic predictions for checkpoints and truncated leaves that have none yet."""
        todo = unscored(state)
        if not todo:
            return state
        preds = await self.critic.predict_with_std([state.trees[ti].nodes[nid].context_ids for ti, nid in todo])
        if len(preds) != len(todo):
            raise ValueError(f"{type(self.critic).__name__} returned {len(preds)} predictions for {len(todo)} contexts")
        return with_predictions(state, {key: (float(p.value), p.std) for key, p in zip(todo, preds, strict=True)})

    def plan_wave(self, state: SearchState, phase_index: int, wave_index: int) -> WavePlan:
        """The jobs of one wave (pure); empty when the phase is done."""
        return plan_wave(state, self.search_config, phase_index, wave_index)

    async def run_wave(self, state: SearchState, plan: WavePlan) -> SearchState:
        """Run ``plan`` on the execution service, graft the rollouts, score new nodes."""
        if plan.empty:
            return state
        t0 = time.perf_counter()
        rollouts = await self.execution.run(self.agent, list(plan.jobs))
        phase = self.search_config.phases[plan.phase_index]
        new = graft(state, plan, rollouts, phase.name, wave_wall_s=time.perf_counter() - t0)
        return await self.score(new)

    # -- whole-collection API ----------------------------------------------------------

    async def run_search(self, tasks: Sequence[Task]) -> SearchState:
        """Every phase in order; a phase ends when its plan comes back empty."""
        if self.execution.streaming:
            for phase in self.search_config.phases:
                if phase.max_waves is not None:
                    raise ValueError(
                        f"phase {phase.name!r} sets max_waves, which streaming mode has no waves to count; "
                        "drop max_waves or run with Execution(streaming=False)"
                    )
        state = await self.run_evidence(tasks)
        for pi, phase in enumerate(self.search_config.phases):
            if phase.is_evidence:
                continue
            if self.execution.streaming:
                state = await self.stream_phase(state, pi)
                continue
            wave = state.waves_done(pi)
            while True:
                plan = self.plan_wave(state, pi, wave)
                if plan.empty:
                    break
                state = await self.run_wave(state, plan)
                wave += 1
        return state

    async def stream_phase(self, state: SearchState, phase_index: int) -> SearchState:
        """Run continuation phase ``phase_index`` keeping up to ``max_concurrency``
        rollouts in flight (streaming mode; not resumable part-way).

        Refilling and grafting are decoupled, because re-ranking a tree after a graft
        costs in proportion to the tree: whenever at least ``refill_at`` slots are free,
        :func:`focus.search.plan_refill` fills them from the last grafted state,
        counting rollouts running *and* finished-but-not-grafted toward branch limits and
        (by their expected transitions) the budget; finished rollouts are grafted (in
        (tree, node, branch) order, recorded as one "wave" of the phase) and their new
        nodes scored once ``graft_at`` of them have piled up, when a refill comes up
        short, or when nothing runs. The phase ends when nothing runs, nothing waits to
        be grafted and the planner has nothing more. Which rollouts a refill sees
        depends on timing, so two runs may plan differently; each rollout is still
        fixed by its job's seed.
        """
        phase = self.search_config.phases[phase_index]
        cap = self.execution.max_concurrency
        refill_at = max(1, int(cap * self.execution.refill_fraction))
        graft_at = max(1, int(cap * self.execution.graft_fraction))
        running: dict[asyncio.Future[Any], InFlight] = {}
        finished: list[tuple[InFlight, Any]] = []
        done: asyncio.Queue[asyncio.Future[Any]] = asyncio.Queue()
        wave = state.waves_done(phase_index)
        frozen = self.execution.freeze_gc and gc.get_freeze_count() == 0
        t_last = time.perf_counter()
        try:
            while True:
                free = cap - len(running)
                short = False
                if free >= refill_at or not running:
                    waiting = [*running.values(), *(f for f, _ in finished)]
                    refill = plan_refill(state, self.search_config, phase_index, waiting, free)
                    short = len(refill) < free
                    # longest-remaining first, as in a wave
                    for f in sorted(refill, key=lambda f: f.job.start.steps):
                        launched = self.execution.launch(self.agent, f.job)
                        launched.add_done_callback(done.put_nowait)
                        running[launched] = f
                if finished and (not running or len(finished) >= graft_at or (short and len(finished) >= refill_at)):
                    finished.sort(key=lambda p: (p[0].job.tree_index, p[0].job.node_id, p[0].job.branch))
                    now = time.perf_counter()
                    plan = WavePlan(phase_index, wave, tuple(f.job for f, _ in finished))
                    state = graft(state, plan, [r for _, r in finished], phase.name, wave_wall_s=now - t_last)
                    state = await self.score(state)
                    finished, t_last, wave = [], now, wave + 1
                    continue
                if not running:
                    return state
                if frozen:
                    # Keep the trees (most of the heap) out of cyclic GC while rollouts run;
                    # freezing again moves only what was created since (O(1)).
                    gc.freeze()
                task = await done.get()
                while True:
                    finished.append((running.pop(task), task.result()))
                    if done.empty():
                        break
                    task = done.get_nowait()
        finally:
            for t in running:
                t.cancel()
            if frozen:
                gc.unfreeze()

    async def search(self, tasks: Sequence[Task]) -> list[Tree]:
        return (await self.run_search(tasks)).trees

    async def collect(self, tasks: Sequence[Task]) -> Batch:
        return self.prepare(await self.run_search(tasks))

    def prepare(self, trees: Sequence[Tree] | SearchState) -> Batch:
        """Actor rows (one per model turn of every segment with an advantage) and critic
        rows (one per checkpoint), plus what the collection actually used."""
        if isinstance(trees, SearchState):
            trees = trees.trees
        est = self.estimator
        version = str(getattr(self.agent.policy, "policy_version", "0"))
        actor: list[ActorRow] = []
        critic: list[CriticRow] = []
        excluded = 0
        # the critic's weight is fitted once on the whole collection (empirical Bayes)
        noise = est.noise(trees) if est.kappa is None else None
        for ti, tree in enumerate(trees):
            tree_id = f"{tree.task_id}#{ti}"
            values = est.values(tree, noise)
            adv = est.advantages(list(tree.edges.values()), values)
            truncated = truncated_segments(tree)
            for e in tree.edges.values():
                if e.id not in adv:
                    excluded += 1
                    continue
                for j, t in enumerate(e.turns):
                    actor.append(
                        ActorRow(
                            self.collection_id,
                            self.iteration,
                            tree.task_id,
                            tree_id,
                            e.parent,
                            e.id,
                            j,
                            version,
                            t.prompt_ids,
                            t.completion_ids,
                            t.logprobs,
                            (t.loss_mask,) * len(t.completion_ids),
                            float(adv[e.id]),
                            float(t.reward),
                            t.finish_reason,
                            t.kind,
                            e.id in truncated,
                        )
                    )
            for nid, tgt in sorted(critic_targets(tree, gamma=est.gamma, truncation=est.truncation).items()):
                node = tree.nodes[nid]
                critic.append(
                    CriticRow(
                        self.collection_id,
                        self.iteration,
                        tree.task_id,
                        tree_id,
                        nid,
                        node.context_ids,
                        tgt.target,
                        tgt.weight,
                        node.value,
                    )
                )
        stats = self.statistics(trees, excluded_segments=excluded)
        if noise is not None:
            stats["noise_model"] = {
                "step_var_by_depth": list(noise.step_vars),
                "noise_var_by_depth": list(noise.noise_vars),
                "critic_var": noise.critic_var if noise.known else None,
                "residuals": noise.residuals,
                "spreads": noise.spreads,
                "repeats": noise.repeats,
            }
        return Batch(self.collection_id, self.iteration, actor, critic, stats)

    def statistics(self, trees: Sequence[Tree], *, excluded_segments: int = 0) -> dict[str, Any]:
        """Usage per phase and in total, from the rollout logs of the trees."""
        records = [r for t in trees for r in t.log]
        phases = []
        for pi, phase in enumerate(self.search_config.phases):
            recs = [r for r in records if r["phase"] == pi]
            budget = phase.transitions if not phase.is_evidence else None
            phases.append(
                {
                    "name": phase.name,
                    "index": pi,
                    "transition_budget": budget,
                    "rollouts_per_task": phase.rollouts_per_task,
                    "waves": len({r["wave"] for r in recs}),
                    **usage_of(recs),
                }
            )
        causes = Counter(r["cause"] for r in records if r["failed"])
        # A tree none of whose rollouts completed (e.g. its whole evidence phase failed)
        # contributes no actor rows; name it so it is not mistaken for a finished task.
        failed_trees = [t.task_id for t in trees if t.rollouts and not t.reaches_valid_leaf(t.ROOT)]
        return {
            "trees": len(trees),
            "failed_trees": len(failed_trees),
            "failed_tree_ids": failed_trees,
            **usage_of(records),
            "excluded_segments": excluded_segments,
            "checkpoints": sum(1 for t in trees for _ in t.checkpoints()),
            "phases": phases,
            "failure_causes": dict(causes.most_common(10)),
        }
