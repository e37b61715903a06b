"""The collector: search over tasks, then prepare a training batch from the trees.

``Collector`` wires an agent to a search configuration (a :class:`Priority` with its
phases), a critic, an estimator and an execution service. ``collect()`` is
``search()`` then ``prepare()``. The step-wise methods (``run_evidence``, ``score``,
``plan_wave``, ``run_wave``) are what the durable pipeline calls, one Prefect task
each; every step is a function of its inputs and the collection seed, so a resumed
collection rebuilds the same trees and the same batch.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from focus.agent import Agent
from focus.batch import ActorRow, Batch, CriticRow
from focus.critic import ConstantCritic, Critic
from focus.env import Task
from focus.estimation import DirectBranchTd, Estimator, critic_targets
from focus.execution import Execution
from focus.priority import Priority, Selective
from focus.search import SearchState, WavePlan, graft, plan_wave, unscored, usage_of, with_predictions
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
        self.search_config = search if search is not None else Selective()
        self.critic = critic if critic is not None else ConstantCritic(0.0)
        self.estimator = estimator if estimator is not None else DirectBranchTd()
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
        state = await self.run_evidence(tasks)
        for pi, phase in enumerate(self.search_config.phases):
            if phase.is_evidence:
                continue
            wave = state.waves_done(pi)
            while True:
                plan = self.plan_wave(state, pi, wave)
                if plan.empty:
                    break
                state = await self.run_wave(state, plan)
                wave += 1
        return state

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
        for ti, tree in enumerate(trees):
            tree_id = f"{tree.task_id}#{ti}"
            values = est.values(tree)
            adv = est.advantages(list(tree.edges.values()), values)
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
                        )
                    )
            for nid, tgt in sorted(critic_targets(tree, gamma=est.gamma).items()):
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
        return Batch(
            self.collection_id, self.iteration, actor, critic, self.statistics(trees, excluded_segments=excluded)
        )

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
