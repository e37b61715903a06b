"""The search state: the trees of one collection and the waves that built them.

:class:`SearchState` is everything a collection has done so far: the trees (with branch
states, so any checkpoint can be continued), the critic's predictions on their nodes,
and which waves have run. It pickles: the pipeline saves the evidence state whole and
each later wave as a delta (:class:`focus.journal.WaveRollouts`), from which
:func:`focus.search.replay` rebuilds it on resume. States are treated as immutable: the planner
(:mod:`focus.search.planning`) reads one, grafting and scoring
(:mod:`focus.search.grafting`) make a successor that shares what did not change; the
helpers for that copy-on-write live here, with the facts derived from each tree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from focus.calibration import Counts, tree_counts
from focus.calibration import mean_leaf_transitions as leaf_mean
from focus.env import Task
from focus.estimation import Segment, segment
from focus.noise_rows import Checkpoint, tree_rows
from focus.priority import Calibration, NodeEvidence, Priority, exploration_rate
from focus.ranking import Entry, TreeRanking, tie
from focus.search.copies import copy_tree
from focus.search.heads import PlanIndex, plan_index
from focus.search.jobs import RolloutJob, WavePlan  # noqa: F401 - checkpoints pickled before 2026-12-06 name them here
from focus.search.shape import Depths, Known, shape_fact, tree_spreads
from focus.tree import Edge, Tree
from focus.usage import Usage

#: Spreads (checkpoints with two valid children) after which the ranking's calibration
#: is no longer refitted: with thousands of spreads the noise model's variances are
#: known to within a few percent.
CALIBRATION_SPREADS = 4096


@dataclass
class SearchState:
    """Trees of one collection plus the record of the waves that built them.

    The trees of a state are treated as immutable once the state exists: :func:`graft`
    and :func:`with_predictions` return a new state that shares every tree (and every
    node) they did not change, so a wave costs in proportion to the trees it touched.
    Code that wants to edit a tree in place edits a :func:`copy_state` copy.

    ``_derived`` holds facts derived from the trees (ranked checkpoints, budget spent,
    unscored nodes), filled on first use and carried over for untouched trees; it is
    never pickled and is rebuilt deterministically, so planning a resumed state gives
    the same plan as planning the live one.
    """

    collection_id: str
    seed: int
    tasks: tuple[Task, ...]
    trees: list[Tree]
    #: (phase index, wave index) of every wave grafted, in order.
    waves: list[tuple[int, int]] = field(default_factory=list)
    #: Waves planned (and launched) but not grafted yet, oldest first: their jobs count
    #: as pending when the next wave is planned (:func:`plan_ahead`).
    planned: tuple[WavePlan, ...] = ()
    _derived: dict[int, _TreeFacts] = field(default_factory=dict, init=False, repr=False, compare=False)
    _calibrations: dict[tuple[Any, ...], Calibration] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    #: Waves -> :meth:`spread_count` of the first that many waves.
    _spreads: dict[int, int] = field(default_factory=dict, init=False, repr=False, compare=False)
    #: What every plan reads of every tree (:mod:`focus.search.heads`), handed to successors.
    _index: PlanIndex | None = field(default=None, init=False, repr=False, compare=False)

    def __repr__(self) -> str:
        # A summary: the dataclass's own repr printed every tree, megabytes at 100k
        # transitions, and asyncio.run on Python 3.11 formats the result of its main
        # coroutine (twice; CPython #112559): 0.6 s of a benchmark's search at 16H.
        nodes, waves = sum(len(t.nodes) for t in self.trees), len(self.waves)
        trees = len(self.trees)
        return f"SearchState({self.collection_id!r}, seed={self.seed}, {trees=}, {nodes=}, {waves=}, planned={len(self.planned)})"

    def waves_done(self, phase_index: int) -> int:
        return sum(1 for p, _ in self.waves if p == phase_index)

    def usage(self, phase_index: int | None = None) -> Usage:
        """What the rollouts of one phase (or all) actually used, from the tree logs."""
        return Usage.of_records(r for t in self.trees for r in t.log if phase_index is None or r.phase == phase_index)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_derived", None)
        state.pop("_calibrations", None)
        state.pop("_spreads", None)
        state.pop("_index", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._derived = {}
        self._calibrations = {}
        self._spreads = {}
        self._index = None

    def calibration(self, search: Priority) -> Calibration:
        """The ranking's :class:`~focus.priority.Calibration`, a pure function of the
        state (cached, carried to successor states, never pickled).

        Fitted on the rollouts of the first ``2^k`` waves, and fitted again at a later
        power of two of waves only once the evidence has doubled since the last fit
        (counted as checkpoints with two or more finished children,
        :meth:`spread_count`): a refit on less new evidence would move the noise model
        by less than its sampling error, and each refit costs a pass over the whole
        collection plus a rebuild of every tree's ranking. A collection of many tasks
        starts with thousands of spreads from its evidence phase, so its first
        continuation waves do not refit; one of few tasks doubles its evidence with
        nearly every doubling of its waves. Once a fit rests on
        :data:`CALIBRATION_SPREADS` spreads it is kept from then on.

        Once the fit in use rests on :data:`LAG_SPREADS` spreads, a refit lags its
        waves by one (:data:`REFIT_LAG`): the state of ``2^k + 1`` waves is the first to
        use the fit on ``2^k``. The fit a graft brings in then reads only trees the state
        before it has, so a collector fits it and ranks every tree under it while that
        wave still runs (:meth:`next_calibration`, :class:`focus.waves.WaveTail`)
        instead of in a barrier with no model call in flight.
        """
        return self._fitted(search)[1]

    def _fitted(self, search: Priority) -> tuple[int, Calibration]:
        """:meth:`calibration` and the waves it is fitted on."""
        size = self._fit_size(search)
        return size, self._fit(size, search)

    def _fit_size(self, search: Priority, at_hand: bool = False) -> int:
        """How many waves :meth:`calibration` is fitted on, deciding it without the fit on
        all of them (which only a fit on fewer waves' spreads can rule out: a fit on
        the last waves it may read is the last one to consider, whatever its own
        spreads). ``at_hand``: from the fits and spread counts cached (a count of every
        wave's spreads taken from the trees' facts), raising :class:`NotAtHand` where
        one is missing."""
        size = self._size_for(len(self.waves), search, at_hand)
        assert size is not None  # (every wave it may read is this state's)
        return size

    def _size_for(self, n: int, search: Priority, at_hand: bool = False) -> int | None:
        """:meth:`_fit_size` of a state of ``n`` waves whose first waves are this one's
        (``n = len(self.waves) + 1``: the next graft's), ``None`` where that reads the
        spreads of a wave this state does not have (an unlagged refit, :data:`LAG_SPREADS`)."""
        fit, spreads = (self._cached_fit, self._cached_spreads) if at_hand else (self._fit, self.spread_count)
        have = len(self.waves)
        size = 1 if n else 0
        while size < n:
            c = fit(size, search)
            if c.noise.spreads >= CALIBRATION_SPREADS:
                break
            last = n - REFIT_LAG if c.noise.spreads >= LAG_SPREADS else n  # lagged on a large fit
            floor = 2 * spreads(size)
            nxt = 2 * size
            while nxt <= min(last, have) and spreads(nxt) < floor:
                nxt *= 2
            if nxt > last:
                break
            if nxt > have:
                return None
            size = nxt
        return size

    def next_calibration(self, search: Priority) -> Calibration | None:
        """The :meth:`calibration` of the state the next graft makes, fitted here, where
        it reads only waves this state has (no refit, or a lagged one, :data:`REFIT_LAG`):
        then the trees a wave does not touch can be ranked under it while the wave runs.
        Cached here and carried to that state, which finds it fitted. ``None`` before
        the evidence and where the graft may refit on its own wave (:meth:`may_refit`)."""
        size = self._size_for(len(self.waves) + 1, search) if self.waves else None
        return None if size is None else self._fit(size, search)

    def refits_next(self, search: Priority) -> bool:
        """Whether the next graft brings in a lagged refit (:meth:`next_calibration`
        is another calibration than this state's)."""
        nxt = self.next_calibration(search)
        return nxt is not None and nxt is not self.calibration(search)

    def _cached_fit(self, size: int, search: Priority) -> Calibration:
        c = self._calibrations.get((size, search.discount, search.truncation_rule))
        if c is None:
            raise NotAtHand
        return c

    def _cached_spreads(self, waves: int) -> int:
        if waves < len(self.waves) and waves not in self._spreads:
            raise NotAtHand  # a count over some of the waves filters every tree's edges
        return self.spread_count(waves)

    def calibrated(self, search: Priority) -> bool:
        """Whether :meth:`calibration` is at hand, fitted already (no fit to make)."""
        return (self._fit_size(search), search.discount, search.truncation_rule) in self._calibrations

    def mean_leaf_transitions(self, search: Priority) -> float:
        """``self.calibration(search).mean_leaf_transitions``, from the trees' counts where
        that calibration is not fitted yet: the mean rollout length sets a wave's size
        and the exploration rate (:func:`focus.priority.exploration_rate`), which is
        what a planner needs before the noise model's fit (``focus.search.planning``:
        a wave's leading exploration picks)."""
        size = self._fit_size(search)
        c = self._calibrations.get((size, search.discount, search.truncation_rule))
        if c is not None or type(search).calibrate is not Priority.calibrate:
            return (c or self._fit(size, search)).mean_leaf_transitions
        keep = self._keep(size)
        rule = search.truncation_rule
        if keep is None:
            counts = [self.facts(ti).counts(rule) for ti in range(len(self.trees))]
        else:
            counts = [tree_counts(tree, rule, keep) for tree in self.trees]  # type: ignore[arg-type]
        return leaf_mean(counts)

    def may_refit(self, search: Priority, jobs: int) -> bool:
        """Whether grafting a wave of ``jobs`` jobs onto this state may fit a new
        calibration on trees it does not have yet: the evidence's graft, or an unlagged
        refit (:data:`LAG_SPREADS`) at a power of two of waves, not once the fit is
        kept, and only if the spreads can reach twice those of the last fit (a job gives
        at most one checkpoint its second child). The fit reads every tree
        (:meth:`_TreeFacts.prefit`), so a collector does that ahead, while the wave runs
        (:class:`focus.waves.WaveTail`)."""
        if not self.waves:
            return True
        floor = self.refit_floor(search)
        return floor is not None and self.spread_count(len(self.waves)) + jobs >= floor

    def refit_floor(self, search: Priority) -> int | None:
        """The spreads (:meth:`spread_count` of every wave) from which grafting the next
        wave onto this state fits a new calibration on all of its waves, ``None`` where
        no graft can (not at a power of two of waves, the fit is kept, or a refit lags:
        :data:`LAG_SPREADS`; 0 before the evidence, the first fit). Exact: the fits on
        fewer waves are this state's, so the next graft's fit is on all of its waves
        once their spreads reach twice those of this state's fit, and on as many as this
        state's otherwise. A wave's spreads only grow as its trees come in, so a runner
        can tell before the wave ends whether it refits."""
        n = len(self.waves) + 1
        if n & (n - 1):
            return None
        if not self.waves:
            return 0
        size, c = self._fitted(search)
        if c.noise.spreads >= min(CALIBRATION_SPREADS, LAG_SPREADS):
            return None
        return 2 * self.spread_count(size)

    def _fit(self, size: int, search: Priority) -> Calibration:
        key = (size, search.discount, search.truncation_rule)
        c = self._calibrations.get(key)
        if c is None:
            keep = self._keep(size)
            if keep is None:  # every segment: each tree's share, kept in its facts
                g, rule = search.discount, search.truncation_rule
                facts = [self.facts(ti) for ti in range(len(self.trees))]
                counts = [f.counts(rule) for f in facts]
                c = search.calibrate(self.trees, None, counts=counts, rows=[f.noise_rows(g, rule) for f in facts])
                for f in facts:  # read once per fit: not held for the collection's length
                    f._rows.clear()
            else:
                c = search.calibrate(self.trees, keep)
            self._calibrations[key] = c
        return c

    def spread_count(self, waves: int) -> int:
        """Checkpoints with at least two children that did not fail, counting only the
        segments of the first ``waves`` waves: the evidence a calibration fitted on
        them rests on. Depends on tree shapes only (not on critic scores), so it is
        cached for good and carried to successor states."""
        n = self._spreads.get(waves)
        if n is None:
            keep = self._keep(waves)
            if keep is None:  # every segment: each tree's count, kept in its facts
                n = sum(self.facts(ti).spreads for ti in range(len(self.trees)))
            else:
                n = sum(tree_spreads(tree, keep) for tree in self.trees)
            self._spreads[waves] = n
        return n

    def _keep(self, n: int) -> Callable[[Tree, Edge], bool] | None:
        """Filter accepting the segments of rollouts grafted in the first ``n`` waves
        (and those without a rollout record, e.g. in trees built by hand)."""
        if n >= len(self.waves):
            return None
        allowed = set(self.waves[:n])

        def keep(tree: Tree, e: Edge) -> bool:
            if e.rollout >= len(tree.log):
                return True
            rec = tree.log[e.rollout]
            return (rec.phase, rec.wave) in allowed

        return keep

    def batch_parts(
        self, gamma: float, truncation: str, rows: bool = True
    ) -> tuple[list[list[Checkpoint]] | None, list[dict[int, Segment] | None]]:
        """Each tree's noise rows (:meth:`_TreeFacts.noise_rows`; with ``rows``) and its kept
        edge segments at ``gamma``: what a batch's noise fit and backups read of the trees,
        taken from what the search computed (the rows the last wave's tail computed
        while it ran, the rankings' segments) rather than computed again. The rows leave
        the facts (read once)."""
        out: list[list[Checkpoint]] | None = [] if rows else None
        segs = []
        for ti in range(len(self.trees)):
            f = self.facts(ti)
            if out is not None:
                out.append(f.noise_rows(gamma, truncation))
                f._rows.pop((gamma, truncation), None)
            segs.append(f.segments(gamma))
        return out, segs

    def facts(self, tree_index: int) -> _TreeFacts:
        """Derived facts of one tree, recomputed if its tree object changed."""
        tree = self.trees[tree_index]
        f = self._derived.get(tree_index)
        if f is None or not f.describes(tree, tree_index):
            f = self._derived[tree_index] = _TreeFacts(tree, tree_index)
            if self._index is not None:  # (a tree changed in place: its plan facts are read again)
                self._index.moved((tree_index,))
        return f


#: Waves a refit of the calibration lags behind its waves (:meth:`SearchState.calibration`)
#: once the fit in use rests on :data:`LAG_SPREADS` spreads. With one, the fit a graft
#: brings in is on waves the state before it already has: at 40k transitions over 800
#: tasks each refit was a barrier of 0.3-0.4 s (a fit, then a ranking of every tree) with
#: no model call in flight, most of the model service's idle time there
#: (docs/findings/speed.md); lagged, both run while the next wave does.
REFIT_LAG = 1

#: Spreads of the fit in use from which a refit lags (:data:`REFIT_LAG`). A fit on ``m``
#: spreads has variances within about ``sqrt(2 / m)`` of their values (6% at 512), so
#: planning one more wave on it costs little, and the barrier a refit makes grows with
#: the collection. On a small fit the lag cost more than the barrier it saved: with 6
#: tasks a collection has 3-4 waves, and one of its continuation waves was planned on 6
#: spreads instead of 15-22 (`benchmarks.estimator_quality_unseen`: wide/6H batch MSE
#: 1.28x uniform's against 1.0x; docs/findings/speed.md).
LAG_SPREADS = 512


class NotAtHand(LookupError):
    """A fit or spread count ``_fit_size(at_hand=True)`` would have to compute."""


_SCORED_KINDS = ("checkpoint", "truncated")


class _TreeFacts:
    """What planning and scoring derive from one tree object, computed lazily.

    Valid only for the tree object it was made from (and while that tree has the same
    number of nodes and rollouts, a guard against grafts done in place). The ranking
    (:class:`focus.ranking.TreeRanking`) is tied to one search configuration and
    calibration; a successor tree's facts take it over from their predecessor's with
    the nodes that changed (``changed``) and bring it up to date when next asked, so a
    wave costs in proportion to the paths it touched. Everything here is a pure
    function of the tree, the tree's index, the collection seed and the search
    configuration and calibration.
    """

    __slots__ = ("tree", "index", "size", "_spent", "_unscored", "rank", "changed", "shape", "known", "_rows", "_ahead")

    def __init__(
        self,
        tree: Tree,
        index: int,
        *,
        spent: dict[int, int] | None = None,
        unscored: tuple[int, ...] | None = None,
        rank: TreeRanking | None = None,
        changed: set[int] | None = None,
        shape: dict[Any, Any] | None = None,
        known: Known | None = None,
        ahead: dict[tuple[str, Any], Any] | None = None,
    ) -> None:
        self.tree, self.index = tree, index
        self.size = (len(tree.nodes), tree.rollouts)
        self._spent, self._unscored = spent, unscored
        self.rank, self.changed = rank, changed if changed is not None else set()
        #: What the calibration reads of the tree's shape alone (its spreads, its
        #: counts per truncation rule): kept when only predictions change.
        self.shape: dict[Any, Any] = shape if shape is not None else {}
        #: Those facts of an earlier form of the tree (a predecessor's, before grafts),
        #: which :attr:`shape` grows from (:func:`focus.search.shape.shape_fact`).
        self.known = known
        #: The tree's noise rows per (γ, truncation rule) (they read its predictions).
        self._rows: dict[tuple[float, str], list[Checkpoint]] = {}
        #: A first ranking's parts that no calibration changes, computed ahead (:meth:`prefit`);
        #: an earlier form's, handed over (:meth:`handover`): an edge's segment reads only
        #: the edge, and a tie-break is kept with the slot it was drawn for.
        self._ahead: dict[tuple[str, Any], Any] = ahead if ahead is not None else {}

    def describes(self, tree: Tree, index: int) -> bool:
        return self.tree is tree and self.index == index and self.size == (len(tree.nodes), tree.rollouts)

    @property
    def spent(self) -> dict[int, int]:
        """Budget spent per phase (:attr:`focus.usage.Usage.budget_spent`)."""
        if self._spent is None:
            self._spent = {}
            for r in self.tree.log:
                self._spent[r.phase] = self._spent.get(r.phase, 0) + r.usage.budget_spent
        return self._spent

    @property
    def spreads(self) -> int:
        """Checkpoints with two or more children that did not fail (:func:`tree_spreads`)."""
        return int(self._shape("spreads"))

    def counts(self, truncation: str) -> Counts:
        """The tree's share of a calibration's counts (:func:`focus.calibration.tree_counts`)."""
        return self._shape(truncation)  # type: ignore[no-any-return]

    @property
    def draws(self) -> list[tuple[float, int]]:
        """``(explore_draw, node id)`` of the next continuation slot of every checkpoint
        with a branch state and a child, smallest draw first: a slot is drawn for
        exploration at a rate where its draw is below it (:func:`focus.priority.explores`),
        so a planner reads only the head of the list (``focus.search.planning``)."""
        return self._shape("draws")  # type: ignore[no-any-return]

    @property
    def depths(self) -> Depths:
        return self._shape("depths")  # type: ignore[no-any-return]

    def _shape(self, key: Any) -> Any:
        """A fact of :attr:`shape` (:func:`focus.search.shape.shape_fact`), grown from an
        earlier tree's where one is :attr:`known`."""
        fact = self.shape.get(key)
        if fact is None:
            fact = self.shape[key] = shape_fact(self.tree, self.index, key, self.known)
        return fact

    def built(self, search: Priority, calibration: Calibration, seed: int) -> bool:
        """Whether the tree's ranking is built for this configuration and calibration
        (it may still have changed nodes to bring up to date, which costs little)."""
        return self.rank is not None and self.rank.matches(search, calibration, seed)

    def prefit(self, search: Priority, scored: bool = True, seed: int | None = None, rows_only: bool = False) -> None:
        """Compute what a calibration fitted on every tree reads of this one (its
        spreads and counts; with ``scored``, its predictions being final, its noise rows),
        and, for a tree never ranked and given the collection ``seed``, the parts of its
        first ranking that the calibration does not change (edge segments, tie-breaks);
        for a search that explores, the draws of the checkpoints' next slots
        (:attr:`draws`, what the plan's lead reads, ``focus.search.planning``).
        ``rows_only``: the noise rows alone (with ``scored``), what a batch's noise fit
        reads (:meth:`SearchState.batch_parts`), for a wave expected to end the search
        (``focus.search.last_wave``): the rest is for plans, which compute it if any
        comes."""
        if rows_only:
            if scored:
                self.noise_rows(search.discount, search.truncation_rule)
            return
        _ = self.spreads
        if exploration_rate(search, 0.0) > 0:
            _ = self.draws
        self.counts(search.truncation_rule)
        if seed is not None and self.rank is None:
            self._prefit_ahead(search.discount, seed)
        if scored:
            self.noise_rows(search.discount, search.truncation_rule)

    def _prefit_ahead(self, gamma: float, seed: int) -> None:
        """:meth:`prefit`'s parts of a first ranking: the segments of the edges and the
        tie-breaks of the checkpoints' next slots that an earlier form of the tree left
        none of (a tree grafted or scored again before its first ranking, as in the
        evidence wave's tail, kept those of its earlier form: at 40k transitions over
        800 tasks, 9,117 of 49,599 segments were of edges that had one already)."""
        tree, ahead = self.tree, self._ahead
        segs = ahead.setdefault(("segments", gamma), {})
        if len(segs) < len(tree.edges):
            segs.update((i, segment(e, gamma)) for i, e in tree.edges.items() if i not in segs)
        ties = ahead.setdefault(("ties", seed), {})
        index = self.index
        for n in tree.checkpoints():
            slot = len(n.children)
            known = ties.get(n.id)
            if known is None or known[0] != slot:
                ties[n.id] = (slot, tie(seed, index, n.id, slot))

    def noise_rows(self, gamma: float, truncation: str) -> list[Checkpoint]:
        """The tree's rows of the noise fit (:func:`focus.noise_rows.tree_rows`), on the
        edge segments its ranking holds at ``gamma`` (or, before its first ranking, those
        kept for it): an edge's segment is computed once for both."""
        rows = self._rows.get((gamma, truncation))
        if rows is None:
            rows = tree_rows(self.tree, gamma, truncation, None, self.segments(gamma))  # type: ignore[arg-type]
            self._rows[(gamma, truncation)] = rows
        return rows

    def segments(self, gamma: float) -> dict[int, Segment] | None:
        """The edge segments at ``gamma`` kept for this tree (some edges' may be missing:
        a reader adds them): its ranking's, or before its first ranking those kept for
        it (:meth:`ranking` takes them over); none for a ranking at another γ."""
        rank = self.rank
        if rank is None:
            return self._ahead.setdefault(("segments", gamma), {})  # type: ignore[no-any-return]
        return rank.segments if rank.gamma == gamma else None

    @property
    def unscored(self) -> tuple[int, ...]:
        """Nodes the critic should score: checkpoints and truncated leaves without a value."""
        if self._unscored is None:
            self._unscored = tuple(
                n.id for n in self.tree.nodes.values() if n.value is None and n.kind in _SCORED_KINDS and n.context_ids
            )
        return self._unscored

    def ranking(self, search: Priority, calibration: Calibration, seed: int) -> TreeRanking:
        """The tree's ranking for this configuration, brought up to date."""
        rank = self.rank
        if rank is None or not rank.matches(search, calibration, seed):
            # a new calibration (or configuration) changes every view, not the edges'
            # segments: those of the same γ are taken over
            if rank is not None:
                segs = rank.segments if rank.gamma == search.discount else None
                ties = rank.ties() if rank.seed == seed else None
            else:  # what the tail computed ahead (:meth:`prefit`), if anything
                segs, ties = self._ahead.get(("segments", search.discount)), self._ahead.get(("ties", seed))
            self._ahead = {}
            rank = self.rank = TreeRanking(self.tree, self.index, search, calibration, seed, segs, ties)
            self.changed = set()
        elif self.changed:
            rank.update(self.tree, self.changed)
            self.changed = set()
        return rank

    def handover(self, changed: Iterable[int]) -> tuple[TreeRanking | None, set[int], dict[tuple[str, Any], Any]]:
        """Give this tree's ranking, and what :meth:`prefit` computed ahead of a first
        one, to its successor (which changed ``changed``): this object keeps neither, so
        a state planned again after its successor exists ranks from scratch instead of
        reading a ranking (or segments) of another tree."""
        rank, pending, ahead = self.rank, set(self.changed), self._ahead
        self.rank, self.changed, self._ahead = None, set(), {}
        pending.update(changed)
        return rank, pending, ahead

    def rescored(self, tree: Tree, scored: set[int]) -> _TreeFacts:
        """The facts of ``tree``, this tree with new predictions at the nodes ``scored``:
        what reads no prediction carries over, the ranking is handed over (:meth:`handover`)."""
        left = None if self._unscored is None else tuple(n for n in self._unscored if n not in scored)
        rank, changed, ahead = self.handover(scored)
        return _TreeFacts(
            tree,
            self.index,
            spent=self._spent,
            unscored=left,
            rank=rank,
            changed=changed,
            shape=self.shape,
            known=self.known,
            ahead=ahead,
        )

    def evidence(self, search: Priority, calibration: Calibration, seed: int = 0) -> dict[int, NodeEvidence]:
        return self.ranking(search, calibration, seed).evidence

    def view(self, search: Priority, calibration: Calibration, seed: int, node_id: int) -> NodeEvidence | None:
        """The evidence view of one checkpoint (``None`` for another node)."""
        return self.ranking(search, calibration, seed).view(node_id)

    def ranked(self, search: Priority, calibration: Calibration, phase_index: int, seed: int) -> list[Entry]:
        """Eligible checkpoints of phase ``phase_index``, best first (nothing pending)."""
        return self.ranking(search, calibration, seed).ranked(self.tree, phase_index)


def copy_state(state: SearchState) -> SearchState:
    return SearchState(
        state.collection_id,
        state.seed,
        state.tasks,
        [copy_tree(t) for t in state.trees],
        list(state.waves),
        state.planned,
    )


def _successor(
    state: SearchState,
    trees: list[Tree],
    derived: dict[int, _TreeFacts],
    waves: list[Any],
    planned: tuple[WavePlan, ...],
    calibrations: dict[tuple[Any, ...], Calibration],
    touched: Iterable[int] = (),
) -> SearchState:
    """A successor of ``state`` whose trees differ from its own at ``touched``; it
    takes ``state``'s plan index over (:meth:`focus.search.heads.PlanIndex.moved`)."""
    new = SearchState(state.collection_id, state.seed, state.tasks, trees, waves, planned)
    new._derived = derived
    new._calibrations = calibrations
    # the first k waves of a successor are its predecessor's: their counts still hold
    new._spreads = dict(state._spreads)
    index, state._index = state._index, None
    new._index = None if index is None else index.moved(touched)
    return new


def unscored(state: SearchState) -> list[tuple[int, int]]:
    """(tree index, node id) of every node the critic has not scored yet, in tree order
    (of the trees the plan index holds as unscored: those changed since it last looked)."""
    return [(ti, nid) for ti in plan_index(state).unscored_trees(state) for nid in state.facts(ti).unscored]
