"""Policy backends against the real loopback server: conformance, exact tokens, retries."""

from __future__ import annotations

import asyncio
import email.utils
import json
import math
import pickle
import random
import socket
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np
import pytest

from focus.agent import Agent
from focus.backends import HttpConfig, OpenAICompatPolicy, SGLangPolicy, TinkerPolicy
from focus.backends.http import HttpClient, MalformedResponse
from focus.backends.openai_compat import parse_completion
from focus.backends.retry import CallRecord, ClientStats, HedgeTimer, RetryPolicy, parse_retry_after, quantile
from focus.backends.sglang import parse_generate
from focus.branching import EveryDecision
from focus.context import Segments
from focus.env import Message, Task
from focus.format import ByteCodec, PolicyFormat, XmlToolCallParser
from focus.policy import PolicyError, SamplingParams
from focus.testing import PolicyConformance, run
from focus.tools import Tool, ToolEnv
from focus.toy import opening_text

if TYPE_CHECKING:
    from tinker import types as ttypes

CODEC = ByteCodec()
PROMPT = CODEC.render([Message("user", opening_text(9))])
#: Short retries; a service that answers nobody fails the call within them (not waited for).
FAST = HttpConfig(backoff_s=0.01, backoff_max_s=0.05, max_retries=3, timeout_s=10, outage_wait_s=0)


def fault(server, **spec) -> None:
    assert httpx.post(f"{server.url}/debug/faults", json=spec).status_code == 200


def recorded(server) -> list[tuple[int, ...]]:
    return [tuple(r["prompt_ids"]) for r in httpx.get(f"{server.url}/debug/requests").json()["requests"]]


def clear_recorded(server) -> None:
    httpx.delete(f"{server.url}/debug/requests")


async def sample_once(policy, prompt=PROMPT, **kw):
    try:
        return await policy.sample(prompt, SamplingParams(**{"max_tokens": 8, "seed": 1, **kw}))
    finally:
        await policy.aclose()


class TestOpenAICompatConformance(PolicyConformance):
    @pytest.fixture(autouse=True)
    def _server(self, local_model_server):
        self.server = local_model_server

    def make_policy(self):
        return OpenAICompatPolicy(self.server.url, vocab_size=CODEC.vocab_size, config=FAST)


class TestSGLangConformance(PolicyConformance):
    @pytest.fixture(autouse=True)
    def _server(self, local_model_server):
        self.server = local_model_server

    def make_policy(self):
        return SGLangPolicy(self.server.url, vocab_size=CODEC.vocab_size, config=FAST)


@pytest.mark.parametrize("cls", [OpenAICompatPolicy, SGLangPolicy])
def test_seeded_samples_reproduce_and_report_version_and_cache(local_model_server, cls):
    a = run(sample_once(cls(local_model_server.url, config=FAST), max_tokens=12, stop_token_ids=(ByteCodec.EOT,)))
    policy = cls(local_model_server.url, config=FAST)
    b = run(sample_once(policy, max_tokens=12, stop_token_ids=(ByteCodec.EOT,)))
    assert a.token_ids == b.token_ids and a.logprobs == pytest.approx(b.logprobs)
    assert b.cached_prompt_tokens == len(PROMPT)  # the second identical prompt hit the prefix cache
    assert policy.policy_version == local_model_server.policy_version
    others = {run(sample_once(cls(local_model_server.url, config=FAST), seed=s)).token_ids for s in range(2, 8)}
    assert len(others) > 1


def test_both_http_backends_sample_identically(local_model_server):
    a = run(sample_once(OpenAICompatPolicy(local_model_server.url), temperature=0.9, top_p=0.8, max_tokens=10))
    b = run(sample_once(SGLangPolicy(local_model_server.url), temperature=0.9, top_p=0.8, max_tokens=10))
    assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
    assert a.logprobs == pytest.approx(b.logprobs, abs=1e-9)


@pytest.mark.parametrize("cls", [OpenAICompatPolicy, SGLangPolicy])
@pytest.mark.parametrize(
    "spec,cause",
    [
        ({"status": 500}, "server error"),
        ({"status": 429}, "server error"),
        ({"malformed": True}, "malformed response"),
        ({"nan_logprobs": True}, "malformed response"),
        ({"delay_s": 2.5}, "timeout"),
    ],
)
def test_transient_failures_are_retried(local_model_server, cls, spec, cause):
    # only the delayed case gets a short read timeout, so a slow machine does not add retries
    timeout = 1.0 if "delay_s" in spec else FAST.timeout_s
    policy = cls(local_model_server.url, config=FAST.model_copy(update={"timeout_s": timeout}))
    fault(local_model_server, count=2, **spec)
    c = run(sample_once(policy))
    assert len(c.token_ids) > 0 and all(math.isfinite(x) for x in c.logprobs)
    assert policy.http.retries == {cause: 2}
    stats = policy.stats()
    assert (stats["calls"], stats["attempts"], stats["failed_calls"]) == (1, 3, {})
    assert set(stats["lost_s"]) == {cause} and stats["lost_s"][cause] > 0
    record = c.meta["http"]  # the same figures, per call, for the engine to total
    assert record.attempts == 3 and [k for k, _ in record.errors] == [cause, cause] and record.failed is None
    if "delay_s" in spec:  # each timed-out attempt lost at least its timeout
        assert stats["lost_s"]["timeout"] >= 2 * timeout


@pytest.mark.parametrize("cls", [OpenAICompatPolicy, SGLangPolicy])
def test_persistent_failure_raises_policy_error_naming_url_status_and_cause(local_model_server, cls):
    policy = cls(local_model_server.url, config=FAST.model_copy(update={"max_retries": 2}))
    fault(local_model_server, count=3, status=503)
    with pytest.raises(PolicyError) as e:
        run(sample_once(policy))
    msg = str(e.value)
    assert policy.url in msg and "3 attempt(s)" in msg and "status 503" in msg and "injected fault" in msg
    stats = policy.stats()
    assert stats["retries"] == {"server error": 2} and stats["failed_calls"] == {"server error": 1}


def test_client_errors_are_not_retried(local_model_server):
    policy = OpenAICompatPolicy(local_model_server.url, config=FAST)  # no vocab_size: the server must refuse
    with pytest.raises(PolicyError, match="rejected with status 400.*token id 999"):
        run(sample_once(policy, prompt=[1, 999]))
    assert policy.http.retries == {} and policy.stats()["failed_calls"] == {"rejected": 1}
    with pytest.raises(PolicyError, match="outside the vocabulary"):  # checked before sending when known
        run(sample_once(OpenAICompatPolicy(local_model_server.url, vocab_size=263), prompt=[1, 999]))


def test_refused_connection_is_retried_then_reported():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    policy = SGLangPolicy(f"http://127.0.0.1:{port}", config=FAST.model_copy(update={"max_retries": 1}))
    with pytest.raises(PolicyError, match=rf"127\.0\.0\.1:{port}/generate failed after 2 attempt.*connection"):
        run(sample_once(policy))


def _vllm(ids, lps, finish="stop", **choice):
    return {
        "choices": [
            {
                "token_ids": ids,
                "finish_reason": finish,
                **choice,
                "logprobs": {"tokens": [f"token_id:{t}" for t in ids], "token_logprobs": lps},
            }
        ]
    }


def test_completion_parser_validates_alignment_and_values():
    c = parse_completion({**_vllm([5, 6], [-0.5, -1.0]), "usage": {"prompt_tokens_details": {"cached_tokens": 3}}})
    assert c.token_ids == (5, 6) and c.logprobs == (-0.5, -1.0) and c.cached_prompt_tokens == 3
    no_ids = _vllm([5, 6], [-0.5, -1.0])
    del no_ids["choices"][0]["token_ids"]  # older vLLM: ids only in 'token_id:<id>' strings
    assert parse_completion(no_ids).token_ids == (5, 6)
    for bad, match in [
        (_vllm([5, 6], [-0.5]), "2 tokens but 1 log-probs"),
        (_vllm([5, 6], [-0.5, float("nan")]), "not a finite number"),
        (_vllm([5, 6], [-0.5, None]), "not a finite number"),
        (
            {
                "choices": [
                    {
                        "token_ids": [5],
                        "finish_reason": "stop",
                        "logprobs": {"tokens": ["token_id:7"], "token_logprobs": [-1.0]},
                    }
                ]
            },
            "disagree",
        ),
        ({"choices": [{"token_ids": [5], "finish_reason": "stop", "logprobs": None}]}, "no 'logprobs"),
        (_vllm([5], [-1.0], finish="weird"), "unknown finish_reason"),
        # ids in 'token_id:<id>' strings alone (no token_ids) that spell no id: a bare ValueError before
        *(
            (
                {"choices": [{"finish_reason": "stop", "logprobs": {"tokens": [tok], "token_logprobs": [-1.0]}}]},
                rf"log-prob token '{tok}' is not of the form 'token_id:<id>'",
            )
            for tok in ("token_id:", "token_id:abc", "token_id:1e3", "token_id: 7", "token_id:--3")
        ),
        ({"choices": []}, "no 'choices'"),
    ]:
        with pytest.raises(MalformedResponse, match=match):
            parse_completion(bad)


def test_completion_parser_reads_tokens_back_where_they_are_not_vllms_spelling():
    """The tokens' cross-check against ``token_ids`` compares vLLM's spelling at once and
    reads any other spelling token by token, as before: a zero-padded id still agrees,
    a different id or a text token still disagrees, an id that is no plain int is still
    refused, by the token that spells it."""
    padded = _vllm([5, 12], [-0.5, -0.25])
    padded["choices"][0]["logprobs"]["tokens"] = ["token_id:05", "token_id:12"]
    assert parse_completion(padded).token_ids == (5, 12)
    assert parse_completion(_vllm([5, 12], [-0.5, -0.25])).token_ids == (5, 12)
    for tokens in (["token_id:5", "token_id:13"], ["token_id:5", "twelve"]):
        bad = _vllm([5, 12], [-0.5, -0.25])
        bad["choices"][0]["logprobs"]["tokens"] = tokens
        if all(t.startswith("token_id:") for t in tokens):
            with pytest.raises(MalformedResponse, match="disagree"):
                parse_completion(bad)
        else:  # not all ids: the tokens are not read, token_ids stand (as before)
            assert parse_completion(bad).token_ids == (5, 12)
    with pytest.raises(MalformedResponse, match=r"'token_id:True' is not of the form"):
        parse_completion(_vllm([5, True], [-0.5, -0.25]))


def test_generate_parser_reads_sglang_triples():
    ok = {
        "output_ids": [3, 4],
        "meta_info": {
            "output_token_logprobs": [[-0.1, 3, None], [-0.2, 4, None]],
            "finish_reason": {"type": "length", "length": 2},
            "cached_tokens": 7,
        },
    }
    c = parse_generate(ok)
    assert (
        c.token_ids == (3, 4)
        and c.logprobs == (-0.1, -0.2)
        and c.finish_reason == "length"
        and c.cached_prompt_tokens == 7
    )
    for mutate, match in [
        (lambda d: d.update(output_ids=[3, 5]), "disagree"),
        (lambda d: d["meta_info"]["output_token_logprobs"].__setitem__(1, [float("inf"), 4, None]), "not a finite"),
        (lambda d: d["meta_info"].pop("output_token_logprobs"), "return_logprob"),
        (lambda d: d["meta_info"].update(finish_reason=None), "unknown finish_reason"),
    ]:
        bad = {
            "output_ids": [3, 4],
            "meta_info": {
                **ok["meta_info"],
                "output_token_logprobs": [list(t) for t in ok["meta_info"]["output_token_logprobs"]],
            },
        }
        mutate(bad)
        with pytest.raises(MalformedResponse, match=match):
            parse_generate(bad)


def test_policy_pickles_after_use_and_works_in_a_new_event_loop(local_model_server):
    policy = OpenAICompatPolicy(local_model_server.url, config=FAST)
    first = run(policy.sample(PROMPT, SamplingParams(max_tokens=4, seed=3)))  # client left open on a dead loop
    clone = pickle.loads(pickle.dumps(policy))
    assert clone.http._wire is None and clone.http.config == FAST
    blob = pickle.dumps(policy)  # copies of one pickle (Dask workers) draw their own jitter
    a, b = pickle.loads(blob).http, pickle.loads(blob).http
    assert [a._rng.random() for _ in range(3)] != [b._rng.random() for _ in range(3)]
    assert clone.stats()["calls"] == 0  # counts are per process: a pickled copy starts from zero
    assert run(sample_once(clone, max_tokens=4, seed=3)).token_ids == first.token_ids
    assert run(sample_once(policy, max_tokens=4, seed=3)).token_ids == first.token_ids  # new loop, new client


def test_concurrency_is_bounded_by_the_semaphore(local_model_server):
    policy = OpenAICompatPolicy(local_model_server.url, config=HttpConfig(max_concurrency=2))
    in_flight, peak = 0, 0

    class Counting(httpx.AsyncHTTPTransport):
        async def handle_async_request(self, request):
            nonlocal in_flight, peak
            in_flight += 1
            peak = max(peak, in_flight)
            try:
                return await super().handle_async_request(request)
            finally:
                in_flight -= 1

    policy.http._transport = Counting()

    async def go():
        try:
            return await asyncio.gather(
                *(policy.sample(PROMPT, SamplingParams(max_tokens=6, seed=i)) for i in range(8))
            )
        finally:
            await policy.aclose()

    assert len(run(go())) == 8 and peak == 2


# --- one retry policy: backoff, Retry-After, deadline, hedging, transports -------------


def test_backoff_is_full_jitter_under_an_exponential_cap():
    policy = RetryPolicy(backoff_s=0.1, backoff_max_s=1.0)
    for retry, cap in [(0, 0.1), (1, 0.2), (2, 0.4), (3, 0.8), (6, 1.0)]:
        waits = [policy.backoff(retry, rng) for rng in [random.Random(retry)] for _ in range(400)]
        assert all(0.0 <= w <= cap for w in waits)
        # uniform over [0, cap]: 400 seeded draws reach both ends and average cap/2
        # (the mean's standard error is cap/69, so 10% of cap/2 is 3.5 of them)
        assert min(waits) < 0.05 * cap and max(waits) > 0.95 * cap
        assert sum(waits) / len(waits) == pytest.approx(cap / 2, rel=0.1)
        again = random.Random(retry)
        assert waits == [policy.backoff(retry, again) for _ in range(400)]  # the seed fixes the draws
    assert RetryPolicy(backoff_s=0.1, backoff_max_s=1.0, jitter=False).backoff(2, random.Random(0)) == 0.4
    # Retry-After is a floor on the wait, up to the cap
    assert policy.backoff(0, random.Random(0), retry_after=0.7) == 0.7
    assert policy.backoff(0, random.Random(0), retry_after=30.0) == 1.0


def test_retry_after_reads_seconds_and_http_dates():
    assert parse_retry_after("3") == 3.0 and parse_retry_after(" 0.5 ") == 0.5 and parse_retry_after("-2") == 0.0
    now = 1_700_000_000.0
    assert parse_retry_after(email.utils.formatdate(now + 4, usegmt=True), now=now) == pytest.approx(4.0)
    assert parse_retry_after("soon") is None and parse_retry_after(None) is None


def test_retry_after_dates_without_a_zone_are_gmt(monkeypatch):
    """An HTTP date is GMT (RFC 9110), in every form it may take: asctime's form and a
    ``-0000`` zone parse to a datetime without a zone, which was then read as the local
    time - on a machine 5 hours behind UTC, 4 s ahead became 5 h (then capped to
    ``backoff_max_s``), and one ahead of UTC waited nothing."""
    now = 1_700_000_000.0
    when = time.gmtime(now + 4)
    asctime = time.strftime("%a %b %d %H:%M:%S %Y", when)
    no_zone = time.strftime("%a, %d %b %Y %H:%M:%S -0000", when)
    try:
        for zone in ("EST+5", "JST-9"):
            monkeypatch.setenv("TZ", zone)
            time.tzset()
            for value in (asctime, no_zone):
                assert parse_retry_after(value, now=now) == pytest.approx(4.0), (zone, value)
    finally:
        monkeypatch.undo()
        time.tzset()


def test_client_stats_total_call_records():
    """What an engine does with the records of many completions (and each client with its own)."""
    stats = ClientStats()
    stats.add(CallRecord(3, 1.5, (("timeout", 1.0), ("server error", 0.25))))  # answered on the third attempt
    stats.add(CallRecord(2, 0.7, (("connection", 0.1), ("connection", 0.6)), failed="connection", deadline=True))
    stats.add(CallRecord(1, 0.4, hedges=1, hedge_won=True, hedge_s=0.25))
    assert stats.as_dict() == {
        "calls": 3,
        "attempts": 6,
        "retries": {"timeout": 1, "server error": 1, "connection": 1},  # a call's last failed attempt is not retried
        "failed_calls": {"connection": 1},
        "lost_s": {"timeout": 1.0, "server error": 0.25, "connection": 0.7},
        "deadline_exceeded": 1,
        "hedges": 1,
        "hedge_wins": 1,
        "hedge_lost_s": 0.25,
    }


async def _post(client: HttpClient, body=None):
    try:
        return await client.request("POST", "/x", body or {}, lambda d: d)
    finally:
        await client.aclose()


@pytest.mark.integration  # starts a server
def test_retry_after_is_honoured(scripted):
    scripted.answers[:] = [(429, {"Retry-After": "0.4"}, {"error": "busy"}), (200, {}, {"ok": 1})]
    client = HttpClient(scripted.url, HttpConfig(backoff_s=0.001, backoff_max_s=5.0))
    assert run(_post(client)) == {"ok": 1}
    # jitter alone would wait at most 1 ms; the server asked for 0.4 s
    assert scripted.arrivals[1] - scripted.arrivals[0] >= 0.4
    stats = client.stats()
    assert stats["retries"] == {"server error": 1} and stats["lost_s"]["server error"] >= 0.4


@pytest.mark.integration  # starts a server
def test_retry_after_as_an_http_date_is_honoured(scripted):
    """A 429 whose ``Retry-After`` is an HTTP date (whole seconds): the retry waits until
    then, here at least 1 s (the date is 2 s on, less what is left of this second)."""
    when = email.utils.formatdate(math.floor(time.time()) + 2, usegmt=True)
    scripted.answers[:] = [(429, {"Retry-After": when}, {"error": "busy"}), (200, {}, {"ok": 1})]
    client = HttpClient(scripted.url, HttpConfig(backoff_s=0.001, backoff_max_s=5.0))
    assert run(_post(client)) == {"ok": 1}
    assert 1.0 <= scripted.arrivals[1] - scripted.arrivals[0] <= 3.5
    assert client.stats()["retries"] == {"server error": 1}


@pytest.mark.integration  # starts a server
def test_a_retry_that_cannot_finish_by_the_deadline_is_not_started(scripted):
    scripted.answers[:] = [(503, {"Retry-After": "10"}, {"error": "down"}), (200, {}, {"ok": 1})]
    client = HttpClient(scripted.url, HttpConfig(backoff_max_s=5.0, deadline_s=3.0))
    t0 = time.monotonic()
    with pytest.raises(PolicyError, match=r"failed after 1 attempt\(s\) in .* \(deadline 3 s\); last: status 503"):
        run(_post(client))
    # the wait asked for (10 s, capped at 5) would end past the deadline: give up now, send nothing more
    assert time.monotonic() - t0 < 3.0 and len(scripted.arrivals) == 1
    assert client.stats()["deadline_exceeded"] == 1 and client.stats()["failed_calls"] == {"server error": 1}


def test_an_explicit_httpx_transport_carries_every_request():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        if len(seen) == 1:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, json=_vllm([5, 6], [-0.5, -1.0]))

    policy = OpenAICompatPolicy("http://model.invalid", config=FAST, transport=httpx.MockTransport(handler))
    c = run(sample_once(policy))
    assert c.token_ids == (5, 6) and len(seen) == 2 and seen[1]["prompt"] == list(PROMPT) and seen[1]["seed"] == 1
    assert policy.http.retries == {"connection": 1}


def hedged(cls, url, after_s: float):
    return cls(url, config=HttpConfig(**{**FAST.model_dump(), "hedge_after_s": after_s}))


@pytest.mark.parametrize("cls", [OpenAICompatPolicy, SGLangPolicy])
def test_a_hedged_request_returns_the_same_tokens_and_is_counted(local_model_server, cls):
    want = run(sample_once(cls(local_model_server.url, config=FAST), seed=21, max_tokens=12))
    policy = hedged(cls, local_model_server.url, 0.3)
    fault(local_model_server, count=1, delay_s=5.0)  # the first copy is held; the hedge is not
    t0 = time.monotonic()
    got = run(sample_once(policy, seed=21, max_tokens=12))
    assert time.monotonic() - t0 < 5.0  # answered by the hedge, not by the held copy
    # the seed makes both copies the same sample (log-probs to the server's cache-dependent rounding)
    assert got.token_ids == want.token_ids and got.logprobs == pytest.approx(want.logprobs, abs=1e-5)
    record = got.meta["http"]
    assert (record.attempts, record.hedges, record.hedge_won, record.errors) == (1, 1, True, ())
    stats = policy.stats()
    assert (stats["hedges"], stats["hedge_wins"], stats["retries"]) == (1, 1, {})


def test_unseeded_requests_are_not_hedged(local_model_server):
    """Two unseeded copies sample different answers; taking the faster one would favour
    short completions, so only seeded requests are hedged."""
    policy = hedged(OpenAICompatPolicy, local_model_server.url, 0.1)
    fault(local_model_server, count=1, delay_s=0.6)
    c = run(sample_once(policy, seed=None))
    assert c.meta["http"].hedges == 0 and policy.stats()["hedges"] == 0


def test_the_adaptive_hedge_delay_is_twice_the_recent_p99_of_its_class():
    timer = HedgeTimer(RetryPolicy())
    small, large = HedgeTimer.key("/v1/completions", 8), HedgeTimer.key("/v1/completions", 512)
    for i in range(HedgeTimer.MIN_SAMPLES - 1):
        timer.observe(small, 0.05 + i / 1000)
    assert timer.delay(small) is None  # too few answers to know the tail yet
    timer.observe(small, 0.3)
    lat = [0.05 + i / 1000 for i in range(HedgeTimer.MIN_SAMPLES - 1)] + [0.3]
    assert quantile(lat, 0.99) == 0.3 and timer.delay(small) == pytest.approx(0.6)
    assert timer.delay(large) is None  # another size class learns its own tail
    # no hedge that would come after the attempt's own timeout
    short = HedgeTimer(RetryPolicy(timeout_s=0.5))
    for _ in range(HedgeTimer.MIN_SAMPLES):
        short.observe(small, 0.3)
    assert short.delay(small) is None
    assert not HedgeTimer(RetryPolicy(adaptive_hedge=False)).enabled


def test_the_hedge_budget_caps_copies_but_never_strands_an_overdue_request():
    timer = HedgeTimer(RetryPolicy())
    assert sum(timer.spend() for _ in range(50)) == HedgeTimer.BURST  # the burst, then nothing
    for _ in range(10):  # ten first requests earn one hedge
        timer.earn()
    assert timer.spend() and not timer.spend()
    assert timer.spend(overdue=True)  # a straggler the collection waits for is hedged anyway


def test_an_adaptive_hedge_overtakes_a_hang_with_the_budget_spent(local_model_server):
    """The library's defaults (120 s timeout, adaptive hedging): after enough answers to
    learn the tail, a held request is overtaken by a copy in about the learnt delay, and
    by OVERDUE times it when the hedge budget is spent."""
    policy = OpenAICompatPolicy(local_model_server.url, config=HttpConfig())

    async def go():
        try:
            for i in range(HedgeTimer.MIN_SAMPLES):
                await policy.sample(PROMPT, SamplingParams(max_tokens=8, seed=i))
            delay = policy.http._hedger.delay(HedgeTimer.key(policy.path, 8))
            assert delay is not None and delay < 2.0
            out = []
            for spent in (False, True):
                if spent:
                    policy.http._hedger._tokens = 0.0
                fault(local_model_server, count=1, delay_s=30.0)
                t0 = time.monotonic()
                c = await policy.sample(PROMPT, SamplingParams(max_tokens=8, seed=99))
                out.append((time.monotonic() - t0, c.meta["http"], delay))
            return out
        finally:
            await policy.aclose()

    (fast, fast_record, delay), (slow, slow_record, _) = run(go())
    # the copy answered (hedge_won), so it overtook the request held 30 s: read from the
    # call's record, not wall time (a loaded machine is slow)
    for record in (fast_record, slow_record):
        assert record.hedge_won and record.attempts == 1, record
    assert slow >= HedgeTimer.OVERDUE * delay * 0.9  # waited until overdue, then hedged for free


def test_config_file_env_and_flags_set_the_model_client():
    from cli.common import overrides as _overrides
    from tasks.config import ConfigError, load_config

    flags = _overrides(["model.http.timeout_s=7", "model.http.max_retries=1", "model.http.hedge_after_s=2.5"])
    cfg = load_config(
        overrides={**flags, "model.kind": "sglang", "model.url": "http://127.0.0.1:9", "execution.max_concurrency": 96},
        environ={"FOCUS_MODEL__HTTP__DEADLINE_S": "30"},
    )
    policy = cfg.build_policy()
    assert isinstance(policy, SGLangPolicy)
    c = policy.http.config
    assert (c.timeout_s, c.max_retries, c.hedge_after_s, c.deadline_s) == (7, 1, 2.5, 30)
    assert c.max_concurrency == 96  # as many calls in flight as the execution runs rollouts
    for key, value, msg in [
        ("model.http.timeout_s", 0, "model.http.timeout_s: Input should be greater than 0"),
        ("model.http.retries", 3, "model.http.retries: unknown field"),
        ("model.options", {"config": {"timeout_s": 1}}, "set timeouts and retries in model.http"),
    ]:
        with pytest.raises(ConfigError, match=msg):
            load_config(overrides={key: value}, environ={})


def test_importing_backends_loads_neither_torch_nor_tinker():
    code = (
        "import sys, focus.backends as b; [getattr(b, n) for n in b.__all__]; "
        "bad = [m for m in ('torch', 'tinker', 'prefect', 'dask') if m in sys.modules]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --- token exactness through the agent -------------------------------------------------


async def _note(args, ctx):
    return f"noted {args.get('text', '')!r}"


def tool_agent(policy) -> Agent:
    note = Tool("note", "save a note", {"type": "object", "properties": {"text": {"type": "string"}}}, _note)
    env = ToolEnv([note], judge=lambda task, ans: float(ans == "42"))
    return Agent(
        policy,
        env,
        PolicyFormat(CODEC, XmlToolCallParser()),
        context=Segments(),
        branch_points=EveryDecision(),
        max_steps=6,
        sampling=SamplingParams(max_tokens=24, temperature=1.0),
    )


def test_tool_rollout_over_real_server_is_token_exact(local_model_server):
    policy = local_model_server.policy(config=FAST)
    agent = tool_agent(policy)
    task = Task("t", {"prompt": "What is 6*7?"})

    async def go():
        try:
            root = await agent.start(task)
            clear_recorded(local_model_server)
            return await agent.rollout(root, seed=11)
        finally:
            await policy.aclose()

    ro = run(go())
    turns = ro.turns
    assert len(turns) >= 5, [p.kind for p in ro.pieces]
    # what the server received is exactly what the rollout recorded, call by call (a slow
    # call's hedged copy or retry is the same request again: see the test below)
    assert distinct(recorded(local_model_server)) == [t.prompt_ids for t in turns]
    for a, b in zip(turns, turns[1:], strict=False):
        assert b.prompt_ids[: len(a.prompt_ids) + len(a.completion_ids)] == a.prompt_ids + a.completion_ids
        obs = b.prompt_ids[len(a.prompt_ids) + len(a.completion_ids) :]
        assert list(obs) == CODEC.observation_ids(
            a.completion_ids, [Message("tool" if "noted" in a.observation else "user", a.observation)]
        )
    for t in turns:
        assert len(t.logprobs) == len(t.completion_ids) > 0 and all(math.isfinite(x) and x <= 0 for x in t.logprobs)


def distinct(prompts: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """The requests the server received, each once, in the order they first arrived."""
    return list(dict.fromkeys(prompts))


def test_a_hedged_call_in_a_tool_rollout_changes_no_token(local_model_server):
    """On a loaded machine a call can outlast the client's hedge delay (twice the recent
    p99), and the server then receives the same request twice: the test above once
    compared every request received with one per turn and failed ``At index 1``. Here a
    hedge is forced (the second call held 3 s, hedges after 0.3 s): the server sees the
    copy, the copy answers with the same tokens (same seed; cache- and batch-invariant
    numerics), and the rollout is bit-identical to the one that was not hedged."""
    task = Task("t", {"prompt": "What is 6*7?"})

    def rollout(config: HttpConfig) -> tuple[Any, dict[str, Any]]:
        policy = local_model_server.policy(config=config)
        agent = tool_agent(policy)

        async def go():
            try:
                root = await agent.start(task)
                clear_recorded(local_model_server)
                return await agent.rollout(root, seed=11), policy.stats()
            finally:
                await policy.aclose()

        return run(go())

    clean, _ = rollout(FAST)
    fault(local_model_server)  # the first call as it comes
    fault(local_model_server, delay_s=3.0)  # the second held until its hedge has answered
    hedged, stats = rollout(FAST.model_copy(update={"hedge_after_s": 0.3}))
    got = recorded(local_model_server)
    assert stats["hedges"] >= 1 and len(got) > len(hedged.turns)
    assert got.count(hedged.turns[1].prompt_ids) >= 2  # the held call and its copy
    assert distinct(got) == [t.prompt_ids for t in hedged.turns]
    assert [(t.prompt_ids, t.completion_ids, t.logprobs) for t in hedged.turns] == [
        (t.prompt_ids, t.completion_ids, t.logprobs) for t in clean.turns
    ]


def test_continuation_from_mid_rollout_checkpoint_resends_identical_prefix(local_model_server):
    policy = local_model_server.policy(config=FAST)
    agent = tool_agent(policy)
    task = Task("t", {"prompt": "What is 6*7?"})

    async def go():
        try:
            ro = await agent.rollout(await agent.start(task), seed=5)
            checkpoints = [p for p in ro.pieces if p.kind == "checkpoint"]
            mid = pickle.loads(pickle.dumps(checkpoints[len(checkpoints) // 2].state))
            clear_recorded(local_model_server)
            cont = await agent.rollout(mid, seed=99)
            probe = await policy.sample(mid.context.prompt_ids, SamplingParams(max_tokens=1, seed=0))
            return ro, mid, cont, probe
        finally:
            await policy.aclose()

    ro, mid, cont, probe = run(go())
    sent = recorded(local_model_server)
    assert sent[0] == mid.context.prompt_ids == cont.turns[0].prompt_ids
    assert mid.context.prompt_ids in [t.prompt_ids for t in ro.turns]  # the same prefix the first rollout sent
    assert all(p[: len(sent[0])] == sent[0] for p in sent)  # every later prompt extends it
    assert probe.cached_prompt_tokens == len(mid.context.prompt_ids)  # server-side prefix cache hit


# --- Tinker ----------------------------------------------------------------------------


class FakeSamplingClient:
    """Answers like tinker.SamplingClient.sample: an awaitable of a real SampleResponse."""

    def __init__(self, *, logprobs: bool = True, sync: bool = False) -> None:
        self.calls: list[tuple[list[int], ttypes.SamplingParams]] = []
        self.logprobs, self.sync = logprobs, sync

    def sample(self, prompt, num_samples, sampling_params, **kw):
        from tinker import types as ttypes

        assert isinstance(prompt, ttypes.ModelInput) and num_samples == 1
        self.calls.append((prompt.to_ints(), sampling_params))
        rng = np.random.default_rng(sampling_params.seed)
        n = min(sampling_params.max_tokens, 5)
        toks = rng.integers(0, 256, n).astype(np.int32)
        stop = "length"
        if isinstance(sampling_params.stop, list) and sampling_params.stop and n < sampling_params.max_tokens:
            toks = np.append(toks, np.int32(sampling_params.stop[0]))
            stop = "stop"
        seq = ttypes.SampledSequence(
            stop_reason=stop,
            sequence_id="s0",
            tokens_np=toks,
            logprobs_np=-rng.random(len(toks)).astype(np.float32) if self.logprobs else None,
        )
        resp = ttypes.SampleResponse(sequences=[seq], prompt_cache_hit_tokens=4)
        if self.sync:
            fut: __import__("concurrent.futures").futures.Future = __import__("concurrent.futures").futures.Future()
            fut.set_result(resp)
            return fut

        async def later():
            return resp

        return later()


@pytest.mark.needs("tinker")
class TestTinkerConformance(PolicyConformance):
    def make_policy(self):
        return TinkerPolicy(FakeSamplingClient(), vocab_size=CODEC.vocab_size)


@pytest.mark.needs("tinker")
def test_tinker_policy_sends_exact_ids_and_params_and_reads_sequences():
    client = FakeSamplingClient()
    policy = TinkerPolicy(client, policy_version="tinker://run/1")
    c = run(
        policy.sample(PROMPT, SamplingParams(max_tokens=9, temperature=0.7, top_p=0.9, seed=4, stop_token_ids=(257,)))
    )
    ids, params = client.calls[0]
    assert ids == list(PROMPT)
    assert (params.max_tokens, params.temperature, params.top_p, params.seed, params.stop) == (9, 0.7, 0.9, 4, [257])
    assert c.token_ids[-1] == 257 and c.finish_reason == "stop" and c.cached_prompt_tokens == 4
    assert len(c.logprobs) == len(c.token_ids) and policy.policy_version == "tinker://run/1"
    sync = run(TinkerPolicy(FakeSamplingClient(sync=True)).sample(PROMPT, SamplingParams(max_tokens=3, seed=4)))
    assert sync.finish_reason == "length" and len(sync.token_ids) == 3
    with pytest.raises(PolicyError, match="no log-probs"):
        run(TinkerPolicy(FakeSamplingClient(logprobs=False)).sample(PROMPT, SamplingParams(max_tokens=3)))


@pytest.mark.parametrize("cls", [OpenAICompatPolicy, SGLangPolicy])
def test_a_config_that_is_no_http_config_is_one_type_error_naming_it(cls):
    # a dict of options failed later: "'dict' object has no attribute 'headers'"
    with pytest.raises(TypeError, match=r"config must be a focus\.backends\.HttpConfig .*got a dict"):
        cls("http://127.0.0.1:9", config={"timeout_s": 3})
    with pytest.raises(TypeError, match="got a dict"):
        HttpClient("http://127.0.0.1:9", {"timeout_s": 3})  # type: ignore[arg-type]
