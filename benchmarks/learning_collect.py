"""One iteration's batch of the learning benchmark, and what its trees held.

GRPO: ``2 * EVIDENCE`` independent rollouts per task. FOCUS and uniform: ``evidence``
rollouts per task (``EVIDENCE`` unless ``--evidence`` says otherwise), then a
continuation phase worth ``continuation`` rollouts per task (by default ``2 * EVIDENCE
- evidence``: the batch costs what ``2 * EVIDENCE`` independent rollouts of the same
policy cost, GRPO's batch). The budget is measured on the evidence: ``continuation /
evidence`` times the transitions the evidence took.

``--evidence 6`` keeps the batch's cost and moves two rollouts' worth from
continuations to evidence (more independent draws per task when tasks are few);
``--evidence 8 --continuation-rollouts 8`` gives FOCUS GRPO's group as evidence and
the same again in continuations, twice GRPO's transitions per batch.

A tree is *flat* when every valid leaf returned alike: no estimator that compares
returns within a task gives its segments a nonzero advantage. ``flat_trees`` counts
them in the batch and ``flat_evidence_trees`` the trees whose evidence rollouts were
flat before any continuation ran (FOCUS and uniform), so that the two together say
whether an empty batch is the evidence's or the continuations' doing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from focus.agent import Agent
from focus.backups import tree_values
from focus.critic import Critic
from focus.env import Task
from focus.estimation import Estimator
from focus.priority import Phase, Selective, Uniform
from focus.tree import Tree

#: Complete rollouts per task before any branching (every method's default; GRPO's
#: group is twice it).
EVIDENCE = 4


def continuation_budget(used: int, evidence: int, continuation: int | None) -> int:
    """The continuation phase's transitions: ``continuation`` rollouts' worth per task,
    measured on the evidence's ``used`` transitions over ``evidence`` rollouts per task
    (``continuation`` None: ``2 * EVIDENCE - evidence``, GRPO's batch cost in all)."""
    extra = 2 * EVIDENCE - evidence if continuation is None else continuation
    return max(0, round(used * extra / evidence))


def flat(trees: Sequence[Tree]) -> tuple[int, int]:
    """(trees whose valid leaves all returned alike, those of them whose return was > 0)."""
    n = won = 0
    for tree in trees:
        rets = tree_values(tree, kappa=0.0).leaf_returns
        if rets and max(rets) - min(rets) <= 1e-9:
            n += 1
            won += rets[0] > 0
    return n, won


async def collect(
    agent: Agent, method: str, critic: Critic, estimator: Estimator, tasks: list[Task], cid: str, it: int, seed: int
) -> Any:
    """One iteration's batch at the default evidence (what ``benchmarks.gradient_quality``
    and ``benchmarks.learning_probe`` compare against)."""
    batch, _ = await collect_counted(agent, method, critic, estimator, tasks, cid, it, seed)
    return batch


async def collect_counted(
    agent: Agent,
    method: str,
    critic: Critic,
    estimator: Estimator,
    tasks: list[Task],
    cid: str,
    it: int,
    seed: int,
    evidence: int = EVIDENCE,
    continuation: int | None = None,
) -> tuple[Any, dict[str, int]]:
    """One iteration's batch, and its trees' flat counts (the module docstring)."""
    from focus.collector import Collector
    from focus.execution import Execution

    priority = Uniform if method == "uniform" else Selective

    def collector(*phases: Phase) -> Collector:
        return Collector(
            agent,
            search=priority(phases=phases),
            critic=critic,
            estimator=estimator,
            execution=Execution(max_concurrency=32),
            collection_id=cid,
            iteration=it,
            seed=seed,
        )

    if method == "grpo":
        c = collector(Phase("evidence", rollouts_per_task=2 * EVIDENCE))
        state = await c.search(tasks)
        batch = c.prepare(state)
        n, won = flat(state.trees)
        return batch, {"flat_trees": n, "flat_trees_won": won}
    first = Phase("evidence", rollouts_per_task=evidence)
    state = await collector(first).run_evidence(tasks)
    flat_evidence, _ = flat(state.trees)
    budget = continuation_budget(state.usage().transitions, evidence, continuation)
    full = collector(first, Phase("continue", transitions=budget))
    wave = 0
    while not (plan := full.plan_wave(state, 1, wave)).empty:
        state = await full.run_wave(state, plan)
        wave += 1
    n, won = flat(state.trees)
    return full.prepare(state), {"flat_trees": n, "flat_trees_won": won, "flat_evidence_trees": flat_evidence}
