"""Where a collection records its steps, so that a rerun resumes instead of recomputing.

:meth:`focus.collector.Collector.search` is the only loop a collection has. It
crosses a step boundary at the evidence rollouts, their critic scores, each
continuation wave, that wave's scores and the end of each phase. At each boundary it
asks its :class:`Journal` whether the step is recorded: if it is, the recorded value is
used (a wave's rollouts are grafted onto the state planned again from the same
inputs, so no rollout runs); if not, the step is computed and recorded. Recorded steps
always form a prefix of the collection, so a journal that survives the process (the
pipeline's checkpoint store) makes a rerun continue after the last recorded step and
end with the batch an uninterrupted run writes.

What is recorded for each :class:`Step`:

=================  ================================================================
``evidence``       the :class:`focus.search.SearchState` after the evidence rollouts
                   (holding the predictions a row-wise critic made while they ran)
``evidence_scores`` the critic's predictions for its checkpoints (all of them)
``wave``           a :class:`WaveRollouts`: the wave's rollouts in job order, its wall time
``wave_scores``    the critic's predictions for the checkpoints that wave added
``phase_end``      the number of waves of the phase (nothing more was planned)
``unfinished``     a :class:`WaveRollouts` of the evidence (phase 0, wave 0) or of a
                   wave some of whose rollouts got bad responses
=================  ================================================================

A rollout that got a bad response on every run of it is never grafted
(:class:`focus.execution.BadResponses`): every later plan depends on its wave, so the
collection stops there, after recording the wave as ``unfinished`` (its rollouts, those
that got bad responses included, which mark the jobs still to run). A rerun finds the
wave unrecorded and its ``unfinished`` step recorded: it plans the wave again (the same
jobs), runs only the jobs that got bad responses, and records the wave whole, so the
collection goes on as an uninterrupted clean run would. A rerun whose reruns still get
bad responses records nothing new.

Only the evidence state is recorded whole; later steps are deltas, so recording a
wave costs in proportion to the wave, not to the collection.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from focus.agent import Rollout
    from focus.env import Task
    from focus.search import SearchState, WavePlan

StepKind = Literal["evidence", "evidence_scores", "wave", "wave_scores", "phase_end", "unfinished"]


@dataclass(frozen=True)
class Step:
    """One step boundary of a collection: its kind, and for continuation phases the
    phase index and wave index it belongs to."""

    kind: StepKind
    phase: int = 0
    wave: int = 0


EVIDENCE = Step("evidence")
EVIDENCE_SCORES = Step("evidence_scores")


def wave_step(phase: int, wave: int) -> Step:
    return Step("wave", phase, wave)


def scores_step(phase: int, wave: int) -> Step:
    return Step("wave_scores", phase, wave)


def end_step(phase: int) -> Step:
    return Step("phase_end", phase)


def unfinished_step(phase: int, wave: int) -> Step:
    return Step("unfinished", phase, wave)


@dataclass(frozen=True)
class WaveRollouts:
    """What a continuation wave leaves: its rollouts (in job order) and the elapsed time
    it accounts for (see :class:`focus.collector.Landed`)."""

    rollouts: Sequence[Rollout]
    wall_s: float = 0.0


class Journal(abc.ABC):
    """Has this step been recorded (and with what), and record it.

    Both are coroutines, so a journal that writes to storage can do it off the event
    loop while the rollouts of waves planned ahead keep running on it.
    """

    @abc.abstractmethod
    async def recorded(self, step: Step) -> Any | None:
        """The value recorded for ``step``, or ``None`` if it is not recorded."""

    @abc.abstractmethod
    async def record(self, step: Step, value: Any) -> None:
        """Record ``value`` for ``step`` (called once per step, in collection order)."""

    async def evidence(self, tasks: Sequence[Task]) -> SearchState | None:
        """The recorded evidence state (:data:`EVIDENCE`), if any, once it is found to be
        of ``tasks`` (:func:`check_same_tasks`): a resume given other tasks (an env
        factory's data file edited, tasks added or reordered) went on with the recorded
        ones without a word, and its batch was not of the tasks it was given."""
        state: SearchState | None = await self.recorded(EVIDENCE)
        if state is not None:
            check_same_tasks(state.tasks, tasks)
        return state

    async def phase_ended(self, phase: int, waves: int) -> bool:
        """Whether the end of continuation phase ``phase`` is recorded, once its first
        ``waves`` waves are replayed and the next is not recorded. An end that counts
        other waves raises: a wave before it is missing, so the recorded steps are no
        prefix and the phase would end short (the pipeline's journal mends such a gap
        before the loop starts, :func:`tasks.gaps.mend`)."""
        ended = await self.recorded(end_step(phase))
        if ended is not None and ended != waves:
            raise ValueError(
                f"the journal records phase {phase} ending after {ended} waves but holds only its first {waves}: "
                "a recorded wave is missing, so the waves after it cannot be replayed"
            )
        return ended is not None


class TasksChanged(ValueError):
    """A collection resumed with other tasks than the ones it started with."""


def check_same_tasks(recorded: Sequence[Task], tasks: Sequence[Task]) -> None:
    """Refuse ``tasks`` unless they are ``recorded``: the same ids in the same order, and
    the same data where both are JSON values (other data, which may not compare or
    print alike in another process, is not compared)."""
    if len(recorded) != len(tasks):
        raise TasksChanged(
            f"the collection started on {len(recorded)} tasks and is resumed with {len(tasks)}: {_RESUME}"
        )
    for i, (was, now) in enumerate(zip(recorded, tasks, strict=True)):
        if was.id != now.id:
            raise TasksChanged(f"task {i} of the collection is {was.id!r}, and {now.id!r} in its resume: {_RESUME}")
        before, after = _json(was.data), _json(now.data)
        if before is not None and after is not None and before != after:
            raise TasksChanged(f"task {i} ({was.id!r}) holds other data than when the collection started: {_RESUME}")


def check_unfinished(plan: WavePlan, partial: WaveRollouts) -> None:
    """Refuse the rollouts of a recorded unfinished wave that are not of ``plan``'s jobs:
    another number of them (another configuration or seed), or one of another task than
    its job's (:class:`TasksChanged`: a resume given other tasks, whose evidence was
    recorded unfinished, before any state that :meth:`Journal.evidence` checks; its
    rollouts were grafted onto the trees of other tasks)."""
    if len(plan.jobs) != len(partial.rollouts):
        raise ValueError(
            f"the unfinished wave {plan.wave_index} of phase {plan.phase_index} holds {len(partial.rollouts)} "
            f"rollouts, the search plans {len(plan.jobs)}: it does not belong to this configuration and seed"
        )
    for i, (job, rollout) in enumerate(zip(plan.jobs, partial.rollouts, strict=True)):
        if job.start.task.id != rollout.task_id:
            raise TasksChanged(
                f"rollout {i} of the unfinished wave {plan.wave_index} of phase {plan.phase_index} is of task "
                f"{rollout.task_id!r}, and its job in the resume of task {job.start.task.id!r}: {_RESUME}"
            )


_RESUME = (
    "a resume goes on with the tasks it started with, so give it those (the env factory's data as it was), "
    "or collect these under a new collection id"
)


def _json(data: Any) -> str | None:
    """``data`` as JSON text with sorted keys, or ``None`` for data JSON does not hold."""
    try:
        return json.dumps(data, sort_keys=True)
    except (TypeError, ValueError):
        return None


class NoJournal(Journal):
    """Records nothing: a collection kept in memory only (``Collector.collect``'s default).
    It counts the steps it drops, for :func:`kept`."""

    def __init__(self) -> None:
        self.dropped = 0

    async def recorded(self, step: Step) -> Any | None:
        return None

    async def record(self, step: Step, value: Any) -> None:
        self.dropped += 1


@contextmanager
def kept(journal: Journal | None, resumable: bool = True) -> Iterator[Journal]:
    """``journal``, or for a collection given none a :class:`NoJournal`, whose dropped
    steps an error that stops the collection (a critic's, an outage, a broken env) names
    in a note with how to keep them: ``collect`` lost everything it had finished, and
    nothing said so or that a journal keeps it. Not for a streamed (``resumable`` false)
    collection, which takes no journal."""
    used = journal if journal is not None else NoJournal()
    try:
        yield used
    except Exception as e:
        if resumable and isinstance(used, NoJournal) and used.dropped:
            e.add_note(
                f"Lost with this error: {used.dropped} finished step{'s' * (used.dropped > 1)} of this collection "
                "(its waves' rollouts, their critic scores), as it was given no journal. Pass one made before the "
                "call (journal = focus.journal.MemoryJournal(); collector.collect(tasks, journal)), and a call "
                "again with it continues after the last step it recorded."
            )
        raise


class MemoryJournal(Journal):
    """Keeps every step in a dict: the test double of a durable journal (a new collector
    given the same journal replays what the first one recorded)."""

    def __init__(self) -> None:
        self.steps: dict[Step, Any] = {}

    async def recorded(self, step: Step) -> Any | None:
        return self.steps.get(step)

    async def record(self, step: Step, value: Any) -> None:
        if step in self.steps:
            raise ValueError(f"step {step} is recorded already")
        self.steps[step] = value
