"""The per-depth merge of a bounded wave (:class:`focus.search.depth_heaps.DepthHeaps`)
takes, at each step, what a plain sort of every entry left would: the best entry of a
depth the bound allows (an exploration pick at any depth), and once no depth with
entries is allowed, the best of all from then on."""

from __future__ import annotations

import random

from focus.priority import EXPLORE
from focus.search.depth_heaps import DepthHeaps
from focus.search.depth_share import DepthShare

Entry = tuple[float, float, int, int]


def _case(
    rng: random.Random,
) -> tuple[dict[int, dict[int, list[Entry]]], dict[tuple[int, int], int], set[tuple[int, int]]]:
    """Random trees' rankings split by depth, the depth of every checkpoint, and the
    checkpoints planned or running (``busy``, in a few trees)."""
    lists: dict[int, dict[int, list[Entry]]] = {}
    depth_of: dict[tuple[int, int], int] = {}
    busy: set[tuple[int, int]] = set()
    for ti in range(rng.randint(1, 8)):
        entries = []
        for nid in range(rng.randint(0, 12)):
            key = -EXPLORE if rng.random() < 0.05 else -rng.choice([rng.random(), 0.5, 1.0])
            entries.append((key, rng.random(), ti, nid))
            depth_of[(ti, nid)] = rng.randint(0, 5)
            if rng.random() < 0.1:
                busy.add((ti, nid))
        by: dict[int, list[Entry]] = {}
        for e in sorted(entries):
            by.setdefault(depth_of[(ti, e[3])], []).append(e)
        lists[ti] = by
    return lists, depth_of, busy


def _share(rng: random.Random, depths: list[int]) -> tuple[float, dict[int, float], dict[int, int]]:
    weights = {d: rng.random() for d in depths if rng.random() < 0.9}
    total = sum(weights.values())
    shares = {d: w / total for d, w in weights.items()} if total else {}
    starts = {d: rng.randint(0, 6) for d in depths if rng.random() < 0.5}
    return rng.choice([0.5, 1.0, 1.5, 3.0]), shares, starts


def test_takes_the_best_allowed_entry_like_a_plain_sort() -> None:
    for case in range(400):
        _check(case)


def _check(case: int) -> None:
    rng = random.Random(case)
    lists, depth_of, busy = _case(rng)
    heads: dict[int, list[Entry]] = {}
    for by in lists.values():
        for d, part in by.items():
            heads.setdefault(d, []).append(part[0])
    for part in heads.values():
        part.sort()
    calls: list[int] = []

    def read(ti: int) -> dict[int, list[Entry]]:
        calls.append(ti)
        return lists[ti]

    merge = DepthHeaps(heads, read, busy)
    pool = {e for by in lists.values() for part in by.values() for e in part if (e[2], e[3]) not in busy}
    for ti, nid in sorted(busy):  # a pending checkpoint enters re-ranked (as the greedy's rank does)
        if rng.random() < 0.5:
            e = (-rng.random(), rng.random(), ti, nid)
            merge.push((*e, -1), depth_of[(ti, nid)])
            pool.add(e)
    factor, shares, starts = _share(rng, sorted(set(depth_of.values())))
    share = DepthShare(factor, shares, dict(starts)) if rng.random() < 0.9 else None
    ref = DepthShare(factor, shares, dict(starts))
    bounded = share is not None
    while pool:
        order = sorted(pool)
        want = None
        if bounded:
            want = next((e for e in order if e[0] == -EXPLORE or ref.allows(depth_of[(e[2], e[3])])), None)
            if want is None:
                bounded = False
            else:
                ref.take(depth_of[(want[2], want[3])])
        if want is None:
            want = order[0]
        got = merge.take(share)
        assert got == (want, depth_of[(want[2], want[3])]), case
        pool.discard(want)
        if rng.random() < 0.4:  # taken and re-ranked with one more pending
            again = (want[0] + rng.random(), rng.random(), want[2], want[3])
            merge.push((*again, -1), depth_of[(want[2], want[3])])
            pool.add(again)
    assert merge.take(share) is None
    if share is not None:
        assert share.starts == ref.starts


def test_a_full_depth_is_not_read() -> None:
    """A depth the bound keeps full is never popped: one tree's lists are read only
    where one of its entries was taken (or the tree is set aside)."""
    lists = {
        ti: {0: [(-0.1 - ti / 100, 0.5, ti, 0)], 1: [(-0.9, 0.1 * ti, ti, 1), (-0.8, 0.1 * ti, ti, 2)]}
        for ti in range(5)
    }
    heads = {d: sorted(by[d][0] for by in lists.values()) for d in (0, 1)}
    read: list[int] = []

    def lists_of(ti: int) -> dict[int, list[Entry]]:
        read.append(ti)
        return lists[ti]

    merge = DepthHeaps(heads, lists_of, set())
    share = DepthShare(1.0, {0: 0.5, 1: 0.5}, {0: 0, 1: 100})  # depth 1 full for 5 takes
    taken = [merge.take(share) for _ in range(5)]
    assert [t[1] for t in taken if t is not None] == [0] * 5
    assert sorted(read) == list(range(5))  # each tree once, to push its next entry of depth 0
