"""Answers the client cannot read, repeated: a setting to fix, told at once.

SGLang's ``/v1/completions`` (before ``return_token_ids``) names its log-prob tokens by their text and returns no ids
(``model.kind = openai`` against it): every answer is malformed the same way. The client
retried each call ``max_retries`` times, the rollout was run again twice, and the wave
failed after 20-28 s as a "model service outage", the cause at the end of the line. Now
the first answers of a collection, all malformed with one cause, stop it with one line
that leads with the cause. With one call in flight that took 24-39 s (the first
request's retries and reruns ran out before a second request was sent); a probe beside
the first request makes it under a second. A server swapped for another shape after
good answers, with one call in flight, took 32-41 s and ended as a model-service outage
(one request is never the REQUESTS the later rule needs); probes beside it make that
about a second too. What must still be retried (an aborted
answer, a cut body, one request answered badly on every try, malformed answers at a
rate with one call in flight) is in test_foreign_servers.py, test_bad_response.py and
test_faults_model.py.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
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


def ids_counted_wrong(answer: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """An answer of another shape that names nothing of the server: one log-prob fewer
    than its tokens (counted by the rule, as any malformed answer)."""
    ch = answer["choices"][0]
    ch["logprobs"]["token_logprobs"] = ch["logprobs"]["token_logprobs"][:-1]
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


def test_a_probe_is_wanted_beside_one_request_and_never_again_beside_one_it_cleared():
    tally = Unreadable()
    assert not tally.malformed("not JSON", b"a") and not tally.take_probe(b"a")  # one answer: a passing fault
    assert not tally.malformed("not JSON", b"a") and tally.take_probe(b"a") == 1
    assert not tally.take_probe(b"a")  # one at a time
    tally.probing = False  # (what probe() does when its answer is in)
    assert not tally.malformed("not JSON", b"probe")  # the same answer to another request: evidence
    assert not tally.malformed("not JSON", b"a") and not tally.take_probe(b"a")  # two requests: none wanted
    assert tally.malformed("not JSON", b"a")  # the FIRST-th answer in a row
    busy = Unreadable()
    for _ in range(Unreadable.PROBE_AFTER):
        busy.malformed("not JSON", b"a")
    sent = 0
    for _ in range(9):  # probes that got no answer, each after one more answer to the request
        if busy.take_probe(b"a"):
            sent, busy.probing = sent + 1, False
        busy.malformed("not JSON", b"a")
    assert sent == Unreadable.PROBES
    # after good answers (a server swapped mid-run): REQUESTS - 1 probes beside each of
    # the request's answers, at most LATER between good answers, none beside another request
    read = Unreadable()
    read.answered()
    read.malformed("not JSON", b"a")
    assert not read.take_probe(b"a")
    read.malformed("not JSON", b"a")
    assert read.take_probe(b"a") == Unreadable.REQUESTS - 1
    read.probing = False
    read.malformed("not JSON", b"b")  # another request in flight
    assert not read.take_probe(b"b")
    sent = Unreadable.REQUESTS - 1
    for _ in range(20):
        read.probing = False
        sent += read.take_probe(b"a")
    assert sent == Unreadable.LATER
    read.answered()  # a good answer: probes again beside the next request answered badly twice
    read.malformed("not JSON", b"b")
    read.malformed("not JSON", b"b")
    assert read.take_probe(b"b") == Unreadable.REQUESTS - 1
    # a probe that read fine beside a request: its bad answers are its own, no more probes beside it
    read.answered(cleared=b"b")
    for _ in range(5):
        read.malformed("not JSON", b"b")
        assert not read.take_probe(b"b")
    # a request body the probe cannot be made from (a subclass's own): no probe, none in flight
    odd = Unreadable()
    odd.malformed("not JSON", b"a")
    odd.malformed("not JSON", b"a")
    assert odd.take_probe(b"a")
    bodies: list[bytes] = []

    async def send(body: bytes) -> None:
        bodies.append(body)

    assert not run(probe(odd, lambda body, k: body["prompt"], b'{"input": [1]}', send)) and not odd.probing
    assert not bodies


#: Short waits, no outage wait, no read timeout a slow machine could miss.
FAST = HttpConfig(backoff_s=0.01, backoff_max_s=0.05, max_retries=10, timeout_s=60, outage_wait_s=0)
PROMPT = list(range(40, 80))
#: An answer of another shape, without log-probs (a server, or a proxy, that does not give
#: them). (Log-prob tokens named by their text, an SGLang ``/v1/completions`` before
#: ``return_token_ids``, stop at the first answer: test_first_answer_of_a_server_without_ids_stops.)
FOREIGN = {"choices": [{"text": "ab", "finish_reason": "stop"}]}
#: That SGLang answer: log-prob tokens named by their text, no ids.
TEXTS = {
    "choices": [
        {"text": "ab", "finish_reason": "stop", "logprobs": {"tokens": ["a", "b"], "token_logprobs": [-0.1, -0.2]}}
    ]
}


def _sample(answer: Any, bodies: list[bytes], other: Any = None) -> None:
    """One call to a server that answers ``answer`` (``other``, where given, to every
    request but the first one's body)."""

    def reply(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":  # what the client asks of the server's weights: no call
            return httpx.Response(404)
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
    with pytest.raises(UnreadableAnswers, match=r"the choice has no 'logprobs.token_logprobs'"):
        _sample(FOREIGN, bodies)
    assert len(bodies) == Unreadable.FIRST and len(set(bodies)) == 2  # the request's 4 answers and the probe's
    probe = next(b for b in bodies if b != bodies[0])
    sent, beside = json.loads(bodies[0]), json.loads(probe)
    # the same settings, the request's first tokens, another seed
    assert beside["prompt"] == PROMPT[:PROBE_TOKENS] and beside["seed"] != sent["seed"]
    assert {k: v for k, v in beside.items() if k not in ("prompt", "seed")} == {
        k: v for k, v in sent.items() if k not in ("prompt", "seed")
    }


def test_first_answer_of_a_server_without_ids_stops():
    """An answer that shows the server cannot give the sampled ids (log-prob tokens named
    by their text: it ignored both id fields) is the same for every request: the first
    stops the collection, naming what is missing and the setting that gives it. It took
    :data:`Unreadable.FIRST` answers and a probe (5 requests)."""
    bodies: list[bytes] = []
    with pytest.raises(UnreadableAnswers) as e:
        _sample(TEXTS, bodies)
    line = str(e.value)
    assert line.startswith("the model service at http://127.0.0.1:1 cannot be recorded token-exactly: "), line
    assert "no token ids in the answer, only token texts" in line and "--return-tokens-as-token-ids" in line, line
    assert len(bodies) == 1


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


#: A readable answer of two tokens.
GOOD = {
    "choices": [
        {
            "text": "ab",
            "finish_reason": "stop",
            "token_ids": [1, 2],
            "logprobs": {"tokens": ["token_id:1", "token_id:2"], "token_logprobs": [-0.1, -0.2]},
        }
    ]
}


def _after_a_good_answer(answer: Callable[[int, bytes], dict[str, Any]], bodies: list[bytes]) -> Any:
    """A good answer to a first call, then a second call (its result) to a server that
    answers request ``i`` after it (0-based, probes included), body ``content``, with
    ``answer(i, content)``."""

    def reply(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":  # what the client asks of the server's weights: no call
            return httpx.Response(404)
        bodies.append(request.content)
        return httpx.Response(200, json=GOOD if len(bodies) == 1 else answer(len(bodies) - 2, request.content))

    policy = OpenAICompatPolicy("http://127.0.0.1:1", config=FAST, transport=httpx.MockTransport(reply))

    async def go() -> Any:
        try:
            await policy.sample(PROMPT, SamplingParams(max_tokens=2, seed=11))
            return await policy.sample(PROMPT, SamplingParams(max_tokens=2, seed=12))
        finally:
            await policy.aclose()

    return run(go())


def test_a_server_of_another_shape_after_good_answers_stops_one_call_after_its_probes():
    """Before, the call's 11 attempts ran out (a BadResponse; its rollout's reruns, the
    same request, then failed the wave as an outage): one request is never the REQUESTS
    different ones the later rule needs. Now probes beside it are, and the count reaches
    LATER within the call's first retries."""
    bodies: list[bytes] = []
    with pytest.raises(UnreadableAnswers, match="16 answers in a row to POST .* broke this rule\\)$"):
        _after_a_good_answer(lambda i, body: FOREIGN, bodies)
    after = bodies[1:]
    assert len(after) == Unreadable.LATER and len(set(after)) == Unreadable.REQUESTS
    request = sum(b == after[0] for b in after)
    assert request <= 1 + Unreadable.LATER // Unreadable.REQUESTS, request  # 6 of the call's 11 attempts


def test_after_good_answers_one_request_answered_badly_is_retried_as_before():
    """One request answered malformed on every try (a seeded sample that breaks a rule
    the same way each time) while others read fine: the probe beside it reads fine, so
    the call runs its retries out (a bad response of that rollout, run again), with one
    probe and no more; and a burst of malformed answers to every request, shorter than
    LATER, passes: the call is answered."""
    bodies: list[bytes] = []
    with pytest.raises(BadResponse, match="failed after 11 attempt"):
        _after_a_good_answer(lambda i, body: FOREIGN if body == bodies[1] else GOOD, bodies)
    assert len(bodies[1:]) == FAST.max_retries + 1 + 1 and len(set(bodies[1:])) == 2
    bodies.clear()
    got = _after_a_good_answer(lambda i, body: FOREIGN if i < Unreadable.LATER - 1 else GOOD, bodies)
    assert got.token_ids == (1, 2) and len(bodies[1:]) >= Unreadable.LATER


@pytest.mark.integration
@pytest.mark.parametrize("concurrency", [None, 1])
def test_a_server_of_another_shape_stops_the_collection_at_once_naming_the_cause(
    local_model_server, tmp_path, concurrency, backoff_waits
):
    """Many calls in flight, or one (``max_concurrency = 1``: 24-39 s and 34 requests
    before the probe, 0.27-0.43 s and 5 after, at a load average of 0.2-4.9 on 2 cores;
    an answer naming log-prob tokens by their text, which says the server gives no ids,
    now stops at the first answer: :class:`~focus.backends.http.Unservable`)."""
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
    assert line.startswith(f"the model service at {proxy.url} cannot be recorded token-exactly: no token ids"), line
    assert "--return-tokens-as-token-ids" in line and "\n" not in line
    assert exit_code(stopped.value) == 2
    assert ("evidence", 0) not in CheckpointStore(str(tmp_path)).list("shape")
    # the waits the clients asked for between attempts, not wall time (0.1-0.4 s now, 30 s
    # with one call in flight before; a loaded machine is slow): a few quick backoffs
    assert sum(backoff_waits) < 5, (len(backoff_waits), sum(backoff_waits))
    if concurrency == 1:  # the first answer: not 3 runs of 11 attempts and another rollout's, nor the rule's 5
        assert proxy.requests == 1, proxy.requests
    print(f"stopped after {took:.2f} s, {proxy.requests} requests")


@pytest.mark.integration
def test_a_server_swapped_mid_run_for_another_shape_stops_at_once_with_one_call_in_flight(
    local_model_server, tmp_path, backoff_waits
):
    """The tiny model answers the evidence and its scoring, then the proxy in front of it
    answers in another shape (one log-prob fewer than its tokens: a server swapped for
    another kind that does not say so; SGLang's ``/v1/completions`` shape says it gives
    no ids, and stops at its first answer), with one call in flight. Before, the first continuation request's retries and its
    rollout's reruns ran out (one request is never the REQUESTS the later rule needs)
    and the wave failed as a ModelServiceOutage after 32-41 s; now probes beside that
    request are the other requests, and the stop is UnreadableAnswers in about a second."""
    from fixtures.journal import AfterStep, run_collect

    from focus.journal import EVIDENCE_SCORES
    from storage import CheckpointStore
    from tasks.config import load_config

    with FaultProxy(local_model_server.url) as proxy:
        cfg = load_config(
            overrides={
                "collection_id": "swapped",
                "model.kind": "openai",
                "model.url": proxy.url,
                "model.http": {"outage_wait_s": 0},
                "env.n_tasks": 2,
                "agent.sampling.max_tokens": 8,
                "search.phases": [
                    {"name": "evidence", "rollouts_per_task": 2},
                    {"name": "continue", "transitions": 12, "wave_size": 2, "max_depth": 4},
                ],
                "execution.kind": "local",
                "execution.max_concurrency": 1,
                "storage.root": str(tmp_path),
                "progress": False,
            },
            environ={},
        )
        marks: dict[str, float] = {}
        seen: list[tuple[int, int]] = []  # (seed, prompt length) of each request answered in the other shape

        def other_shape(answer: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
            seen.append((request["seed"], len(request["prompt"])))
            return ids_counted_wrong(answer, request)

        def swap() -> None:
            marks["swapped"] = time.monotonic()
            proxy.reshape = other_shape

        with pytest.raises(Exception) as stopped:
            run_collect(cfg, AfterStep(cfg, EVIDENCE_SCORES, swap))
        took = time.monotonic() - marks["swapped"]
    line = one_line(stopped.value)
    print(f"stopped {took:.2f} s after the swap as {type(stopped.value).__name__}, {len(seen)} requests: {line[:160]}")
    assert isinstance(stopped.value, UnreadableAnswers), line
    assert re.match(
        r"the model service's answers cannot be read: MalformedResponse: \d+ tokens but \d+ log-probs", line
    )
    assert "none readable yet" not in line and "\n" not in line and exit_code(stopped.value) == 2
    saved = CheckpointStore(str(tmp_path)).list("swapped")
    assert ("evidence", 0) in saved and ("1.continue", 0) not in saved  # the finished steps are kept
    # the waits the clients asked for between attempts, not wall time (about a second now,
    # 32-41 s before, mostly backoffs; a loaded machine is slow): a few quick backoffs
    assert sum(backoff_waits) < 5, (len(backoff_waits), sum(backoff_waits))
    # the request's answers and its probes' (two, each its own seed and the prompt's first tokens), nothing more
    assert len(seen) == Unreadable.LATER and len(set(seen)) == Unreadable.REQUESTS, seen
    probes = [r for r in seen if r != seen[0]]
    assert {n for _, n in probes} == {PROBE_TOKENS} and len(probes) >= Unreadable.LATER // 2, seen
