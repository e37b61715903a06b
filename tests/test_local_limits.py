"""A connection this machine cannot open is no outage of the service (focus/local_limits.py).

``Too many open files`` (EMFILE), no ephemeral port left (EADDRNOTAVAIL) and no socket
memory (ENOMEM, ENOBUFS) reach a client as connection errors. The model client retried
them and waited at the outage gate as for a server that refuses, and a collection under
``ulimit -n 48`` with 64 rollouts in flight ended 0 without naming the limit. Here each
one stops the call at once with :class:`LocalResourceError`, after one attempt, naming
the cause and what to change; the agent and the wave let it through.
"""

from __future__ import annotations

import asyncio
import errno
import os
import resource

import httpx
import pytest

from focus.backends import HttpConfig, OpenAICompatPolicy
from focus.critic import HttpCritic
from focus.local_limits import LocalResourceError, local_errno
from focus.policy import SamplingParams
from focus.testing import run
from focus.testing.simserver import SimConfig, SimServerProcess

PROMPT = [256, 10, 11, 12]
#: Quick retries and a long outage window: a local error taken for an outage waits it out.
HTTP = {"max_retries": 3, "backoff_s": 0.005, "backoff_max_s": 0.02, "timeout_s": 5.0, "outage_wait_s": 30.0}


def answer() -> dict:
    ids = [5, 6]
    logprobs = {"tokens": [f"token_id:{t}" for t in ids], "token_logprobs": [-0.5] * len(ids)}
    return {"model": "m", "choices": [{"token_ids": ids, "finish_reason": "length", "logprobs": logprobs}]}


class Machine:
    """A mock transport whose connections after the first ``ok`` fail with ``err`` the
    way httpx raises them: ``ConnectError`` from the socket's ``OSError``."""

    def __init__(self, err: int, ok: int = 1) -> None:
        self.err, self.ok, self.requests = err, ok, 0

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        if self.requests > self.ok:
            try:
                raise OSError(self.err, os.strerror(self.err))
            except OSError as e:
                raise httpx.ConnectError(str(e), request=request) from e
        if request.url.path.endswith("/score"):
            return httpx.Response(200, json={"values": [1.0]})
        return httpx.Response(200, json=answer())


@pytest.mark.parametrize(
    ("err", "says"),
    [
        (errno.EMFILE, ["too many open files connecting to the model service at http://model.invalid", "ulimit -n"]),
        (errno.ENFILE, ["the system's limit on open files is reached (ENFILE"]),
        (errno.EADDRNOTAVAIL, ["no local port left", "net.ipv4.ip_local_port_range", "fewer connections"]),
        (errno.ENOBUFS, ["out of memory for sockets connecting to the model service", "(ENOBUFS)"]),
    ],
)
def test_a_local_error_on_a_model_connection_stops_the_call_at_once_naming_it(err, says):
    machine = Machine(err)
    policy = OpenAICompatPolicy(
        "http://model.invalid", config=HttpConfig(**HTTP), transport=httpx.MockTransport(machine.handler)
    )
    params = SamplingParams(max_tokens=2, seed=0)

    async def go() -> BaseException:
        await policy.sample(PROMPT, params)  # the service answers
        try:
            async with asyncio.timeout(10):
                await policy.sample(PROMPT, params.with_seed(1))
        except LocalResourceError as e:
            return e
        raise AssertionError("no LocalResourceError")

    error = run(go())
    assert error.errno == err and all(s in str(error) for s in says), str(error)
    assert "execution.max_concurrency" in str(error) and str(error).endswith("to resume")
    assert machine.requests == 2  # one attempt: never retried
    stats = policy.stats()
    assert stats["retries"] == {} and stats["outages"] == 0, stats


def test_a_local_error_on_a_critic_connection_stops_its_call_as_itself():
    machine = Machine(errno.EMFILE, ok=0)
    critic = HttpCritic(
        "http://critic.invalid/score", config=HttpConfig(**HTTP), transport=httpx.MockTransport(machine.handler)
    )
    with pytest.raises(LocalResourceError, match="too many open files connecting to the critic at http://critic"):
        run(critic.predict([[1, 2, 3]]))
    assert machine.requests == 1


@pytest.mark.integration
def test_emfile_from_aiohttps_own_connect_is_read_as_this_machines():
    """The real thing over aiohttp: a second call in flight needs a second connection, and
    the soft limit on open files is set to the lowest free descriptor, so its socket
    cannot be made. aiohttp raises ``ClientConnectorError`` carrying errno 24, which was a
    ``connection`` failure retried and then waited for as an outage."""
    with SimServerProcess(SimConfig(slots=4, latency_s=0.3, completion_tokens=2)) as server:
        policy = OpenAICompatPolicy(server.url, vocab_size=300, config=HttpConfig(**HTTP))
        params = SamplingParams(max_tokens=2, seed=0)
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)

        async def go() -> list:
            await policy.sample(PROMPT, params)  # one pooled connection, answered
            first = asyncio.ensure_future(policy.sample(PROMPT, params.with_seed(1)))  # takes it
            await asyncio.sleep(0.05)
            free = os.open(os.devnull, os.O_RDONLY)
            os.close(free)
            resource.setrlimit(resource.RLIMIT_NOFILE, (free, hard))  # no descriptor can be opened now
            try:
                async with asyncio.timeout(20):
                    return await asyncio.gather(
                        policy.sample(PROMPT, params.with_seed(2)), first, return_exceptions=True
                    )
            finally:
                resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

        second, first = run(go())
    assert isinstance(second, LocalResourceError), repr(second)
    assert (
        second.errno == errno.EMFILE
        and f"too many open files connecting to the model service at {server.url}" in str(second)
    )
    assert not isinstance(first, BaseException), repr(first)  # the call in flight on its connection is answered
    assert policy.stats()["outages"] == 0


def test_the_errno_is_found_along_the_chain_and_not_elsewhere():
    import aiohttp

    cut = aiohttp.ClientConnectorError(None, OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address"))  # type: ignore[arg-type]
    assert local_errno(cut) == errno.EADDRNOTAVAIL
    try:
        try:
            raise OSError(errno.ENOMEM, "Cannot allocate memory")
        except OSError as e:
            raise RuntimeError("wrapped") from e
    except RuntimeError as wrapped:
        assert local_errno(wrapped) == errno.ENOMEM
    assert local_errno(OSError("[Errno 24] Too many open files")) == errno.EMFILE
    assert local_errno(ConnectionRefusedError(errno.ECONNREFUSED, "refused")) is None
    assert local_errno(OSError(errno.EACCES, "denied")) is None
