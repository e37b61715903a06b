"""What each step of a collection shows: a :class:`StepRecord` per step, with the usage
so far kept as running totals (:class:`Tally`), so a step's record costs in proportion to
the step, not to the collection."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from focus.execution import is_bad_response
from focus.journal import Step, WaveRollouts
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
    #: The collection's usage so far, and its phase's (steps that run rollouts).
    usage: Usage | None = None
    phase_usage: Usage | None = None


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
        if step.kind == "evidence":
            logs = [r for t in value.trees for r in t.log]
            used = [(r.phase, r.usage) for r in logs]
            causes = [r.cause for r in logs if r.failed]
        elif step.kind in ("wave", "unfinished"):
            # an unfinished wave counts its bad responses only: the rest count once the
            # wave is recorded whole (as the evidence state, or as its wave step)
            wave: WaveRollouts = value
            rollouts = [r for r in wave.rollouts if step.kind == "wave" or is_bad_response(r)]
            used = [(step.phase, Usage.of_rollout(ro)) for ro in rollouts]
            causes = [ro.leaf.cause for ro in rollouts if ro.leaf.kind == "failed"]
        else:
            return {}
        for phase, u in used:
            self.usage = self.usage + u
            self.phases[phase] = self.phases.get(phase, Usage()) + u
        failed, top = failures(causes)
        return {
            "rollouts": len(used),
            "failed_rollouts": failed,
            "failure_causes": top,
            "usage": self.usage,
            "phase_usage": self.phases.get(step.phase, Usage()),
        }
