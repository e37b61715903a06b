"""The library used the way RL code runs it: from a synchronous trainer that calls
``asyncio.run`` once per iteration, from several threads each with its own loop, and
in a notebook (a loop that is already running): nothing leaks from one loop to the next."""

from __future__ import annotations

import asyncio
import gc
import threading
import warnings

import pytest
from test_collector import synthetic

from focus.backends import HttpConfig
from focus.backends.http import HttpClient
from focus.synthetic import SyntheticPolicy
from focus.testing import run


def _resource_warnings(body) -> list[str]:
    """The ResourceWarnings (unclosed sessions, connectors, sockets) raised while ``body``
    runs and at the garbage collection after it."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        body()
        gc.collect()
    return [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]


@pytest.mark.integration  # starts a server
def test_a_client_used_from_one_asyncio_run_per_iteration_closes_its_connections_each_time(scripted):
    # A synchronous trainer calls asyncio.run(collector.collect(...)) every iteration with
    # the same policy and never closes it: each run's aiohttp session was left open on a
    # closed loop, one "Unclosed client session" (and its sockets) per iteration.
    scripted.answers[:] = [(200, {}, {"ok": 1})]
    client = HttpClient(scripted.url, HttpConfig())

    def iterations() -> None:
        for _ in range(3):
            assert asyncio.run(client.request("POST", "/x", {}, lambda d: d)) == {"ok": 1}

    assert _resource_warnings(iterations) == []
    assert len(scripted.arrivals) == 3


@pytest.mark.integration  # starts a server
def test_a_client_shared_by_two_threads_closes_each_loops_connections(scripted):
    scripted.answers[:] = [(200, {}, {"ok": 1})]
    client = HttpClient(scripted.url, HttpConfig())
    answers: list[object] = []

    def thread() -> None:
        async def calls() -> list[object]:
            return list(await asyncio.gather(*(client.request("POST", "/x", {}, lambda d: d) for _ in range(8))))

        answers.extend(asyncio.run(calls()))

    def both() -> None:
        threads = [threading.Thread(target=thread) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    assert _resource_warnings(both) == []
    assert answers == [{"ok": 1}] * 16


@pytest.mark.integration  # starts the embedded model server
def test_an_interrupt_while_the_embedded_server_starts_stops_it(monkeypatch):
    # A notebook's interrupt during LocalModelServer().start() left the server running:
    # nobody held the object, so it ran until the kernel exited, one more per try.
    from focus.backends import LocalModelServer

    started = []

    def interrupted(self, deadline):  # the interrupt lands while start() waits for /health
        started.append((self.proc, self._tmp))
        raise KeyboardInterrupt

    monkeypatch.setattr(LocalModelServer, "_wait_healthy", interrupted)
    server = LocalModelServer()
    with pytest.raises(KeyboardInterrupt):
        server.start()
    [(proc, folder)] = started
    assert proc.poll() is not None and not folder.exists()
    assert server.proc is None


def test_preparing_a_search_that_was_not_awaited_says_so():
    # In a notebook ``collector.prepare(collector.search(tasks))`` (no await) failed with
    # "'coroutine' object is not iterable", then warned that the search was never awaited.
    col, tasks, _ = synthetic()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "coroutine ... was never awaited" either
        with pytest.raises(TypeError, match=r"got a coroutine: `await collector.search\(tasks\)` first"):
            col.prepare(col.search(tasks))
        gc.collect()
    with pytest.raises(TypeError, match="takes the SearchState or the trees .* got a list of int"):
        col.prepare([1, 2])
    assert col.prepare(run(col.search(tasks))).summary()["actor_rows"] > 0


def test_cancelling_a_search_cancels_the_wave_it_waits_for():
    # An interrupted notebook cell, or asyncio.wait_for around a collection, cancels the
    # search; the wave it was waiting for kept running on the loop (its rollouts still
    # calling the model service) until it finished by itself.
    col, tasks, mdps = synthetic()
    calls: list[int] = []
    cancelled_at: list[int] = []

    class Slow(SyntheticPolicy):
        async def sample(self, prompt_ids, params):
            calls.append(1)
            if len(calls) == 6:
                search.cancel()  # while the evidence wave runs
            await asyncio.sleep(0.01)
            return await super().sample(prompt_ids, params)

    col.agent.policy = Slow(mdps)

    async def main() -> list[str]:
        nonlocal search
        search = asyncio.ensure_future(col.search(tasks))
        with pytest.raises(asyncio.CancelledError):
            await search
        cancelled_at.append(len(calls))
        await asyncio.sleep(0.2)  # time for 20 more calls per rollout still running
        return [t.get_coro().__qualname__ for t in asyncio.all_tasks() if t is not asyncio.current_task()]

    search: asyncio.Future | None = None
    assert run(main()) == []
    assert len(calls) == cancelled_at[0]  # no model call after the search was cancelled
