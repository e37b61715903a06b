"""Routing decisions over model replicas (focus/backends/routing.py): pure, no servers."""

from __future__ import annotations

import pytest

from focus.backends.routing import (
    CacheAwareRouter,
    NoReplica,
    PrefixBlocks,
    RoundRobin,
    TreeRouter,
    choose_by_tree,
    load_bound,
)

UP3 = [True, True, True]


def test_the_deepest_route_element_with_a_holder_decides():
    holders = {"task": 0, 11: 1, 22: 2}
    assert choose_by_tree(("task", 11, 22), holders, [0, 0, 0], UP3) == 2  # the rollout's own replica
    assert choose_by_tree(("task", 11, 33), holders, [0, 0, 0], UP3) == 1  # a new rollout: its checkpoint's maker
    assert choose_by_tree(("task", 44), holders, [0, 0, 0], UP3) == 0  # a new branch of the tree: the root's
    assert choose_by_tree(("other",), holders, [3, 1, 2], UP3) == 1  # nothing known: the least loaded


def test_a_full_or_down_holder_passes_the_call_up_the_route_then_to_the_least_loaded():
    holders = {"task": 0, 11: 1}
    assert load_bound([4, 4, 4], UP3, 0.25, slack=0) == 6  # ceil(1.25 * 13 / 3)
    assert load_bound([4, 4, 4], UP3, 0.25) == 8  # with the default slack of 2
    kw = {"balance": 0.25, "slack": 0}
    assert choose_by_tree(("task", 11, 5), holders, [4, 7, 4], UP3, **kw) == 0  # 1 is full (7 of 7): the root's
    assert choose_by_tree(("task", 11, 5), holders, [6, 6, 1], UP3, **kw) == 2  # both full: the least loaded
    assert choose_by_tree(("task", 11, 5), holders, [0, 0, 9], [True, False, True]) == 0  # 1 is down
    with pytest.raises(NoReplica):
        choose_by_tree(("task",), holders, [0, 0, 0], [False, False, False])


def test_the_tree_router_keeps_a_rollout_and_its_descendants_on_one_replica():
    r = TreeRouter()
    loads = [0, 0, 0]
    first = r.choose([1], ("t", 7), loads, UP3)  # the first call of the first rollout of task t
    loads[first] += 1
    assert r.choose([1, 2], ("t", 7), loads, UP3) == first  # its next call: where its prompt grew
    assert r.choose([1, 2, 3], ("t", 7, 8), loads, UP3) == first  # a continuation of its checkpoint
    other = r.choose([9], ("u", 1), loads, UP3)  # another task: placed by load
    assert other != first
    # the replica goes down: the rollout moves, and its new replica holds it from now on
    up = [i != first for i in range(3)]
    moved = r.choose([1, 2, 3, 4], ("t", 7, 8), loads, up)
    assert moved != first and r.holders[8] == moved and r.holders["t"] == moved and r.holders[7] == moved
    assert r.choose([1, 2, 3, 4, 5], ("t", 7, 8), loads, UP3) == moved


def test_the_tree_router_forgets_the_least_recently_used_elements_first():
    r = TreeRouter(max_entries=3)
    for route in (("a", 1), ("b", 2), ("a", 3)):
        r.choose([1], route, [0, 0], [True, True])
    assert list(r.holders) == ["b", 2, "a", 3][-3:] and "a" in r.holders and 1 not in r.holders


def test_round_robin_skips_replicas_that_are_down():
    r = RoundRobin()
    assert [r.choose([1], (), [0] * 3, [True, False, True]) for _ in range(4)] == [0, 2, 0, 2]
    with pytest.raises(NoReplica):
        r.choose([1], (), [0], [False])


def test_prefix_blocks_match_whole_leading_blocks_and_evict_the_least_recently_used():
    cache = PrefixBlocks(capacity=3, block=2)
    keys = cache.keys([1, 2, 3, 4, 5])
    assert len(keys) == 2  # the partial last block is not kept
    assert cache.keys([1, 2, 3, 4]) == keys and cache.keys([9, 2, 3, 4])[1] != keys[1]  # a key names its whole prefix
    cache.insert(keys)
    assert cache.match(cache.keys([1, 2, 3, 4, 7, 7])) == 2 and cache.match(cache.keys([1, 2, 9, 9])) == 1
    cache.insert(cache.keys([5, 5, 6, 6]))  # 4 blocks for 3 places: the oldest ([1, 2]) goes
    assert len(cache) == 3 and cache.match(keys) == 0


def test_the_cache_aware_baseline_follows_matches_tree_sizes_and_imbalance():
    r = CacheAwareRouter(3, cache_threshold=0.5, balance_abs=4, balance_rel=1.5, block=2)
    long = list(range(20))
    first = r.choose(long, (), [0, 0, 0], UP3)
    assert r.choose([*long, 99, 98], (), [0, 0, 0], UP3) == first  # most of the prompt matched there
    fresh = r.choose([50, 51, 52, 53], (), [0, 0, 0], UP3)  # no match: the smallest tree
    assert fresh != first
    assert r.choose(long, (), [9, 0, 2], UP3) == 1  # imbalanced (9 - 0 > 4, 9 > 1.5 * 0): shortest queue
