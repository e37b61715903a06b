"""A collection's statistics: usage per phase and in total, elapsed time, failures by
kind and by cause (what ``batch.stats`` holds; docs/operations.md explains each figure),
and the warning line for a wave with failed rollouts."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from focus.sums import left_sum
from focus.usage import FAILURE_KINDS, Usage, failure_kind

if TYPE_CHECKING:
    from focus.agent import Rollout
    from focus.noise import NoiseModel
    from focus.priority import Phase
    from focus.tree import Tree

#: The collector's logger: the warning comes from its loop.
log = logging.getLogger("focus.collector")


def collection_statistics(
    phases: Sequence[Phase], trees: Sequence[Tree], *, excluded_segments: int = 0
) -> dict[str, Any]:
    """Usage per phase and in total (:class:`focus.usage.Usage`, from the trees' rollout
    logs), elapsed time, and failures by kind and by cause.

    One pass over the rollout records (one per rollout, all over a large heap: a pass
    per phase and one for the total read each record three times) gives each phase's
    and the total's usage, waves, wall time and failure causes, every sum taken in the
    records' order as :meth:`Usage.total` and :func:`focus.usage.wall_of` of each
    phase's records take it."""
    walls: dict[tuple[int, int], float] = {}  # wall_of's: the last record's wall per wave
    causes: Counter[str | None] = Counter()

    def usages() -> Iterator[tuple[int, Usage]]:
        for t in trees:
            for r in t.log:
                phase = r.phase
                walls[(phase, r.wave)] = r.wave_wall_s
                if r.failed:
                    causes[r.cause] += 1
                yield phase, r.usage

    total, by_phase = Usage.totals_by(usages())
    per_phase = []
    for pi, phase in enumerate(phases):
        waves = [w for (p, _), w in walls.items() if p == pi]
        per_phase.append(
            {
                "name": phase.name,
                "index": pi,
                "transition_budget": phase.transitions if not phase.is_evidence else None,
                "rollouts_per_task": phase.rollouts_per_task,
                "waves": len(waves),
                **flat(by_phase.get(pi, Usage())),
                "wall_s": sum(waves),
            }
        )
    from focus.refusals import refused_task

    returns = evidence_returns(phases, trees)
    # A tree none of whose rollouts completed (e.g. its whole evidence phase failed)
    # contributes no actor rows; name it so it is not mistaken for a finished task.
    failed_trees = [t.task_id for t in trees if t.rollouts and not t.reaches_valid_leaf(t.ROOT)]
    # of those, the tasks whose opening prompt is over the model's context (left out)
    refused = [t.task_id for t in trees if refused_task(t) is not None]
    return {
        "trees": len(trees),
        "failed_trees": len(failed_trees),
        "failed_tree_ids": failed_trees,
        "refused_tasks": len(refused),
        "refused_task_ids": refused,
        **flat(total),
        "wall_s": sum(walls.values()),
        "excluded_segments": excluded_segments,
        "evidence_rollouts": len(returns),
        "return_mean": left_sum(returns) / len(returns) if returns else None,
        "checkpoints": sum(1 for t in trees for n in t.nodes.values() if n.kind == "checkpoint"),
        "phases": per_phase,
        "failure_causes": dict(causes.most_common(10)),
    }


def evidence_returns(phases: Sequence[Phase], trees: Sequence[Tree]) -> list[float]:
    """The undiscounted return (sum of rewards) of every evidence-phase rollout that did
    not fail (pure). Those start at the root, the same number on every task, so their
    mean is an unbiased estimate of the reward of the policy that collected the batch:
    what a train loop follows. Later phases' rollouts are not (search chose where, and
    on which tasks, they start). A truncated rollout counts with the rewards it got.
    Only those rollouts' segments are summed (each in the tree's order of segments)."""
    out: list[float] = []
    for t in trees:
        chosen = [
            r.rollout
            for r in t.log
            if r.node == t.ROOT and not r.failed and r.phase < len(phases) and phases[r.phase].is_evidence
        ]
        if not chosen:
            continue
        wanted = set(chosen)
        got: dict[int, float] = {}
        for e in t.edges.values():
            if e.rollout in wanted:
                got[e.rollout] = got.get(e.rollout, 0.0) + left_sum(e.rewards)
        out += [got.get(r, 0.0) for r in chosen]
    return out


def flat(usage: Usage) -> dict[str, Any]:
    """A usage record as statistics show it: counters, and failures by kind as
    ``failed_<kind>`` (``failed_model_service``, ``failed_env``, ...)."""
    out = usage.as_dict()
    failures = out.pop("failures")
    for kind in FAILURE_KINDS:
        out[f"failed_{kind.replace(' ', '_')}"] = failures.get(kind, 0)
    return out  # retry_causes stays a {cause: count} mapping


def warn_failures(
    phase: str, wave: int, rollouts: Sequence[Rollout], before: Sequence[Tree] = (), after: Sequence[Tree] = ()
) -> None:
    """One WARNING line per wave in which rollouts failed: how many, by kind, and the
    last one's cause with its task and the step it failed at (rollout steps from the
    root, the first 0). A cause names the value (``returned the reward nan``) but not
    where: the same cause of every task counts as one in ``failure_causes``, so the line
    is what tells a user which task's step to reproduce. With the trees ``before`` and
    ``after`` the wave, the tasks it found over the model's context at their opening
    prompt get their own line instead, or stop the collection where every task is so
    (:func:`focus.refusals.check_tasks_refused`)."""
    from focus.refusals import check_tasks_refused, refused_opening, refused_task

    refused: set[str] = set()
    if after:
        check_tasks_refused(before, after)
        refused = {t.task_id for t in after if refused_task(t) is not None}
    failed = [
        r
        for r in rollouts
        if r.leaf.kind == "failed"
        and not (r.task_id in refused and not r.turns and refused_opening(r.leaf.kind, r.leaf.steps, r.leaf.cause))
    ]
    if failed:
        kinds = Counter(failure_kind(r.leaf.cause) for r in failed)
        last = failed[-1]
        log.warning(
            "phase %s wave %d: %d of %d rollouts failed (%s); last cause (task %r, step %d): %s",
            phase,
            wave,
            len(failed),
            len(rollouts),
            ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())),
            last.task_id,
            last.leaf.steps,
            last.leaf.cause,
        )


def noise_model_statistics(noise: NoiseModel) -> dict[str, Any]:
    """The batch statistics' record of the noise model the estimator used."""
    return {
        "step_var_by_depth": list(noise.step_vars),
        "noise_var_by_depth": list(noise.noise_vars),
        "critic_var": noise.critic_var if noise.known else None,
        "residuals": noise.residuals,
        "spreads": noise.spreads,
        "repeats": noise.repeats,
    }
