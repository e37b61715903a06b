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

from focus.agent import Agent
from focus.backends import HttpConfig, OpenAICompatPolicy
from focus.collector import Collector
from focus.critic import ConstantCritic, HttpCritic
from focus.execution import Execution
from focus.local_limits import LocalResourceError, local_errno
from focus.policy import SamplingParams
from focus.priority import Phase, Selective
from focus.testing import ScriptedPolicy, run
from focus.testing.simserver import SimConfig, SimServerProcess
from focus.toy import ReachTarget, reach_target_tasks, toy_format

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
        if request.method == "GET":  # what the client asks of the server's weights: no call
            return httpx.Response(404)
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


class OutOfFiles(ScriptedPolicy):
    """A custom policy whose client meets ``Too many open files`` after ``ok`` calls."""

    def __init__(self, ok: int) -> None:
        super().__init__(["+1"], toy_format().codec)
        self.ok = ok

    async def sample(self, prompt_ids, params):  # type: ignore[no-untyped-def]
        if len(self.prompts) >= self.ok:
            raise OSError(errno.EMFILE, "Too many open files")
        return await super().sample(prompt_ids, params)


def test_a_wave_stops_at_the_first_model_call_this_machine_cannot_make():
    """A custom policy's own ``OSError(EMFILE)`` failed its rollout only (``error: OSError``),
    and every rollout after it the same way: the wave and the collection went on, the
    batch made of failures. The agent and the wave let it through as the one line."""
    policy = OutOfFiles(ok=5)
    agent = Agent(policy, ReachTarget(), toy_format(), max_steps=4, sampling=SamplingParams(max_tokens=8))
    collector = Collector(
        agent,
        search=Selective(phases=[Phase("evidence", rollouts_per_task=2)]),
        critic=ConstantCritic(0.5),
        execution=Execution(max_concurrency=4),
        collection_id="local",
        seed=3,
    )
    with pytest.raises(LocalResourceError, match=r"too many open files in OutOfFiles\.sample: this process") as err:
        run(collector.search(reach_target_tasks(8, seed=5)))
    assert err.value.errno == errno.EMFILE and "execution.max_concurrency" in str(err.value)
    assert len(policy.prompts) == 5  # no rollout went on past it


def test_the_object_stores_retries_stop_at_a_local_error():
    """aiobotocore's ``ClientConnectorError`` is retried as a store that does not answer
    (8 attempts, about 14 s), then named "storage unreachable"; carrying EMFILE or
    EADDRNOTAVAIL it is this machine's, and stops at the first attempt naming that."""
    import aiohttp

    from storage.retry import Retry, retrying

    attempts = []

    def op() -> None:
        attempts.append(1)
        raise aiohttp.ClientConnectorError(None, OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address"))  # type: ignore[arg-type]

    with pytest.raises(LocalResourceError, match=r"no local port left \(to read s3://b/k\).*ip_local_port_range"):
        retrying(op, "read s3://b/k", Retry(), sleep=lambda s: None)
    assert len(attempts) == 1


def test_a_dask_scheduler_this_machine_cannot_connect_to_names_the_machine(monkeypatch):
    import distributed.comm

    from focus.dask_checks import answers

    async def connect(address, timeout=None, **kwargs):  # type: ignore[no-untyped-def]
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(distributed.comm, "connect", connect)
    with pytest.raises(LocalResourceError, match="too many open files connecting to the Dask scheduler at 'tcp://"):
        answers("tcp://127.0.0.1:8786", 1.0)


def test_the_pipelines_line_is_the_errors_own():
    from flows.errors import exit_code, one_line

    error = LocalResourceError("too many open files connecting to the model service at http://m: ...", errno.EMFILE)
    assert one_line(error) == str(error) and exit_code(error) == 1
    ports = one_line(OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address"))
    assert ports.startswith("no local port left (EADDRNOTAVAIL") and "net.ipv4.ip_local_port_range" in ports
    try:
        try:
            raise OSError(errno.EMFILE, "Too many open files")
        except OSError as e:
            raise RuntimeError("Failed to reach API at http://127.0.0.1:4200/api/") from e
    except RuntimeError as prefect:  # was "the Prefect server ... did not answer"
        line = one_line(prefect)
    assert line.startswith("too many open files reaching the Prefect API at http://127.0.0.1:4200/api"), line
