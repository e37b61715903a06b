"""One policy over several replicas of one model: routing, failover, per-replica figures.

:class:`FleetPolicy` holds one HTTP policy per replica (vLLM, SGLang or the embedded
server, each with its own connections, retries and hedges) and sends each call to one of
them. Which one is the :class:`~focus.backends.routing.Router`'s decision - by default
FOCUS's tree routing, which sends a call where the prefix it continues was computed
(:mod:`focus.backends.routing`) - made from the call's route (the agent passes it,
:meth:`focus.policy.Policy.sample_on_route`), its prompt, and the calls in flight on each
replica. This module is the I/O around that decision:

* **Same weights.** Replicas must serve the same weights: before the first call the
  fleet asks each for its version (:meth:`HttpPolicy.served_version`) and refuses to
  sample if they differ, naming them; every answer's version is checked against the
  fleet's afterwards. Replicas that differ at the start stop the collection at once
  (:class:`~focus.policy.ReplicasDiffer`: which weights are meant is the user's to say);
  a replica that answers with other weights later (restarted on another checkpoint) is
  set aside for good and its answer dropped, the call going to another replica: one
  policy in the batch, nothing lost.
* **Failover.** A replica whose calls find it down (its client's quick retries spent on
  refused or reset connections or 502/503/504, about a second) is marked down and the
  call goes to another replica at once; nothing is lost, and since a sample depends on
  its seed, not on the replica, the rollout is the one it would have been. A replica
  marked down gets one call again after ``down_s`` (doubling while it stays down, up to
  a minute); its first answer brings it back. When every replica is down the calls wait
  for one, as a single server's do (``outage_wait_s``, :mod:`focus.backends.outage`).
* **Slow replicas.** The router sees each replica's calls in flight weighed by how much
  slower than the median replica it answers (:meth:`FleetPolicy._weighed_loads`), so a
  replica on a slower GPU holds few calls instead of its share of them.
* **Siblings.** The first calls of a checkpoint's siblings (:mod:`focus.siblings`) go
  to the replica chosen for the first of them, as one request where the replicas send
  them so, and the router records the others as placed there.
* **Figures.** :meth:`FleetPolicy.stats` gives per replica the calls it answered, the
  prompt tokens sent and those its prefix cache served (as the server reports them),
  the tokens generated and the calls that failed over from it.

The loads, the down marks and the router's table belong to this process: Dask workers
each route their own shard's calls.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from focus.backends.foreign import server_key
from focus.backends.http_policy import HttpPolicy
from focus.backends.outage import CONSOLE, OVER, OutageGate, OutageTotals, span
from focus.backends.routing import Router, TreeRouter
from focus.policy import Completion, Policy, PolicyError, ReplicasDiffer, SamplingParams, ServiceUnavailable

log = logging.getLogger(__name__)

#: What the lines for replicas that serve different weights say to do.
SAME_WEIGHTS = (
    ": every replica in model.urls must serve the same weights (list only those that serve the ones to collect "
    "with); nothing of the running wave is kept, and a rerun with the same collection id goes on once they do"
)


@dataclass
class ReplicaStats:
    """What one replica did for this policy (in this process)."""

    url: str
    #: Samples it answered (siblings sent in one request count one each).
    calls: int = 0
    #: Prompt tokens sent to it (once per request).
    prompt_tokens: int = 0
    #: Prompt tokens the replica reports as served from its prefix cache.
    cached_tokens: int = 0
    completion_tokens: int = 0
    #: Calls that found it down, or that it answered with other weights than the fleet's,
    #: and went to another replica.
    failovers: int = 0

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["cache_hit_ratio"] = round(self.cached_tokens / self.prompt_tokens, 4) if self.prompt_tokens else None
        return out


class FleetPolicy(Policy):
    """Several replicas of one model behind one policy (see the module docs).

    ``replicas``: one HTTP policy per replica (same model, same codec); their clients'
    ``outage_wait_s`` becomes the fleet's wait when every replica is down. ``router``:
    :class:`~focus.backends.routing.TreeRouter` unless given. ``down_s``: how long a
    replica found down is left alone before it gets a call again.
    """

    MAX_DOWN_S = 60.0

    def __init__(self, replicas: Sequence[HttpPolicy], router: Router | None = None, *, down_s: float = 2.0) -> None:
        if not replicas:
            raise ValueError("FleetPolicy needs at least one replica")
        _check_replicas(replicas)
        self.replicas = list(replicas)
        self.router = router or TreeRouter()
        self.down_s = down_s
        self.vocab_size = replicas[0].vocab_size
        self.policy_version = replicas[0].policy_version
        for r in self.replicas:
            r.http.wait_outages = False  # a replica that is down fails over at once
        n = len(self.replicas)
        self.loads = [0] * n
        #: Seconds per answered call, a moving average per replica (None: no answer yet).
        self.latency: list[float | None] = [None] * n
        self._timed_at = [0.0] * n
        self._down_until = [0.0] * n
        self._down_for = [0.0] * n
        self._probing = [False] * n
        #: Replicas set aside for good: they answered with other weights than the fleet's.
        self._refused = [False] * n
        self._replica_stats = [ReplicaStats(r.http.base_url) for r in self.replicas]
        self._outages = OutageTotals()
        self._gate: OutageGate | None = None
        self._gate_loop: asyncio.AbstractEventLoop | None = None
        self._verify_lock: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None
        self._verified = False
        #: The weights every replica serves, once known.
        self._version: str | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_gate=None, _gate_loop=None, _verify_lock=None)
        return state

    @property
    def urls(self) -> list[str]:
        return [r.http.base_url for r in self.replicas]

    # ---- the weights ----

    #: How long the weights check before the first call waits for a replica: one that has
    #: not answered by then, or is down, is set aside as down (and checked by its answers).
    VERIFY_S = 10.0

    async def verify(self) -> None:
        """Ask every replica which weights it serves; :class:`ReplicasDiffer` if they
        differ. Replicas that cannot be asked now are checked by their answers; those
        down or silent for :attr:`VERIFY_S` are set aside as down. Every call waits for
        this check, and a stopped (wedged) replica held it for its client's whole
        ``timeout_s`` (120 s by default), then took calls that waited as long."""

        async def ask(r: HttpPolicy) -> str | None:
            return await asyncio.wait_for(r.served_version(), self.VERIFY_S)

        versions = await asyncio.gather(*(ask(r) for r in self.replicas), return_exceptions=True)
        now = time.monotonic()
        for i, v in enumerate(versions):
            if isinstance(v, (TimeoutError, ServiceUnavailable)) and self._down_until[i] == 0.0:
                self._down_for[i] = self.down_s
                self._down_until[i] = now + self.down_s
                why = f"no answer within {self.VERIFY_S:g} s" if isinstance(v, TimeoutError) else str(v)
                log.warning(
                    "replica %s of the model is down; its calls go to the others (asked which weights it serves: %s)",
                    self.urls[i],
                    why,
                    extra=CONSOLE,
                )
        known = {url: v for url, v in zip(self.urls, versions, strict=True) if isinstance(v, str)}
        if len(set(known.values())) > 1:
            named = ", ".join(f"{url}: {v}" for url, v in known.items())
            raise ReplicasDiffer(f"the model's replicas serve different weights ({named}){SAME_WEIGHTS}")
        if known:
            self._version = next(iter(known.values()))
            self.policy_version = self._version
        self._verified = True

    async def _verify_once(self) -> None:
        """:meth:`verify` before the first call (one call asks; the others wait for it)."""
        loop = asyncio.get_running_loop()
        if self._verify_lock is None or self._verify_lock[0] is not loop:
            self._verify_lock = (loop, asyncio.Lock())
        async with self._verify_lock[1]:
            if not self._verified:
                await self.verify()

    def _same_weights(self, i: int, completion: Completion) -> bool:
        """Whether replica ``i``'s answer names the fleet's weights (or none). One that
        names others is set aside for good, with one warning line naming it, and the
        answer dropped: the call goes to another replica, so the batch keeps one policy
        and loses nothing. It failed as a bad response: the rollout ran again, on
        another replica or the same, and the collection went on or stopped as a "model
        service outage" by chance. :class:`ReplicasDiffer` once no replica is left."""
        version = completion.policy_version
        if not version:
            return True
        if self._version is None:
            self._version = self.policy_version = version
        if version == self._version:
            return True
        self._replica_stats[i].failovers += 1
        if not self._refused[i]:
            self._refused[i] = True
            log.warning(
                "replica %s of the model answers with weights %s, the others' are %s (restarted on another "
                "checkpoint?): it gets no more calls in this collection; its answers are dropped",
                self.urls[i],
                version,
                self._version,
                extra=CONSOLE,
            )
        if all(self._refused):
            raise ReplicasDiffer(
                f"every replica of the model now answers with other weights than {self._version}, the weights this "
                f"collection samples with (the last: {self.urls[i]} with {version}){SAME_WEIGHTS}"
            )
        return False

    # ---- sampling ----

    async def sample(self, prompt_ids: Sequence[int], params: SamplingParams) -> Completion:
        return await self.sample_on_route(prompt_ids, params, ())

    async def sample_on_route(
        self, prompt_ids: Sequence[int], params: SamplingParams, route: tuple[Hashable, ...]
    ) -> Completion:
        if not self._verified:
            await self._verify_once()
        while True:
            i, probe = await self._place(prompt_ids, route)
            if probe and not await self._alive(i):
                continue
            self.loads[i] += 1
            t0 = time.monotonic()
            try:
                completion = await self.replicas[i].sample(prompt_ids, params)
            except ServiceUnavailable as e:
                self._failed(i, e, probe)
                continue
            finally:
                self.loads[i] -= 1
            if not self._same_weights(i, completion):
                continue
            self._answered(i, prompt_ids, completion)
            self._timed(i, time.monotonic() - t0)
            return completion

    @property
    def groups_siblings(self) -> bool:  # type: ignore[override]
        """Siblings' calls go to one replica as one request where every replica would
        send them so (:attr:`HttpPolicy.groups_siblings`)."""
        return all(r.groups_siblings for r in self.replicas)

    async def sample_siblings(
        self, prompt_ids: Sequence[int], params: SamplingParams, routes: Sequence[tuple[Hashable, ...]]
    ) -> list[Completion]:
        """The siblings' calls on the replica the router picks for the first one (they
        share its prefix), as that replica sends them; failing over together."""
        if not self._verified:
            await self._verify_once()
        n = len(routes)
        while True:
            i, probe = await self._place(prompt_ids, routes[0])
            if probe and not await self._alive(i):
                continue
            for route in routes[1:]:
                self.router.join(route, i)
            self.loads[i] += n
            t0 = time.monotonic()
            try:
                completions = await self.replicas[i].sample_siblings(prompt_ids, params, routes)
            except ServiceUnavailable as e:
                self._failed(i, e, probe)
                continue
            finally:
                self.loads[i] -= n
            if not all(self._same_weights(i, c) for c in completions):
                continue
            self._timed(i, time.monotonic() - t0)
            sent = None  # the request of the previous answer: the next one's, if it came in it
            for completion in completions:
                record = completion.meta.get("http")
                self._answered(i, prompt_ids, completion, prompt_sent=record is None or record is not sent)
                sent = record
            check = completions[-1].meta.get("siblings_check") if completions else None
            if check is not None:  # the replica's one request that checked vLLM's rule
                self._replica_stats[i].prompt_tokens += len(prompt_ids)
                self._replica_stats[i].cached_tokens += check.cached_prompt_tokens or 0
            return completions

    async def _place(self, prompt_ids: Sequence[int], route: tuple[Hashable, ...]) -> tuple[int, bool]:
        """The replica for a call, and whether the call probes it (its first since it
        went down): the router's choice among those up; when none is, one whose turn to
        be tried has come, after waiting at the fleet's gate if need be."""
        while True:
            now = time.monotonic()
            up = [self._is_up(i, now) for i in range(len(self.replicas))]
            if any(up):
                i = self.router.choose(prompt_ids, route, self._weighed_loads(), up)
                probe = self._down_until[i] > 0
                if probe:
                    self._probing[i] = True
                return i, probe
            gate = self._gate_for_loop()
            turn = await gate.wait(None, "every replica is down")
            if turn == OVER:
                raise ServiceUnavailable(
                    f"every replica of the model ({', '.join(self.urls)}) has been down for "
                    f"{span(time.monotonic() - (gate.down_since or now))} (waited up to outage_wait_s = "
                    f"{gate.window_s:g} s)"
                )
            # one replica (the one down the shortest) gets a call again now
            soonest = min(
                (j for j in range(len(self.replicas)) if not self._refused[j]), key=lambda j: self._down_until[j]
            )
            self._down_until[soonest] = min(self._down_until[soonest], time.monotonic())
            self._probing[soonest] = False

    #: Weight of the newest call in a replica's latency average.
    LATENCY_WEIGHT = 0.2
    #: A replica this many times slower than the fleet's median counts its calls in flight
    #: as that many (rounded down); faster or nearer ones count them as they are.
    SLOW = 2.0

    #: A replica's average older than this (no answer from it since) weighs nothing.
    LATENCY_KEPT_S = 10.0

    def _timed(self, i: int, seconds: float) -> None:
        old = self.latency[i]
        self.latency[i] = seconds if old is None else old + self.LATENCY_WEIGHT * (seconds - old)
        self._timed_at[i] = time.monotonic()

    def _weighed_loads(self) -> list[int]:
        """The calls in flight per replica as the router weighs them. A replica ``k >=``
        :attr:`SLOW` times slower per call than the (lower) median replica counts as ``k`` calls
        per call it would hold with the one placed, less that one: what the call would
        wait there, in the median replica's calls. Counted as one each, a much slower
        replica (another GPU, a noisy neighbour) took a call whenever it held fewer than
        the others, and the rollouts routed there held every wave: three replicas, one 30
        times slower, collected 6.5 times slower than the two fast ones alone. Its
        average is forgotten :attr:`LATENCY_KEPT_S` after its last answer, so a replica
        that was slow for a while gets calls again and is timed anew."""
        now = time.monotonic()
        kept = [
            x if x is not None and now - t < self.LATENCY_KEPT_S else None
            for x, t in zip(self.latency, self._timed_at, strict=True)
        ]
        known = sorted(x for x in kept if x is not None)
        if len(known) < 2:
            return self.loads
        mid = known[(len(known) - 1) // 2]  # the lower median: of two replicas, the faster
        out = list(self.loads)
        for i, x in enumerate(kept):
            if x is not None and mid > 0 and x >= self.SLOW * mid:
                out[i] = (out[i] + 1) * int(x / mid) - 1
        return out

    def _is_up(self, i: int, now: float) -> bool:
        if self._refused[i]:
            return False
        until = self._down_until[i]
        return until == 0.0 or (now >= until and not self._probing[i])

    async def _alive(self, i: int) -> bool:
        """Whether replica ``i``, down until now, answers a ``GET`` of its weights within
        :attr:`VERIFY_S`, before a probing call is sent there; if not, it stays down (for
        twice as long) and the call goes elsewhere. The probe was the call itself, which
        on a stopped (wedged) replica waited its whole ``timeout_s`` each time."""
        try:
            await asyncio.wait_for(self.replicas[i].served_version(), self.VERIFY_S)
        except TimeoutError:
            self._failed(i, ServiceUnavailable(f"no answer to a GET within {self.VERIFY_S:g} s"), probe=True)
            return False
        except ServiceUnavailable as e:
            self._failed(i, e, probe=True)
            return False
        except PolicyError:
            pass  # it answers (refused, or a server without the endpoint): its call tells the rest
        return True

    def _failed(self, i: int, error: ServiceUnavailable, probe: bool) -> None:
        now = time.monotonic()
        self._replica_stats[i].failovers += 1
        was_up = self._down_until[i] == 0.0
        if was_up or probe:  # not for the other calls it had in flight when it went down
            self._down_for[i] = self.down_s if was_up else min(self.MAX_DOWN_S, 2 * self._down_for[i])
            self._down_until[i] = now + self._down_for[i]
            self._probing[i] = False
        self._gate_for_loop().failed(now)
        if was_up:
            log.warning(
                "replica %s of the model is down; its calls go to the others (%s)",
                self.urls[i],
                error,
                extra=CONSOLE,
            )

    def _answered(self, i: int, prompt_ids: Sequence[int], completion: Completion, prompt_sent: bool = True) -> None:
        """Count an answer of replica ``i``; ``prompt_sent``: false for the second and later
        samples of one request (its prompt, and its cache hits, counted once)."""
        if self._down_until[i] > 0:
            log.warning("replica %s of the model answers again", self.urls[i], extra=CONSOLE)
            self._down_until[i], self._probing[i] = 0.0, False
        now = time.monotonic()
        self._gate_for_loop().answered(now, now)
        s = self._replica_stats[i]
        s.calls += 1
        if prompt_sent:
            s.prompt_tokens += len(prompt_ids)
            s.cached_tokens += completion.cached_prompt_tokens or 0
        s.completion_tokens += len(completion.token_ids)

    def _gate_for_loop(self) -> OutageGate:
        loop = asyncio.get_running_loop()
        gate = self._gate
        if gate is None or self._gate_loop is not loop:
            cfg = self.replicas[0].http.config
            gate = self._gate = OutageGate(
                cfg.outage_wait_s,
                service="every replica of the model",
                url=", ".join(self.urls),
                probe_s=cfg.backoff_max_s,
                totals=self._outages,
            )
            self._gate_loop = loop
        return gate

    # ---- figures and lifecycle ----

    def stats(self) -> dict[str, Any]:
        """Per replica (:class:`ReplicaStats`, in ``replicas``), the fleet's totals, and
        the outages of the whole fleet waited out."""
        replicas = [s.as_dict() for s in self._replica_stats]
        prompt = sum(s.prompt_tokens for s in self._replica_stats)
        cached = sum(s.cached_tokens for s in self._replica_stats)
        return {
            "replicas": replicas,
            "calls": sum(s.calls for s in self._replica_stats),
            "prompt_tokens": prompt,
            "cached_tokens": cached,
            "cache_hit_ratio": round(cached / prompt, 4) if prompt else None,
            "failovers": sum(s.failovers for s in self._replica_stats),
            **self._outages.as_dict(),
        }

    async def aclose(self) -> None:
        """Close every replica's connections; one log line per replica that was used
        (what :meth:`stats` says of it), for the operator's log file."""
        for s in self._replica_stats:
            if s.calls or s.failovers:
                log.info(
                    "replica %s: %d calls, %d of %d prompt tokens from its prefix cache, %d tokens generated, "
                    "%d calls failed over",
                    s.url,
                    s.calls,
                    s.cached_tokens,
                    s.prompt_tokens,
                    s.completion_tokens,
                    s.failovers,
                )
        await asyncio.gather(*(r.aclose() for r in self.replicas))


def _check_replicas(replicas: Sequence[Any]) -> None:
    """``TypeError`` for a replica that is no HTTP policy (a URL: it failed later on
    ``'str' object has no attribute 'vocab_size'``), ``ValueError`` for one server listed
    twice (``http://gpu0:8000`` and ``http://gpu0:8000/v1``): it was taken for two replicas,
    with twice its share of the calls, counted and failed over as two."""
    seen: dict[tuple[str, str, int | None, str], str] = {}
    for r in replicas:
        if not isinstance(r, HttpPolicy):
            raise TypeError(
                f"FleetPolicy takes one HTTP policy per replica (OpenAICompatPolicy(url), SGLangPolicy(url), ...), "
                f"not {type(r).__name__} {r!r}: FleetPolicy([OpenAICompatPolicy(u) for u in urls])"
            )
        key = server_key(r.http.base_url)
        if key in seen:
            raise ValueError(f"FleetPolicy's replicas {seen[key]} and {r.http.base_url} are one server: list it once")
        seen[key] = r.http.base_url


def one_or_fleet(urls: Sequence[str], make: Callable[[str], HttpPolicy], router: Router | None = None) -> Policy:
    """The policy for ``urls`` (``make(url)`` builds one replica's): one replica's own
    policy, or a :class:`FleetPolicy` over several."""
    if len(urls) == 1:
        return make(urls[0])
    return FleetPolicy([make(u) for u in urls], router)
