"""A continuation wave chosen a slice at a time: :func:`focus.search.planning.plan_next`'s
wave, the same jobs in the same order, handed to a runner as the greedy choice takes
them (:func:`plan_begin`, :func:`plan_lead`, :func:`plan_choose`, :func:`plan_rank`,
:func:`plan_chosen`), so that it starts the first jobs while the rest are chosen.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from focus.priority import Priority
from focus.search.jobs import RolloutJob, WavePlan
from focus.search.planning import InFlight, _wave_greedy, with_plan
from focus.search.state import SearchState


class WaveChoice:
    """A continuation wave being chosen a slice at a time (:func:`plan_begin`,
    :func:`plan_choose`, :func:`plan_rank`, :func:`plan_chosen`): :func:`plan_next`'s
    wave, the same jobs in the same order, handed over as they are taken so that a
    runner starts the first ones while the greedy choice takes the rest (each later job
    costs a heap step; a wave of a thousand jobs took 15-60 ms at the barrier,
    benchmarks/README.md, scale)."""

    def __init__(self, state: SearchState, search: Priority, phase_index: int) -> None:
        self.state, self.phase_index = state, phase_index
        self.wave_index = state.waves_done(phase_index) + len(state.planned)
        self._greedy = _wave_greedy(state, search, phase_index, self.wave_index)
        self._lead: Iterator[InFlight] | None = None if self._greedy is None else self._greedy.lead()
        self._rest: Iterator[InFlight] | None = None
        self.chosen: list[InFlight] = []
        #: How many of the jobs taken so far are the leading exploration picks (chosen
        #: without the calibration's fit or any ranking).
        self.lead = 0
        #: Every job of the wave is taken.
        self.done = self._greedy is None

    @property
    def ranked(self) -> bool:
        """Whether the calibration is fitted and every tree ranked for this wave."""
        return self._greedy is None or self._greedy._heap is not None

    @property
    def ranks_next(self) -> bool:
        """Whether the next :func:`plan_choose` fits the calibration and ranks every tree
        (the leading exploration picks are taken, :func:`plan_rank` not called)."""
        g = self._greedy
        return not self.done and self._lead is None and g is not None and g._heap is None and not g.full


def plan_begin(state: SearchState, search: Priority, phase_index: int) -> WaveChoice | None:
    """The next continuation wave of phase ``phase_index`` to choose a slice at a time;
    ``None`` where :func:`plan_next` plans no such wave (an evidence phase, or
    ``search.waves_in_flight`` waves planned already)."""
    phase = search.phases[phase_index]
    if phase.is_evidence or len(state.planned) >= search.waves_in_flight:
        return None
    return WaveChoice(state, search, phase_index)


def plan_choose(choice: WaveChoice, n: int) -> list[RolloutJob]:
    """The wave's next ``n`` jobs in plan order; fewer where its leading exploration
    picks end (a runner may then rank off its event loop, :func:`plan_rank`, before it
    asks for more), or once the wave is full (then ``choice.done``). The first call
    that takes a job after the lead (the first call, where there is no lead) fits the
    calibration and ranks every tree unless :func:`plan_rank` did."""
    taken = _lead(choice, n)
    g = choice._greedy
    if g is not None and not choice.done and not taken:
        if choice._rest is None:
            choice._rest = g.rest()
        taken = list(itertools.islice(choice._rest, n))
        choice.done = len(taken) < n
        choice.chosen.extend(taken)
    return [c.job for c in taken]


def plan_lead(choice: WaveChoice, n: int) -> list[RolloutJob]:
    """:func:`plan_choose` as long as the wave's leading exploration picks last: their
    next ``n`` jobs, fewer (maybe none) where they end; never fits the calibration or
    ranks a tree, so a runner can take it on its event loop and tell from
    ``choice.ranks_next`` whether the next slice ranks first."""
    return [c.job for c in _lead(choice, n)]


def _lead(choice: WaveChoice, n: int) -> list[InFlight]:
    g = choice._greedy
    if g is None or choice._lead is None:
        return []
    taken = list(itertools.islice(choice._lead, n))
    choice.lead += len(taken)
    if len(taken) < n:  # the lead is over
        choice._lead = None
        choice.done = g.full
    choice.chosen.extend(taken)
    return taken


def plan_rank(choice: WaveChoice) -> None:
    """Fit the wave's calibration and bring the rankings up to date (what the first
    :func:`plan_choose` after the leading exploration picks would do; pure, and after
    the evidence or a refit what reads every tree: a runner calls it off its event loop
    while the lead's jobs run; else it reads the trees changed since the last plan)."""
    if choice._greedy is not None:
        choice._greedy.rank()


def plan_chosen(choice: WaveChoice) -> SearchState:
    """What :func:`plan_next` returns, once every job of ``choice`` is taken."""
    if not choice.done:
        raise ValueError("the wave is still being chosen: take its jobs (plan_choose) until none are left")
    c = choice.chosen
    plan = WavePlan(
        choice.phase_index, choice.wave_index, tuple(x.job for x in c), tuple(x.expected_transitions for x in c)
    )
    return choice.state if plan.empty else with_plan(choice.state, plan)
