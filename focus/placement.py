"""Where a collection runs the search's pure calls (planning, grafting, filling in
predictions): inline on the event loop when they are short, in a worker thread when
they are long.

A worker thread (:func:`off_loop`) keeps the loop serving the rollouts in flight while a
long call runs: the first rankings after the evidence or a refit (about a second at 100k
transitions over 2,000 tasks), a fit of the calibration, a whole wave grafted or scored
at its barrier. For a short call it costs more than it saves: the call waits for the
GIL while the loop holds it, and the loop waits for it in turn (h37v, issue 37, in the
scale benchmark's collections: ``plan_next`` 74 ms of wall for 0.8 ms of CPU over a
run, the first slice of a wave 111 ms for 7.7 ms; every call inline, the plans the same,
used about 5 us of CPU per transition less over HTTP). So each call site gives
:func:`placed` what the call is expected to cost, estimated from the work it will do
(the trees it ranks, the rollouts it grafts, the predictions it fills in) without
timing anything, and the call runs inline when that is at most :data:`INLINE_S`. Every
call is a pure function of its arguments, so where it runs changes no plan and no
batch, only when the loop gets its turn.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from focus.agent import Rollout
from focus.critic import check_predictions, context_label, scored, warm_start
from focus.priority import Priority, exploration_rate
from focus.search import Predictions, SearchState, TreeWave, WavePlan, graft, plan_next, with_predictions
from focus.search.copies import cow_tree, own
from focus.search.work import trees_work
from focus.tree import Tree

_T = TypeVar("_T")

#: Expected CPU (seconds) up to which a call runs inline on the event loop: the
#: interpreter's switch interval (``sys.getswitchinterval()``, 5 ms by default), the
#: longest a worker thread holds the GIL at a stretch while the loop waits for it, so a
#: call inline stalls the loop for no longer than the same call in the thread could,
#: without the hand-overs. A quarter of the wave's tail slices (``focus.waves.SLICE_S``).
INLINE_S = 0.005

# What one unit of each kind of work costs, roughly: every placed call run inline and
# timed (thread CPU) in benchmarks.scale_inproc's FOCUS arm at 2k / 40, 10k / 40,
# 10k / 200, 40k / 40, 40k / 800 and 100k / 2,000 (a scratch wrapper around
# :func:`placed`, h37w; 2 cores, Python 3.11). Estimates to tell a millisecond from a hundred, not to time anything:
# there every call estimated at most INLINE_S took at most 4.4 ms, and every call
# estimated above it at least 1.9 ms (a fit and its rankings: 24 ms to 1.0 s) but the
# begin of a wave after a phase's budget is spent (nothing to choose: two per run at 2k
# and 10k, whose trees the estimate reads as still to be drawn).
#: A node of a ranking built from scratch (views, then the tree's ranking).
_RANK_NODE_S = 8e-6
#: A changed node (new, or with a new prediction) brought up to date in a tree's
#: ranking: its path and the views that read it, about 60% of the tree recomputed per
#: wave (with the tail not ranking ahead: 42-71 ms for about 2,000 changed nodes).
_UPDATE_NODE_S = 25e-6
#: A tree a plan reads (its facts, its ranking head brought up to date in the plan index).
_TREE_S = 3e-6
#: A node of a tree whose checkpoints' exploration draws a lead draws (a hash each).
_DRAW_NODE_S = 4e-6
#: A tree whose budget spent a plan sums first (its log), with its counts (after the
#: evidence: 7.5 ms for 800 trees, about 40 ms for 2,000).
_SUM_TREE_S = 10e-6
#: A job the greedy choice takes (a heap step and the job's view re-ranked).
_CHOOSE_JOB_S = 15e-6
#: A rollout's piece (about a transition) grafted, a job or a tree's part merged, a
#: prediction filled in: a node copied or made.
_NODE_S = 1.5e-6


async def off_loop(fn: Callable[..., _T], *args: Any) -> _T:
    """``fn(*args)`` (planning, grafting, filling in predictions: pure, CPU-bound) in a
    worker thread, so the event loop keeps serving the rollouts of waves still in flight
    instead of stalling them for the length of a plan (the GIL is shared, but the loop
    gets its turn every few milliseconds, which is what it needs to send the next
    requests). The functions are pure and the loop's rollouts never touch the state
    they work on, so results are the same as inline."""
    return await asyncio.to_thread(fn, *args)


async def placed(cost_s: float, fn: Callable[..., _T], *args: Any) -> _T:
    """``fn(*args)`` inline when ``cost_s`` (its expected CPU, from the estimates below)
    is at most :data:`INLINE_S`, else in a worker thread (:func:`off_loop`)."""
    if cost_s <= INLINE_S:
        return fn(*args)
    return await off_loop(fn, *args)


def ranking_s(state: SearchState, search: Priority) -> float:
    """Bringing the rankings up to date (:func:`focus.search.plan_rank`, or the first
    job a plan takes after its lead: the trees changed since the last plan, or after
    the evidence or a refit every tree); infinite where the calibration is fitted first
    (:func:`focus.search.ranking_work`): that reads every tree."""
    return _choice(state, search)[1]


def choice_s(state: SearchState, search: Priority) -> tuple[float, float]:
    """The two parts of choosing a wave a slice at a time (:func:`focus.waves.launch_choosing`),
    from one look at the trees: :func:`focus.search.plan_begin` with the first slice of
    the wave's leading exploration picks (:func:`focus.search.plan_lead`), then
    :func:`ranking_s`. Beginning reads the facts of the trees changed since the last
    plan (every tree's where the state has no plan index under the calibration,
    :class:`focus.search.heads.PlanIndex`) and, where some tree is to be ranked (a lead
    is taken only then), draws the checkpoints' exploration slots of the trees not
    drawn yet; nothing where the waves in flight are planned already (no wave to
    begin). Past :data:`INLINE_S` in the trees alone, neither looks further."""
    if len(state.planned) >= search.waves_in_flight:
        return 0.0, 0.0
    return _choice(state, search)


def _choice(state: SearchState, search: Priority) -> tuple[float, float]:
    """:func:`choice_s` whether or not a wave is to begin."""
    work = trees_work(state, search, INLINE_S / _TREE_S)  # the trees changed since the last plan, or every tree
    if work is None:  # every tree, long whatever else it does: no need to look at each to tell
        trees = len(state.trees) * _TREE_S
        return trees, trees
    trees = work.trees * _TREE_S
    lead = (work.fit or work.fresh > 0) and exploration_rate(search, 0.0) > 0
    rank = math.inf if work.fit else trees + work.fresh * _RANK_NODE_S + work.changed * _UPDATE_NODE_S
    begin = trees + work.unsummed * _SUM_TREE_S + (work.undrawn * _DRAW_NODE_S if lead else 0.0)
    return begin, rank


def plan_s(state: SearchState, search: Priority, phase_index: int) -> float:
    """:func:`focus.search.plan_next`: nothing where the waves in flight are planned
    already; else the rankings and a whole wave chosen (``wave_size`` jobs, its unit's
    count; a wave counted in transitions takes about that many continuations or more)."""
    phase = search.phases[phase_index]
    if phase.is_evidence:
        return len(state.trees) * ((phase.rollouts_per_task or 0) * _NODE_S + _TREE_S)
    if len(state.planned) >= search.waves_in_flight:
        return 0.0
    return ranking_s(state, search) + phase.wave_size * _CHOOSE_JOB_S


def graft_s(
    state: SearchState, plan: WavePlan, rollouts: Sequence[Rollout], ahead: Mapping[int, TreeWave] | None
) -> float:
    """:func:`focus.search.graft`: the pieces of the rollouts of trees not grafted ahead,
    one step per job and one per tree (the successor's facts)."""
    ahead = ahead or {}
    pieces = sum(len(r.pieces) for j, r in zip(plan.jobs, rollouts, strict=False) if j.tree_index not in ahead)
    return (pieces + len(plan.jobs) + len(state.trees)) * _NODE_S


def predictions_s(state: SearchState, predictions: Predictions) -> float:
    """:func:`focus.search.with_predictions`: a node copied and its facts' lists updated
    per prediction (two steps), a step per tree."""
    return (2 * len(predictions) + len(state.trees)) * _NODE_S


def warm_start_s(critic: Any) -> float:
    """:func:`focus.critic.warm_start`: nothing for a critic it leaves as it is (not
    trainable, or fitted already); a fit, of unknown length, for one it fits."""
    return 0.0 if getattr(critic, "fitted", True) or not callable(getattr(critic, "fit", None)) else math.inf


# The collector's calls, each placed by its estimate.


async def graft_placed(
    state: SearchState,
    plan: WavePlan,
    rollouts: Sequence[Rollout],
    phase_name: str = "",
    wall_s: float = 0.0,
    ahead: Mapping[int, TreeWave] | None = None,
) -> SearchState:
    """:func:`focus.search.graft`, placed by :func:`graft_s`."""
    return await placed(graft_s(state, plan, rollouts, ahead), graft, state, plan, rollouts, phase_name, wall_s, ahead)


async def scored_placed(state: SearchState, predictions: Predictions) -> SearchState:
    """:func:`focus.search.with_predictions` (``state`` itself without predictions), placed by
    :func:`predictions_s`."""
    if not predictions:
        return state
    return await placed(predictions_s(state, predictions), with_predictions, state, predictions)


async def plan_next_placed(state: SearchState, search: Priority, phase_index: int) -> SearchState:
    """:func:`focus.search.plan_next`, placed by :func:`plan_s`."""
    return await placed(plan_s(state, search, phase_index), plan_next, state, search, phase_index)


async def warm_start_placed(critic: Any, trees: Sequence[Tree], gamma: float, truncation: str) -> bool:
    """:func:`focus.critic.warm_start`, placed by :func:`warm_start_s`, on the trees with
    their truncated leaves scored first where it fits the critic and they bootstrap
    (:func:`bootstrapped`)."""
    cost = warm_start_s(critic)
    if cost and truncation == "bootstrap":
        trees = await bootstrapped(critic, trees)
    return await placed(cost, warm_start, critic, trees, gamma, truncation)


async def bootstrapped(critic: Any, trees: Sequence[Tree]) -> list[Tree]:
    """``trees`` with each unscored truncated leaf valued by ``critic`` as it is (copies
    of the trees and leaves it values), what the collection's own targets bootstrap on.

    Before the warm start's first prediction no leaf has a value, and a targets' backup
    leaves a child without one out (as a failed one): every truncated rollout was
    dropped from the fit. Where every evidence rollout ran to ``max_steps`` there was no
    target at all, and the critic stayed at its default (0) for the collection (rewards
    of -1 a step, 3 steps of 8 seen: targets of -3 against returns of -8 and less); where
    only some did, it was fitted on the rollouts that ended, selected by how they went.
    Valued by the unfitted critic, a truncated rollout's target is its rewards so far
    plus that prediction, as the batch's are with the critic it will have."""
    keys = [
        (ti, n.id) for ti, t in enumerate(trees) for n in t.nodes.values() if n.kind == "truncated" and n.value is None
    ]
    if not keys:
        return list(trees)
    where = f"critic {type(critic).__name__}"
    got = await scored(critic, [trees[ti].nodes[nid].context_ids for ti, nid in keys], where)
    preds = check_predictions(got, len(keys), where, context_label(trees, keys))
    out, owned = list(trees), dict[int, set[int]]()
    for (ti, nid), p in zip(keys, preds, strict=True):
        if ti not in owned:
            out[ti], owned[ti] = cow_tree(trees[ti]), set()
        node = own(out[ti], nid, owned[ti])
        node.value, node.value_std = p.value, p.std
    return out
