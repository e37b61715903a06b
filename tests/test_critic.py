"""Critic backends: constant, HTTP against a real loopback server, local trainable."""

from __future__ import annotations

import functools
import json
import pickle
import socket
import time

import pytest

from focus.agent import Agent
from focus.backends import HttpConfig
from focus.collector import Collector
from focus.critic import ConstantCritic, Critic, CriticError, HttpCritic, LocalCritic
from focus.critic_server import serve_critic
from focus.env import Task
from focus.priority import Phase, Uniform
from focus.synthetic import SHAPES, SyntheticCritic, SyntheticEnv, SyntheticPolicy, read_state, synthetic_format
from focus.testing import run

CONTEXTS = [[256, 1, 2, 3], [256, 7], [256, 9, 9, 9, 9, 9]]

#: A critic that runs a float32 network may score a context differently alone than in a
#: batch: the BLAS kernels pick their blocking (and so the order of each dot product's
#: additions) by the batch's shape and by the CPU (AVX2 vs AVX-512). Each of the local
#: critic's matmuls sums over at most a few hundred float32 products, so the relative
#: error of a sum stays below ~300 * 2**-24 ~ 2e-5; 1e-4 relative (plus 1e-7 absolute
#: for values near zero) allows that on any x86-64 machine and still fails a critic that
#: scores the wrong context (the contexts' values differ by far more).
BATCH_REL, BATCH_ABS = 1e-4, 1e-7


class CriticConformance:
    """Contract of :class:`focus.critic.Critic`: one finite value per context, in order."""

    def make_critic(self) -> Critic:
        raise NotImplementedError

    def test_one_finite_value_per_context_in_order(self):
        c = self.make_critic()
        vals = run(c.predict(CONTEXTS))
        assert len(vals) == len(CONTEXTS) and all(isinstance(v, float) for v in vals)
        single = [run(c.predict([ctx]))[0] for ctx in CONTEXTS]
        assert single == pytest.approx(vals, rel=BATCH_REL, abs=BATCH_ABS)
        preds = run(c.predict_with_std(CONTEXTS))
        assert [p.value for p in preds] == pytest.approx(vals, rel=BATCH_REL, abs=BATCH_ABS)
        assert run(c.predict([])) == []
        run(c.aclose())


class TestConstant(CriticConformance):
    def make_critic(self):
        return ConstantCritic(0.5)

    def test_value(self):
        assert run(ConstantCritic(0.25).predict(CONTEXTS)) == [0.25] * 3
        with pytest.raises(ValueError, match="finite"):
            ConstantCritic(float("nan"))

    def test_a_value_or_std_no_collection_takes_is_refused_where_it_is_made(self):
        """A std of -1 or NaN, or a value past ±1e60, was taken here and refused at the
        collection's first scoring, after the evidence ran."""
        for value, std, says in (
            (0.5, -1.0, r"std must be a finite number >= 0 or None, got -1.0"),
            (0.5, float("nan"), r"std must be a finite number >= 0 or None, got nan"),
            (1e61, None, r"value must be finite and within ±1e\+60, got 1e\+61"),
        ):
            with pytest.raises(ValueError, match=rf"^ConstantCritic {says}$"):
                ConstantCritic(value, std)
        assert run(ConstantCritic(0.5, 0).predict_with_std([[1]]))[0].std == 0.0

    def test_a_value_or_std_that_is_no_number_is_refused_naming_the_argument(self):
        """``ConstantCritic("0.5")`` (a value read from a file or a flag as text) raised
        ``TypeError: bad operand type for abs(): 'str'``, and ``std="x"`` ``must be real
        number, not str``: neither named the class, the argument or what it takes."""
        for args, says in (
            (("0.5",), r"value must be a number, got '0.5' \(str\)"),
            ((None,), r"value must be a number, got None \(NoneType\)"),
            (([0.5],), r"value must be a number, got \[0.5\] \(list\)"),
            ((0.5, "x"), r"std must be a number or None, got 'x' \(str\)"),
        ):
            with pytest.raises(TypeError, match=rf"^ConstantCritic {says}$"):
                ConstantCritic(*args)
        assert ConstantCritic(True).value == 1.0 and ConstantCritic(1, std=0).std == 0.0  # numbers of any kind


@pytest.mark.integration  # serves the critic over HTTP
class TestHttpAgainstServedLocalCritic(CriticConformance):
    """HttpCritic talking to a real HTTP server on 127.0.0.1 serving a fitted critic."""

    @pytest.fixture(autouse=True)
    def _server(self):
        with serve_critic(ConstantCritic(0.75, std=0.1)) as url:
            self.url = url
            yield

    def make_critic(self):
        return HttpCritic(self.url, batch_size=2)

    def test_values_and_stds_cross_the_wire(self):
        preds = run(HttpCritic(self.url, batch_size=2).predict_with_std(CONTEXTS))
        assert [(p.value, p.std) for p in preds] == [(0.75, 0.1)] * 3

    def test_pickles_without_its_connection(self):
        c = HttpCritic(self.url)
        run(c.predict(CONTEXTS))
        again = pickle.loads(pickle.dumps(c))
        assert run(again.predict(CONTEXTS[:1])) == [0.75]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


FAST = HttpConfig(backoff_s=0.01, backoff_max_s=0.02, max_retries=1, timeout_s=10, outage_wait_s=0)


def test_an_http_critic_given_no_url_string_or_a_config_of_another_type_says_so():
    """``HttpCritic(8100)`` raised ``AttributeError: 'int' object has no attribute
    'startswith'``, and ``config={"timeout_s": 3}`` (a dict where an ``HttpConfig`` goes)
    ``'dict' object has no attribute 'headers'``: neither named the argument."""
    with pytest.raises(
        TypeError,
        match=r"^HttpCritic url must be a URL string such as 'http://127.0.0.1:8100/score', got 8100 \(int\)$",
    ):
        HttpCritic(8100)  # type: ignore[arg-type]
    with pytest.raises(
        TypeError,
        match=r"^HttpCritic config must be a focus.backends.HttpConfig \(HttpConfig\(\*\*options\)\), got a dict$",
    ):
        HttpCritic("http://127.0.0.1:8100/score", config={"timeout_s": 3})  # type: ignore[arg-type]
    assert HttpCritic("http://127.0.0.1:8100/score", config=HttpConfig(timeout_s=3)).url.endswith("/score")


def test_http_critic_names_the_url_when_the_service_is_down():
    url = f"http://127.0.0.1:{_free_port()}/score"
    with pytest.raises(CriticError, match=f"POST {url} failed after 2 attempt.*connection"):
        run(HttpCritic(url, config=FAST).predict(CONTEXTS))


@pytest.fixture
def bad_server(scripted):
    """The scripted server, answering at ``/score``."""
    scripted.url += "/score"
    return scripted


@pytest.mark.integration  # starts a server
@pytest.mark.parametrize("status", [401, 404, 405, 501])
def test_a_critic_url_that_refuses_any_request_names_the_critic_settings(bad_server, status):
    """A URL that is no scoring service (a web server's 501, a wrong path's 404, a wrong
    key's 401) stopped `focus collect` with `POST <url> was rejected with status 501:
    <its page>`, exit 1 and a traceback in the log, as for a bug: it named neither the
    critic nor a setting to change. It is a setting to fix, as a model service's refusal
    is (`RequestsRefused`): exit 2."""
    from flows.errors import exit_code
    from focus.critic import CriticRefused

    bad_server.answers[:] = [(status, {}, "Not here")]
    with pytest.raises(CriticRefused) as e:
        run(HttpCritic(bad_server.url, config=FAST).predict(CONTEXTS))
    line = str(e.value)
    assert line.startswith(
        f"the critic service at {bad_server.url} refused the request (status {status}): check critic.url and "
        "critic.api_key_env (HttpCritic's url and HttpConfig.api_key in the library); "
        f'last: POST {bad_server.url} was rejected with status {status}: "Not here"'
    ), line
    assert isinstance(e.value, CriticError) and exit_code(e.value) == 2
    bad_server.answers[:] = [(400, {}, "bad contexts")]  # a request's own refusal: as before
    with pytest.raises(CriticError) as e:
        run(HttpCritic(bad_server.url, config=FAST).predict(CONTEXTS))
    assert not isinstance(e.value, CriticRefused) and exit_code(e.value) == 1


@pytest.mark.integration  # starts a server
def test_http_critic_retries_malformed_answers_then_names_them(bad_server):
    for answer, match in [
        ({"vals": []}, "without 'values'"),
        (["x", 1, 2], "non-numeric value 'x' at position 0"),
    ]:
        bad_server.answers[:] = [(200, {}, answer)]
        critic = HttpCritic(bad_server.url, config=FAST)
        with pytest.raises(CriticError, match=f"failed after 2 attempt.*malformed response.*{match}"):
            run(critic.predict(CONTEXTS))
        assert critic.stats()["retries"] == {"malformed response": 1}
    bad_server.answers[:] = [(200, {}, "not a list"), (200, {}, [1, 2, 3])]  # garbled once, then right
    critic = HttpCritic(bad_server.url, config=FAST)
    assert run(critic.predict(CONTEXTS)) == [1.0, 2.0, 3.0]
    assert critic.stats()["retries"] == {"malformed response": 1}
    # a number past the limit is the service's answer for that context: refused, not retried
    bad_server.answers[:] = [(200, {}, [1.0, float("inf"), 2.0])]
    critic = HttpCritic(bad_server.url, config=FAST)
    with pytest.raises(CriticError, match=r"^critic at \S+ returned a non-finite value inf at position 1$"):
        run(critic.predict(CONTEXTS))
    assert critic.stats()["retries"] == {}
    # too few values, or stds, is the service's bug, which a retry repeats: refused at once
    for answer, match in [([0.1], "1 values"), ({"values": [1, 2, 3], "stds": [0.1]}, "1 stds")]:
        bad_server.answers[:] = [(200, {}, answer)]
        critic = HttpCritic(bad_server.url, config=FAST)
        with pytest.raises(CriticError, match=rf"^critic at \S+ returned {match} for 3 contexts$"):
            run(critic.predict(CONTEXTS))
        assert critic.stats()["retries"] == {}
    # a null std is no std for that context
    bad_server.answers[:] = [(200, {}, {"values": [1, 2, 3], "stds": [0.1, None, 0.2]})]
    assert [p.std for p in run(HttpCritic(bad_server.url, config=FAST).predict_with_std(CONTEXTS))] == [0.1, None, 0.2]


@pytest.mark.integration  # starts a server
@pytest.mark.parametrize("first", ["good", "none"])
def test_http_critic_stops_at_once_when_the_service_answers_in_another_shape(bad_server, first, backoff_waits):
    """A scoring service swapped for one of another shape (``{"scores": ...}``), after
    good answers or from the start, with one call in flight: the probes beside the call
    (other contexts, as many) get the same answer, and the call stops with one line
    saying the answers cannot be read, after the answers the rule needs (LATER, or
    FIRST), not after its retries: 11 attempts with the default backoff, 14.2-17.8 s
    before (two runs); 0.07-0.27 s now. Read from the requests and the backoffs the
    client asked for, not wall time: a loaded machine is slow."""
    from focus.backends.unreadable import Unreadable

    critic = HttpCritic(bad_server.url, config=HttpConfig(timeout_s=10, outage_wait_s=0))
    if first == "good":
        bad_server.answers[:] = [(200, {}, [1, 2, 3])]
        assert run(critic.predict(CONTEXTS)) == [1.0, 2.0, 3.0]
    before = len(bad_server.arrivals)
    bad_server.answers[:] = [(200, {}, {"scores": [1, 2, 3]})]
    t0 = time.monotonic()
    with pytest.raises(CriticError) as stopped:
        run(critic.predict(CONTEXTS))
    took = time.monotonic() - t0
    line = str(stopped.value)
    print(f"stopped after {took:.2f} s, {len(bad_server.arrivals) - before} requests: {line[:150]}")
    assert line.startswith("the critic's answers cannot be read: CriticError: critic at ") and "\n" not in line
    assert "without 'values': keys ['scores']" in line, line
    want = Unreadable.LATER if first == "good" else Unreadable.FIRST
    assert len(bad_server.arrivals) - before == want and f"({want} answers in a row to POST {bad_server.url} " in line
    # its first retries' backoff: 0.02 s doubling, well under a second (before: 10 waits, up to 10 s each)
    assert len(backoff_waits) < want and sum(backoff_waits) < 1, backoff_waits


def test_probe_contexts_are_as_many_other_contexts():
    from focus.critic import probe_contexts

    body = [list(range(40)), [5], []]
    one, two = probe_contexts(body, 1), probe_contexts(body, 2)
    assert len(one) == len(two) == len(body) and len({str(one), str(two), str(body)}) == 3
    assert one[0] == [*range(15), 1] and one[1:] == [[5, 1], [1]] and two[1] == [5, 2]


@pytest.mark.integration  # starts a server
def test_http_critic_retries_5xx_and_429_and_not_other_4xx(bad_server):
    bad_server.answers[:] = [(404, {}, {"error": "no"})]
    critic = HttpCritic(bad_server.url, config=FAST)
    with pytest.raises(CriticError, match="rejected with status 404"):
        run(critic.predict(CONTEXTS))
    assert critic.stats()["failed_calls"] == {"rejected": 1} and critic.stats()["retries"] == {}
    bad_server.answers[:] = [(503, {}, "busy"), (429, {}, "slow down"), (200, {}, [1, 2, 3])]
    critic = HttpCritic(bad_server.url, config=FAST.model_copy(update={"max_retries": 2}))
    assert run(critic.predict(CONTEXTS)) == [1.0, 2.0, 3.0]
    assert critic.stats()["retries"] == {"server error": 2}
    assert set(bad_server.paths) == {"/score"}  # the path of the URL is kept


def test_http_critic_sends_through_an_explicit_httpx_transport():
    import httpx

    def handler(request: httpx.Request) -> httpx.Response:
        contexts = json.loads(request.content)
        return httpx.Response(200, json={"values": [float(len(c)) for c in contexts], "stds": [0.5] * len(contexts)})

    critic = HttpCritic("http://critic.invalid/v1/score", batch_size=2, transport=httpx.MockTransport(handler))
    preds = run(critic.predict_with_std(CONTEXTS))
    assert [(p.value, p.std) for p in preds] == [(4.0, 0.5), (2.0, 0.5), (6.0, 0.5)]
    assert critic.stats()["calls"] == 2  # two batches


def test_config_builds_the_http_critic_with_its_retry_policy():
    from tasks.config import load_config

    cfg = load_config(
        overrides={"critic.kind": "http", "critic.url": "http://127.0.0.1:9/score", "critic.http.max_retries": 0},
        environ={"FOCUS_CRITIC__HTTP__TIMEOUT_S": "3"},
    )
    critic = cfg.build_critic()
    assert isinstance(critic, HttpCritic)
    assert (critic.http.config.max_retries, critic.http.config.timeout_s) == (0, 3.0)


@pytest.mark.integration  # starts a server
def test_served_critic_rejects_bad_requests():
    import httpx

    with serve_critic(ConstantCritic(0.0)) as url:
        r = httpx.post(url, json={"not": "a list"})
        assert r.status_code == 400 and "list of contexts" in r.json()["error"]


@pytest.mark.integration  # starts a server
def test_a_served_critic_answering_numpy_numbers_or_nan_is_served_or_named():
    """A critic whose predictions are numpy floats (a model's output) or plain numbers
    from ``predict_with_std`` broke the handler outside its try ("Object of type float32
    is not JSON serializable", "'float' object has no attribute 'value'"): the connection
    closed without an answer, and the client retried, then blamed the network. A NaN
    went out as ``NaN``, which is no JSON. Each is now served, or answered with a 500
    naming the critic and the value."""
    import httpx
    import numpy as np

    class Numpy(Critic):
        async def predict(self, contexts):  # type: ignore[no-untyped-def]
            return list(np.full(len(contexts), 0.25, dtype=np.float32))

    class Plain(Critic):
        async def predict(self, contexts):  # type: ignore[no-untyped-def]
            raise AssertionError  # pragma: no cover - predict_with_std is overridden

        async def predict_with_std(self, contexts):  # type: ignore[no-untyped-def]
            return [0.5] * len(contexts)

    class Nan(Critic):
        async def predict(self, contexts):  # type: ignore[no-untyped-def]
            return [float("nan")] * len(contexts)

    for critic, want in ((Numpy(), 0.25), (Plain(), 0.5)):
        with serve_critic(critic) as url:
            assert run(HttpCritic(url, config=FAST).predict(CONTEXTS)) == [want] * len(CONTEXTS)
    with serve_critic(Nan()) as url:
        r = httpx.post(url, json=CONTEXTS)
        assert r.status_code == 500
        assert r.json()["error"] == "CriticError: critic Nan returned a non-finite value nan at position 0"


def test_a_critic_value_too_large_for_a_float_is_named():
    """``float(10**400)`` raised a bare OverflowError out of the check, naming no critic."""
    from focus.critic import check_predictions

    with pytest.raises(CriticError, match=r"^critic X returned the value 1000.* beyond ±1e\+60 at position 1$"):
        check_predictions([0.5, 10**400], 2, "critic X")


@functools.cache
def _synthetic_rows(seed: int):
    """Critic rows of a small uniform collection (made once: several tests fit on them)."""
    mdps = [SHAPES["long"](seed + i) for i in range(4)]
    agent = Agent(SyntheticPolicy(mdps), SyntheticEnv(mdps), synthetic_format(), max_steps=14)
    search = Uniform(phases=[Phase("evidence", rollouts_per_task=3), Phase("more", transitions=300, wave_size=16)])
    col = Collector(agent, search, ConstantCritic(0.5), seed=seed)
    batch = run(col.collect([Task(f"t{i}", {"mdp": i}) for i in range(4)]))
    return tuple(batch.critic), SyntheticCritic(mdps)


@pytest.mark.needs("torch")
class TestLocal(CriticConformance):
    def make_critic(self):
        c = LocalCritic(buckets=256, hidden=8)
        rows, _ = _synthetic_rows(0)
        c.fit(rows, epochs=2)
        return c

    def test_fit_beats_a_constant_on_exact_values(self):
        rows, exact = _synthetic_rows(0)
        critic = LocalCritic(buckets=512, hidden=16, default=0.5)
        critic.fit(rows, epochs=150, lr=1e-2)
        ctxs = [r.context_ids for r in rows]
        truth = [exact.value(*read_state(c)) for c in ctxs]
        pred = run(critic.predict(ctxs))
        mse = sum((p - t) ** 2 for p, t in zip(pred, truth, strict=True)) / len(truth)
        const = sum((0.5 - t) ** 2 for t in truth) / len(truth)
        assert mse < 0.5 * const

    def test_fit_on_the_used_buckets_is_the_full_layers_fit(self):
        """The fit trains only the first layer's columns of buckets its rows use; the
        full layer's Adam would leave the others where they are (zero gradients, fresh
        moments). Held to that full fit, written out here, over two fits in a row (the
        second on rows that use buckets the first did not). In float64: the two differ
        only in the order of the matmuls' additions, and Adam's first step is the sign
        of each gradient, so in float32 a gradient within rounding of zero could take a
        whole step either way on some CPU; in float64 that cannot happen here, and the
        weights must agree to 1e-9."""
        import torch

        rows, _ = _synthetic_rows(0)
        first, second = rows[: len(rows) // 2], rows[len(rows) // 2 :]
        dtype = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            fast, full = LocalCritic(buckets=512, hidden=16), LocalCritic(buckets=512, hidden=16)
            initial = full._net()[0].weight.detach().clone()
            for part in (first, second):
                fast.fit(part, epochs=20)
                x, used = full._features([r.context_ids for r in part])
                dense = torch.zeros(len(part), 512)
                dense[:, used] = x
                y = torch.tensor([float(r.target) for r in part])
                w = torch.tensor([float(r.weight) for r in part])
                w = w / w.mean()
                net = full._net()
                opt = torch.optim.Adam(net.parameters(), lr=3e-3)
                gen = torch.Generator().manual_seed(0)
                for _ in range(20):
                    for idx in torch.randperm(len(part), generator=gen).split(1024):
                        loss = (w[idx] * (net(dense[idx]).squeeze(-1) - y[idx]) ** 2).mean()
                        opt.zero_grad()
                        loss.backward()
                        opt.step()
            full.fitted = True
            for a, b in zip(fast._net().parameters(), full._net().parameters(), strict=True):
                assert torch.allclose(a, b, rtol=1e-9, atol=1e-12)
            touched = torch.zeros(512, dtype=torch.bool)
            for part in (first, second):
                touched[full._features([r.context_ids for r in part])[1]] = True
            assert 0 < int(touched.sum()) < 512
            assert torch.equal(fast._net()[0].weight[:, ~touched], initial[:, ~touched])
            ctxs = [r.context_ids for r in rows]
            assert run(fast.predict(ctxs)) == pytest.approx(run(full.predict(ctxs)), rel=1e-9, abs=1e-12)
            # predictions go through the whole layer, bit for bit what they were before
            # the fit skipped columns (a resume compares a critic's predictions to 9 digits)
            x, used = fast._features(ctxs)
            dense = torch.zeros(len(ctxs), 512)
            dense[:, used] = x
            with torch.no_grad():
                assert run(fast.predict(ctxs)) == [float(v) for v in fast._net()(dense).squeeze(-1)]
        finally:
            torch.set_default_dtype(dtype)

    def test_unfitted_predicts_default_and_empty_fit_fails(self):
        c = LocalCritic(default=0.3)
        assert run(c.predict(CONTEXTS)) == [0.3] * 3
        with pytest.raises(ValueError, match="positive weight"):
            c.fit([])

    def test_fit_settings_that_cannot_train_are_refused(self):
        """``epochs=0`` marked the critic fitted after no step at all (its predictions the
        initial network's), and the loop saved it as trained."""
        from types import SimpleNamespace as Row

        c = LocalCritic(default=0.3)
        rows = [Row(context_ids=(256, 1, i), target=1.0, weight=1.0) for i in range(4)]
        for bad in ({"epochs": 0}, {"lr": 0.0}, {"lr": float("nan")}, {"batch_size": 0}):
            with pytest.raises(ValueError, match=r"^LocalCritic.fit needs epochs >= 1"):
                c.fit(rows, **bad)
        assert not c.fitted

    def test_a_fit_that_cannot_be_finite_is_refused_and_leaves_the_critic_as_it_was(self):
        """Targets whose squares overflow float32 (3e38, 1e39: rewards are collected up to
        1e60), a NaN target or an infinite weight made every weight NaN: the fit returned
        ``nan`` without a word, and the critic, saved as the loop's next one, predicted
        NaN everywhere, refused only when the next collection asked it."""
        import math
        from types import SimpleNamespace as Row

        c = self.make_critic()
        before = run(c.predict(CONTEXTS))
        for target, weight, says in (
            (3e38, 1.0, r"^LocalCritic.fit diverged \(weighted squared error nan\) on targets from 0 to 3e\+38"),
            (1e39, 1.0, r"^LocalCritic.fit diverged"),
            (math.nan, 1.0, r"^LocalCritic.fit: row 1 has target nan and weight 1.0: both must be finite"),
            (0.5, math.inf, r"^LocalCritic.fit: row 1 has target 0.5 and weight inf: both must be finite"),
        ):
            rows = [Row(context_ids=(256, 1, i), target=0.0, weight=1.0) for i in range(4)]
            rows[1] = Row(context_ids=(256, 1, 1), target=target, weight=weight)
            with pytest.raises(ValueError, match=says):
                c.fit(rows, epochs=3)
            assert run(c.predict(CONTEXTS)) == before and c.fitted
        fresh = LocalCritic(buckets=256, hidden=8, default=0.3)
        with pytest.raises(ValueError, match="diverged"):
            fresh.fit([Row(context_ids=(256, 1), target=1e39, weight=1.0)], epochs=2)
        assert not fresh.fitted and run(fresh.predict(CONTEXTS)) == [0.3] * 3

    def test_save_load_and_pickle_round_trip(self, tmp_path):
        c = self.make_critic()
        before = run(c.predict(CONTEXTS))
        url = f"file://{tmp_path}/critic.pt"
        c.save(url)
        assert run(LocalCritic.load(url).predict(CONTEXTS)) == pytest.approx(before)
        c.save("memory://critics/c.pt")
        assert run(LocalCritic.load("memory://critics/c.pt").predict(CONTEXTS)) == pytest.approx(before)
        assert run(pickle.loads(pickle.dumps(c)).predict(CONTEXTS)) == pytest.approx(before)
        with pytest.raises(CriticError, match="no saved LocalCritic"):
            LocalCritic.load(f"file://{tmp_path}/missing.pt")

    @pytest.mark.integration  # starts a server
    def test_served_over_http(self):
        c = self.make_critic()
        with serve_critic(c) as url:
            assert run(HttpCritic(url).predict(CONTEXTS)) == pytest.approx(
                run(c.predict(CONTEXTS)), rel=BATCH_REL, abs=BATCH_ABS
            )
