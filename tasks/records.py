"""What each step of a collection shows: a :class:`StepRecord` per step, with the usage
so far kept as running totals (:class:`Tally`), so a step's record costs in proportion to
the step, not to the collection."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from focus.agent import Rollout
from focus.execution import is_bad_response
from focus.journal import Step, WaveRollouts
from focus.refusals import left_out_line, refused_opening, refused_task, refused_tasks
from focus.usage import Usage


@dataclass(frozen=True)
class StepRecord:
    """What one step of a collection did, as the progress display and the UI show it."""

    #: ``config``, ``export`` or a :class:`focus.journal.Step` kind.
    kind: str
    #: Its checkpoint key (phase name, wave).
    key: str
    wave: int = 0
    #: The phase the step belongs to (0: evidence, and the pipeline's own steps).
    phase_index: int = 0
    #: Taken from the store (a rerun) rather than computed now.
    reused: bool = False
    #: Seconds since the previous step ended.
    wall_s: float = 0.0
    #: Rollouts the step ran (evidence and waves).
    rollouts: int = 0
    failed_rollouts: int = 0
    #: The most frequent causes of its failed rollouts, ``{cause: count}``.
    failure_causes: Mapping[str, int] = field(default_factory=dict)
    #: The last failed rollout's task, the rollout step it failed at (from the root, the
    #: first 0) and its cause, as the library's line names them
    #: (:func:`focus.statistics.warn_failures`): a cause names no task, and its count
    #: is over every task, so this is what tells an operator which step to reproduce.
    last_failure: tuple[str, int, str] | None = None
    #: The warning line naming the tasks the step found over the model's context at their
    #: opening prompt, left out of the collection (:func:`focus.refusals.left_out_line`).
    left_out: str | None = None
    #: The collection's usage so far, and its phase's (steps that run rollouts).
    usage: Usage | None = None
    phase_usage: Usage | None = None


def _leaf(rollout: Rollout) -> tuple[str, int, str | None]:
    return rollout.leaf.kind, rollout.leaf.steps, rollout.leaf.cause


def failures(causes: Iterable[str | None]) -> tuple[int, dict[str, int]]:
    """Failed rollouts and the five most frequent of their causes."""
    counted = Counter(c or "unknown" for c in causes)
    return sum(counted.values()), dict(counted.most_common(5))


class Tally:
    """Usage totals over the steps seen so far, overall and per phase."""

    def __init__(self) -> None:
        self.usage = Usage()
        self.phases: dict[int, Usage] = {}

    def step(self, step: Step, value: Any) -> dict[str, Any]:
        """The figures of a step's record (none for steps that run no rollouts)."""
        last: tuple[str, int, str] | None = None
        left_out: str | None = None
        if step.kind == "evidence":
            logs = [r for t in value.trees for r in t.log]
            used = [(r.phase, r.usage) for r in logs]
            # a task refused at its opening prompt has a line of its own (focus.refusals)
            kept = [t for t in value.trees if refused_task(t) is None]
            if refused := refused_tasks(value.trees):
                left_out = left_out_line(refused, len(kept))
            causes = [r.cause for t in kept for r in t.log if r.failed]
            # the last failed leaf of the last tree that has one
            leaves = ((t.task_id, n) for t in reversed(kept) for n in reversed(t.nodes.values()))
            if causes and (leaf := next(((i, n) for i, n in leaves if n.kind == "failed"), None)):
                last = (leaf[0], leaf[1].steps, leaf[1].cause or "unknown")
        elif step.kind in ("wave", "unfinished"):
            # an unfinished wave counts its bad responses only: the rest count once the
            # wave is recorded whole (as the evidence state, or as its wave step)
            wave: WaveRollouts = value
            rollouts = [r for r in wave.rollouts if step.kind == "wave" or is_bad_response(r)]
            used = [(step.phase, Usage.of_rollout(ro)) for ro in rollouts]
            opening = [(ro.task_id, ro.leaf) for ro in rollouts if not ro.turns and refused_opening(*_leaf(ro))]
            left_out = left_out_line(list(dict(opening).items())) if opening else None
            failed = [ro for ro in rollouts if ro.leaf.kind == "failed" and (ro.task_id, ro.leaf) not in opening]
            causes = [ro.leaf.cause for ro in failed]
            if failed:
                last = (failed[-1].task_id, failed[-1].leaf.steps, failed[-1].leaf.cause or "unknown")
        else:
            return {}
        for phase, u in used:
            self.usage = self.usage + u
            self.phases[phase] = self.phases.get(phase, Usage()) + u
        n_failed, top = failures(causes)
        return {
            "rollouts": len(used),
            "failed_rollouts": n_failed,
            "failure_causes": top,
            "last_failure": last,
            "left_out": left_out,
            "usage": self.usage,
            "phase_usage": self.phases.get(step.phase, Usage()),
        }
