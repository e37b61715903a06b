"""Which replica serves a model call: FOCUS's tree routing, and two baselines.

Several replicas of one model each keep a prefix cache (vLLM's automatic prefix
caching, SGLang's radix cache): a request whose prompt starts with tokens a replica
computed recently skips their prefill there, and only there. FOCUS knows which prefix
every request continues - the checkpoint it starts from, and the rollouts that led to it
- so it can send each request where that prefix already is, instead of guessing it from
the prompt's text as a cache-aware router must.

The route of a model call (:attr:`focus.agent.BranchState.route` plus the rollout's
seed, see :meth:`focus.agent.Agent.rollout`) is the path from the tree's root to the
request: the task id, then the seed of every rollout whose segments lead to the
checkpoint, then the rollout making the call. Every rollout of a tree shares the root's
prompt; a continuation shares the whole prompt of the checkpoint it starts from, which
the rollout that made the checkpoint computed; each call of a rollout extends the
previous call's prompt. So :func:`choose_by_tree` sends a call to the replica that
served the deepest element of its route (the rollout itself, then the rollout that made
its checkpoint, ..., then the tree's first call), unless that replica is down or holds
more than its share of the calls in flight (bounded loads, as in consistent hashing with
bounded loads, Mirrokni, Thorup and Zadimoghaddam 2018: at most ``1 + balance`` times
the mean, rounded up, plus a small ``slack``); then the next element up, and failing all, the least loaded
replica. The decision is a pure function of the route, who served what, the loads and
which replicas are up; :class:`TreeRouter` keeps the "who served what" table.

Baselines, for ``benchmarks/fleet.py`` and for users who want them: :class:`RoundRobin`,
and :class:`CacheAwareRouter`, SGLang's router policy as its documentation describes it
(an approximate prefix tree of the requests sent to each worker; the worker with the
longest match if the match covers more than ``cache_threshold`` of the prompt, else the
worker with the smallest tree; shortest queue instead whenever the loads are imbalanced
by more than both ``balance_abs`` and ``balance_rel``). Its trees here are block-granular
(:class:`PrefixBlocks`, 16 tokens a block, least recently used blocks evicted past
``max_tree_blocks``) rather than character trees: the client sends token ids.
"""

from __future__ import annotations

import abc
import math
from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence

#: A route: the task id, then rollout seeds, root first (see the module docs).
Route = tuple[Hashable, ...]


class NoReplica(RuntimeError):
    """Every replica is down."""


def load_bound(loads: Sequence[int], up: Sequence[bool], balance: float, slack: int = 2) -> int:
    """Calls a replica may have in flight and still take one more: ``1 + balance`` times
    the mean over the replicas that are up, counting the call being placed, rounded up,
    plus ``slack`` (with few calls in flight, one more call is no imbalance worth a
    prefix recomputed elsewhere)."""
    n = sum(up)
    total = sum(load for load, ok in zip(loads, up, strict=True) if ok)
    return math.ceil((1.0 + balance) * (total + 1) / n) + slack


def least_loaded(loads: Sequence[int], up: Sequence[bool]) -> int:
    """The up replica with the fewest calls in flight (the first of equals)."""
    best = -1
    for i, ok in enumerate(up):
        if ok and (best < 0 or loads[i] < loads[best]):
            best = i
    if best < 0:
        raise NoReplica("every replica is down")
    return best


def choose_by_tree(
    route: Route,
    holders: Mapping[Hashable, int],
    loads: Sequence[int],
    up: Sequence[bool],
    balance: float = 0.25,
    slack: int = 2,
) -> int:
    """The replica for a call with ``route``: the holder of its deepest element that is up
    and under the load bound (:func:`load_bound`), else the least loaded up replica.
    ``holders``: element -> the replica that served it last; ``loads``: calls in flight
    per replica."""
    if not any(up):
        raise NoReplica("every replica is down")
    bound = load_bound(loads, up, balance, slack)
    for element in reversed(route):
        i = holders.get(element)
        if i is not None and up[i] and loads[i] < bound:
            return i
    return least_loaded(loads, up)


class Router(abc.ABC):
    """Picks the replica of each call; may learn from its own choices (not from answers)."""

    @abc.abstractmethod
    def choose(self, prompt_ids: Sequence[int], route: Route, loads: Sequence[int], up: Sequence[bool]) -> int:
        """The replica for this call (``up[i]`` must hold); records what it needs."""

    def join(self, route: Route, i: int) -> None:  # noqa: B027 - optional hook
        """A call on ``route`` goes to replica ``i`` with a call this router placed there
        (a sibling sent in one request with it, :mod:`focus.siblings`): record it as
        :meth:`choose` would have. The default records nothing."""


class TreeRouter(Router):
    """FOCUS's routing (:func:`choose_by_tree`) and the table of who served which route
    element. After a call is placed on replica ``i``, ``i`` holds the call's rollout (its
    prompt grows there) and every element whose holder was unknown or down. The table
    keeps ``max_entries`` elements (oldest forgotten first: a forgotten rollout's prefix
    has most likely left the replica's cache too)."""

    def __init__(self, balance: float = 0.25, slack: int = 2, max_entries: int = 1_000_000) -> None:
        self.balance, self.slack, self.max_entries = balance, slack, max_entries
        self.holders: dict[Hashable, int] = {}

    def choose(self, prompt_ids: Sequence[int], route: Route, loads: Sequence[int], up: Sequence[bool]) -> int:
        i = choose_by_tree(route, self.holders, loads, up, self.balance, self.slack)
        holders = self.holders
        last = len(route) - 1
        for k, element in enumerate(route):
            j = holders.pop(element, None)  # re-inserted: the table forgets the least recently used first
            holders[element] = i if k == last or j is None or not up[j] else j
        while len(holders) > self.max_entries:
            del holders[next(iter(holders))]
        return i

    def join(self, route: Route, i: int) -> None:
        # a sibling's route is its placed sibling's but for its own seed, the last element
        if route:
            self.holders.pop(route[-1], None)
            self.holders[route[-1]] = i
            while len(self.holders) > self.max_entries:
                del self.holders[next(iter(self.holders))]


class RoundRobin(Router):
    """Each call to the next replica that is up, in turn."""

    def __init__(self) -> None:
        self.next = 0

    def choose(self, prompt_ids: Sequence[int], route: Route, loads: Sequence[int], up: Sequence[bool]) -> int:
        n = len(up)
        for k in range(n):
            i = (self.next + k) % n
            if up[i]:
                self.next = i + 1
                return i
        raise NoReplica("every replica is down")


class PrefixBlocks:
    """A block-granular prefix index with least-recently-used eviction, the layout of
    vLLM's automatic prefix caching: block ``k`` of a sequence (tokens ``[kB, (k+1)B)``)
    is known by a hash of block ``k-1``'s key and its own tokens, so a key stands for the
    whole prefix up to it; a partial last block is not kept. ``capacity``: blocks kept."""

    def __init__(self, capacity: int, block: int = 16) -> None:
        self.capacity, self.block = capacity, block
        self.blocks: OrderedDict[int, None] = OrderedDict()

    def keys(self, ids: Sequence[int]) -> list[int]:
        """The keys of the full blocks of ``ids``."""
        b, out, key = self.block, [], 0
        for start in range(0, len(ids) - b + 1, b):
            key = hash((key, tuple(ids[start : start + b])))
            out.append(key)
        return out

    def match(self, keys: Sequence[int]) -> int:
        """How many leading blocks of ``keys`` are held."""
        n = 0
        for k in keys:
            if k not in self.blocks:
                break
            n += 1
        return n

    def insert(self, keys: Sequence[int]) -> None:
        """Hold ``keys`` (as most recently used), evicting the least recently used."""
        if self.capacity <= 0:
            return
        blocks = self.blocks
        for k in keys:
            if k in blocks:
                blocks.move_to_end(k)
            else:
                blocks[k] = None
        while len(blocks) > self.capacity:
            blocks.popitem(last=False)

    def __len__(self) -> int:
        return len(self.blocks)


class CacheAwareRouter(Router):
    """SGLang's cache-aware load balancing, from its description (module docs): per
    replica an approximate tree of the prompts sent there (:class:`PrefixBlocks`)."""

    def __init__(
        self,
        replicas: int,
        *,
        cache_threshold: float = 0.5,
        balance_abs: int = 32,
        balance_rel: float = 1.0001,
        max_tree_blocks: int = 1 << 20,
        block: int = 16,
    ) -> None:
        self.cache_threshold, self.balance_abs, self.balance_rel = cache_threshold, balance_abs, balance_rel
        self.trees = [PrefixBlocks(max_tree_blocks, block) for _ in range(replicas)]

    def choose(self, prompt_ids: Sequence[int], route: Route, loads: Sequence[int], up: Sequence[bool]) -> int:
        alive = [i for i, ok in enumerate(up) if ok]
        if not alive:
            raise NoReplica("every replica is down")
        keys = self.trees[0].keys(prompt_ids)
        high, low = max(loads[i] for i in alive), min(loads[i] for i in alive)
        if high - low > self.balance_abs and high > self.balance_rel * low:
            i = least_loaded(loads, up)
        else:
            best = max(alive, key=lambda j: self.trees[j].match(keys))
            matched = self.trees[best].match(keys) * self.trees[best].block
            if prompt_ids and matched / len(prompt_ids) > self.cache_threshold:
                i = best
            else:
                i = min(alive, key=lambda j: len(self.trees[j]))
        self.trees[i].insert(keys)
        return i
