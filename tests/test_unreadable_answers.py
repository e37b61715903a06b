"""Answers the client cannot read, repeated: a setting to fix, told at once.

SGLang's ``/v1/completions`` names its log-prob tokens by their text and returns no ids
(``model.kind = openai`` against it): every answer is malformed the same way. The client
retried each call ``max_retries`` times, the rollout was run again twice, and the wave
failed after 20-28 s as a "model service outage", the cause at the end of the line. Now
the first answers of a collection, all malformed with one cause, stop it with one line
that leads with the cause. With one call in flight that took 24-39 s (the first
request's retries and reruns ran out before a second request was sent); a probe beside
the first request makes it under a second. What must still be retried (an aborted
answer, a cut body, one request answered badly on every try, malformed answers at a
rate with one call in flight) is in test_foreign_servers.py, test_bad_response.py and
test_faults_model.py.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from flows.errors import exit_code, one_line
from focus.backends import HttpConfig, OpenAICompatPolicy
from focus.backends.unreadable import PROBE_TOKENS, Unreadable, cause_key, probe
from focus.policy import BadResponse, SamplingParams, UnreadableAnswers
from focus.testing import run
from focus.testing.faults import FaultProxy

pytestmark = pytest.mark.timeout(120)


def sglang_v1(answer: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """SGLang's OpenAI completions: token texts in ``logprobs.tokens``, no ``token_ids``."""
    ch = answer["choices"][0]
    ids = ch.pop("token_ids")
    ch["logprobs"]["tokens"] = [chr(97 + t % 26) for t in ids]
    return answer


def test_one_cause_in_a_row_stops_only_where_it_cannot_pass():
    assert cause_key("log-prob token 'a' is not of the form 'token_id:<id>'") == cause_key(
        "log-prob token 'q' is not of the form 'token_id:<id>'"
    )
    assert cause_key("3 tokens but 2 log-probs") == cause_key("7 tokens but 6 log-probs")
    fresh = Unreadable()
    # the first request of a collection answered badly on every try: its rollout's bad response
    assert not any(fresh.malformed("finish_reason 'abort' after 1 token", b"a") for _ in range(3 * Unreadable.FIRST))
    fresh = Unreadable()
    assert not any(fresh.malformed("finish_reason 'abort' after 1 token", b"a") for _ in range(Unreadable.FIRST - 1))
    assert fresh.malformed("finish_reason 'abort' after 3 token", b"b")  # the FIRST-th, a second request
    later = Unreadable()
    later.answered()
    # one request answered badly on every try (its seeded sample repeats): a bad response, not a format
    assert not any(later.malformed("2 tokens but 1 log-probs", b"same") for _ in range(100))
    later.answered()
    for i in range(Unreadable.LATER - 1):
        assert not later.malformed("2 tokens but 1 log-probs", b"r%d" % (i % 3))
    assert later.malformed("2 tokens but 1 log-probs", b"r0")
    # another cause, or a good answer, between: counted afresh
    mixed = Unreadable()
    for i in range(20):
        assert not mixed.malformed("not JSON" if i % 2 else "no 'choices' in the answer", b"x")
    mixed.answered()
    assert not mixed.malformed("no 'choices' in the answer", b"x")


def test_a_probe_is_wanted_only_before_anything_was_read_and_for_one_request():
    tally = Unreadable()
    assert not tally.malformed("not JSON", b"a") and not tally.take_probe()  # one answer: a passing fault
    assert not tally.malformed("not JSON", b"a") and tally.take_probe()
    assert not tally.take_probe()  # one at a time
    tally.probing = False  # (what probe() does when its answer is in)
    assert not tally.malformed("not JSON", b"probe")  # the same answer to another request: evidence
    assert not tally.malformed("not JSON", b"a") and not tally.take_probe()  # two requests: none wanted
    assert tally.malformed("not JSON", b"a")  # the FIRST-th answer in a row
    busy = Unreadable()
    for _ in range(Unreadable.PROBE_AFTER):
        busy.malformed("not JSON", b"a")
    sent = 0
    for _ in range(9):  # probes that got no answer, each after one more answer to the request
        if busy.take_probe():
            sent, busy.probing = sent + 1, False
        busy.malformed("not JSON", b"a")
    assert sent == Unreadable.PROBES
    read = Unreadable()
    read.answered()
    assert not any(read.malformed("not JSON", b"a") or read.take_probe() for _ in range(10))
    # a request body the probe cannot be made from (a subclass's own): no probe, none in flight
    odd = Unreadable()
    odd.malformed("not JSON", b"a")
    odd.malformed("not JSON", b"a")
    assert odd.take_probe()
    sent: list[bytes] = []

    async def send(body: bytes) -> None:
        sent.append(body)

    assert not run(probe(odd, lambda body: body["prompt"], b'{"input": [1]}', send)) and not odd.probing and not sent


#: Short waits, no outage wait, no read timeout a slow machine could miss.
FAST = HttpConfig(backoff_s=0.01, backoff_max_s=0.05, max_retries=10, timeout_s=60, outage_wait_s=0)
PROMPT = list(range(40, 80))
#: An SGLang ``/v1/completions`` answer: log-prob tokens named by their text, no ids.
FOREIGN = {
    "choices": [
        {"text": "ab", "finish_reason": "stop", "logprobs": {"tokens": ["a", "b"], "token_logprobs": [-0.1, -0.2]}}
    ]
}


def _sample(answer: Any, bodies: list[bytes], other: Any = None) -> None:
    """One call to a server that answers ``answer`` (``other``, where given, to every
    request but the first one's body)."""

    def reply(request: httpx.Request) -> httpx.Response:
        bodies.append(request.content)
        status, data = (200, answer) if other is None or request.content == bodies[0] else other
        return httpx.Response(status, json=data)

    policy = OpenAICompatPolicy("http://127.0.0.1:1", config=FAST, transport=httpx.MockTransport(reply))

    async def go() -> None:
        try:
            await policy.sample(PROMPT, SamplingParams(max_tokens=2, seed=11))
        finally:
            await policy.aclose()

    run(go())


def test_one_call_to_a_server_of_another_shape_stops_after_a_probe_not_its_retries():
    """Before, this call's 11 attempts ran out (a BadResponse) and only a second request,
    another rollout's, was evidence; now a probe beside it is."""
    bodies: list[bytes] = []
    with pytest.raises(UnreadableAnswers, match="log-prob token 'a' is not of the form"):
        _sample(FOREIGN, bodies)
    assert len(bodies) == Unreadable.FIRST and len(set(bodies)) == 2  # the request's 4 answers and the probe's
    probe = next(b for b in bodies if b != bodies[0])
    sent, beside = json.loads(bodies[0]), json.loads(probe)
    # the same settings, the request's first tokens, another seed
    assert beside["prompt"] == PROMPT[:PROBE_TOKENS] and beside["seed"] != sent["seed"]
    assert {k: v for k, v in beside.items() if k not in ("prompt", "seed")} == {
        k: v for k, v in sent.items() if k not in ("prompt", "seed")
    }


@pytest.mark.parametrize("other", [(503, {"error": "busy"}), (400, {"error": "no"}), (200, {"choices": "garbled"})])
def test_a_probe_that_tells_nothing_leaves_the_call_to_its_retries(other):
    """A probe that gets no answer, is refused, or gets a malformed answer of another
    cause is no evidence: the call runs its retries out as before (a bad response of
    that rollout, run again), after at most PROBES probes."""
    bodies: list[bytes] = []
    with pytest.raises(BadResponse, match="failed after 11 attempt"):
        _sample(FOREIGN, bodies, other)
    probes = len(bodies) - (FAST.max_retries + 1)
    assert 1 <= probes <= Unreadable.PROBES and len(set(bodies)) == 2


@pytest.mark.integration
@pytest.mark.parametrize("concurrency", [None, 1])
def test_a_server_of_another_shape_stops_the_collection_at_once_naming_the_cause(
    local_model_server, tmp_path, concurrency
):
    """Many calls in flight, or one (``max_concurrency = 1``: 24-39 s and 34 requests
    before the probe, 0.27-0.43 s and 5 after, at a load average of 0.2-4.9 on 2 cores)."""
    from fixtures.journal import run_collect

    from storage import CheckpointStore
    from tasks.config import load_config

    with FaultProxy(local_model_server.url, reshape=sglang_v1) as proxy:
        cfg = load_config(
            overrides={
                "collection_id": "shape",
                "model.kind": "openai",
                "model.url": proxy.url,
                "model.http": {"outage_wait_s": 0},  # the default retries otherwise
                "env.n_tasks": 4,
                "agent.sampling.max_tokens": 8,
                "search.phases": [{"name": "evidence", "rollouts_per_task": 3}],
                "execution.kind": "local",
                **({} if concurrency is None else {"execution.max_concurrency": concurrency}),
                "storage.root": str(tmp_path),
                "progress": False,
            },
            environ={},
        )
        t0 = time.monotonic()
        with pytest.raises(UnreadableAnswers) as stopped:
            run_collect(cfg)
        took = time.monotonic() - t0
    line = one_line(stopped.value)
    assert line.startswith("the model service's answers cannot be read: MalformedResponse: log-prob token "), line
    assert "is model.kind right" in line and "none readable yet" in line and "\n" not in line
    assert exit_code(stopped.value) == 2
    assert ("evidence", 0) not in CheckpointStore(str(tmp_path)).list("shape")
    # a bound well above the 0.1-0.4 s it takes, well below the 30 s it took with one call in flight
    assert took < 10, took
    if concurrency == 1:  # the request's 4 answers and the probe's, not 3 runs of 11 attempts and another rollout's
        assert proxy.requests < 2 * Unreadable.FIRST, proxy.requests
    print(f"stopped after {took:.2f} s, {proxy.requests} requests")
