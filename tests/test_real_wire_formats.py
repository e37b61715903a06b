"""FOCUS's clients against loopback servers that answer as vLLM and SGLang do.

The project's own servers (``focus.tinylm``, ``focus.testing.simserver``) speak the
dialect the project wrote; these stand-ins answer in the shapes the real servers write,
field for field, for the requests FOCUS sends, including versions a user may still run:

* vLLM's ``/v1/completions`` (``CompletionResponse`` / ``CompletionResponseChoice`` /
  ``CompletionLogProbs`` in ``vllm/entrypoints/openai/completion/protocol.py``, built by
  ``completion/serving.py``): ``token_ids`` and ``prompt_token_ids`` per choice only
  from 0.10.2 (``return_token_ids``); log-prob tokens as ``"token_id:<id>"`` per request
  from 0.8 (``return_tokens_as_token_ids``), before that only with the server flag
  ``--return-tokens-as-token-ids``, else as text; unknown request fields ignored; the
  sampled token's log-prob in ``token_logprobs`` (``top_logprobs`` may rank another token
  first); ``stop_reason`` the matched stop id; sample ``i`` of a request with ``n`` and a
  seed drawn with ``seed + i`` (``vllm/v1/engine/parallel_sampling.py``), and ``n`` > 1
  refused with 400 below temperature 1e-5 (greedy: ``SamplingParams._verify_greedy_sampling``); ``/v1/models``
  cards with ``id`` the served name and ``root`` the weights' path
  (``entrypoints/openai/models/serving.py``); 404 with an ``error`` object for a model it
  does not serve; a sampling field a request leaves out takes the model's
  ``generation_config.json`` default (``--generation-config auto``).
* SGLang's ``/generate`` (``input_ids``, ``sampling_params`` with ``sampling_seed``,
  ``return_logprob``): ``output_ids``, ``meta_info.output_token_logprobs`` as
  ``[logprob, id, null]`` triples, ``finish_reason`` objects (``{"type": "stop",
  "matched": id}``, ``{"type": "length", "length": n}``), ``weight_version``;
  ``/get_weight_version``; ``--preferred-sampling-params`` fill fields left out. Its ``/v1/completions``
  (``python/sglang/srt/entrypoints/openai/serving_completions.py``) names log-prob tokens
  by text and gives ``token_ids`` only in versions with ``return_token_ids``.

The tokens are drawn by a seeded stand-in sampler, so every check is exact: the ids
FOCUS records are the ids the server sampled, the log-probs those of the sampled tokens,
and each continuation is sent as the exact ids of the turns before it.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from focus.agent import Agent
from focus.backends import FleetPolicy, HttpConfig, OpenAICompatPolicy, SGLangPolicy
from focus.branching import EveryDecision
from focus.context import AppendOnly
from focus.env import Task
from focus.policy import ReplicasDiffer, SamplingParams, UnreadableAnswers
from focus.testing import run
from focus.toy import ReachTarget, toy_format

pytestmark = [pytest.mark.timeout(60), pytest.mark.integration]  # loopback servers; fast, not slow

FORMAT = toy_format()
EOT = FORMAT.codec.stop_token_ids[0]
#: Short retries, no outage wait, no read timeout a slow machine could miss.
FAST = HttpConfig(backoff_s=0.001, backoff_max_s=0.005, max_retries=6, timeout_s=30, outage_wait_s=0)
DIGITS = b"123"  # small moves: a rollout of several turns
#: Exact binary fractions: a log-prob that survives JSON bit for bit.
LOGPROBS = (-0.125, -0.5, -1.25, -2.0, -3.5)


def draw(prompt: list[int], seed: int, max_tokens: int) -> tuple[list[int], list[float], bool]:
    """The stand-in sampler: 1-3 digit bytes then the end-of-turn id, cut at
    ``max_tokens``; a function of the prompt ids and the seed alone."""
    rng = random.Random(f"{seed}:{prompt}")
    ids = [rng.choice(DIGITS) for _ in range(rng.randint(1, 3))] + [EOT]
    ids = ids[:max_tokens]
    return ids, [rng.choice(LOGPROBS) for _ in ids], ids[-1] == EOT


@dataclass
class Server:
    """What a stand-in server saw: the JSON bodies it was sent, by path."""

    url: str = ""
    bodies: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    sampled: list[tuple[list[int], list[float]]] = field(default_factory=list)
    #: The sampling fields each generation request was served with.
    used: list[dict[str, Any]] = field(default_factory=list)

    def prompts(self, path: str, key: str) -> list[list[int]]:
        """The prompts of the generation requests to ``path`` (a body without ``key`` is
        none: the first-contact probe's empty POST)."""
        return [b[key] for p, b in self.bodies if p == path and key in b]


@asynccontextmanager
async def serve(
    routes: dict[tuple[str, str], Callable[[Server, dict[str, Any]], tuple[int, Any]]],
) -> AsyncIterator[Server]:
    """An aiohttp server on 127.0.0.1 answering ``routes[(method, path)](server, body)``."""
    server = Server()

    async def handle(request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else {}
        server.bodies.append((request.path, body))
        status, answer = routes[(request.method, request.path)](server, body)
        if isinstance(answer, str):  # a bare error page, as a server's unhandled exception gives
            return web.Response(text=answer, status=status)
        return web.json_response(answer, status=status)

    async with serving(server, routes, handle):
        yield server


@asynccontextmanager
async def serving(server: Server, routes: Any, handle: Callable[[web.Request], Any]) -> AsyncIterator[Server]:
    """``handle`` answering every ``(method, path)`` of ``routes`` on 127.0.0.1, at
    ``server.url`` while the block runs."""
    app = web.Application()
    for method, path in routes:
        app.router.add_route(method, path, handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    server.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield server
    finally:
        await runner.cleanup()


# ---- vLLM ----


@dataclass(frozen=True)
class Vllm:
    """One vLLM release's behaviour for the fields FOCUS relies on."""

    #: 0.10.2 and later: ``return_token_ids`` gives ``token_ids``/``prompt_token_ids``.
    token_ids_field: bool = True
    #: 0.8 and later: ``return_tokens_as_token_ids`` is a request field.
    ids_as_request_field: bool = True
    #: The server flag ``--return-tokens-as-token-ids`` (from 0.5.4).
    ids_flag: bool = False
    served_name: str = "Qwen/Qwen3-4B"
    root: str = "Qwen/Qwen3-4B"
    #: More names of the base model (``--served-model-name policy alias``); answers give the first.
    aliases: tuple[str, ...] = ()
    #: The model's ``generation_config.json`` (``--generation-config auto``): the default
    #: of a sampling field a request leaves out (``CompletionRequest.to_sampling_params``).
    generation_config: tuple[tuple[str, float], ...] = (("top_k", 20), ("repetition_penalty", 1.05))


#: vLLM's own defaults of the sampling fields (``_DEFAULT_SAMPLING_PARAMS``).
VLLM_DEFAULTS = {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "temperature": 1.0}
VLLM_DEFAULTS.update(top_p=1.0, top_k=0, min_p=0.0)
#: What FOCUS's requests must sample with: its temperature and top_p, nothing else on.
OFF = {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "top_k": -1, "min_p": 0.0}


def effective(body: dict[str, Any], server_defaults: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """The sampling fields a server samples with: the request's, else the server's default, else its own."""
    return {k: body[k] if body.get(k) is not None else server_defaults.get(k, d) for k, d in defaults.items()}


def vllm_error(message: str, kind: str, code: int) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": "model", "code": code}}


def vllm_routes(v: Vllm) -> dict[tuple[str, str], Any]:
    def complete(server: Server, body: dict[str, Any]) -> tuple[int, Any]:
        if body.get("model") not in (None, v.served_name, *v.aliases, "adapter"):
            return 404, vllm_error(f"The model `{body['model']}` does not exist.", "NotFoundError", 404)
        temperature = body.get("temperature")
        if temperature is not None and 0 < temperature < 0.01:
            temperature = 0.01  # SamplingParams.__post_init__ (_MAX_TEMP): a warning in its own log only
        if temperature is not None and temperature < 1e-5 and body.get("n", 1) > 1:
            # SamplingParams._verify_greedy_sampling, raised as the request's ValueError
            message = f"n must be 1 when using greedy sampling, got {body['n']}."
            return 400, {"error": {"message": message, "type": "BadRequestError", "param": None, "code": 400}}
        server.used.append(effective({**body, "temperature": temperature}, dict(v.generation_config), VLLM_DEFAULTS))
        as_ids = v.ids_flag or (v.ids_as_request_field and bool(body.get("return_tokens_as_token_ids")))
        choices = []
        for i in range(body.get("n", 1)):
            seed = body["seed"] + i  # vLLM: child i of a seeded request samples with seed + i
            ids, lps, stopped = draw(body["prompt"], seed, body["max_tokens"])
            server.sampled.append((ids, lps))
            names = [f"token_id:{t}" if as_ids else chr(t) for t in ids]
            choice = {
                "index": i,
                "text": "".join(chr(t) for t in ids if t != EOT),
                "logprobs": {
                    "text_offset": list(range(len(ids))),
                    "token_logprobs": lps,
                    "tokens": names,
                    # another token ranked first: the sampled one's log-prob is token_logprobs
                    "top_logprobs": [
                        {"token_id:7" if as_ids else "\x07": -0.01, n: lp} for n, lp in zip(names, lps, strict=True)
                    ],
                },
                "finish_reason": "stop" if stopped else "length",
                "stop_reason": EOT if stopped else None,  # the stop_token_ids entry that matched
                "prompt_logprobs": None,
            }
            if v.token_ids_field:
                wants = bool(body.get("return_token_ids"))
                choice.update(token_ids=ids if wants else None, prompt_token_ids=body["prompt"] if wants else None)
            choices.append(choice)
        n_out = sum(len(s[0]) for s in server.sampled[-len(choices) :])
        return 200, {
            "id": "cmpl-0",
            "object": "text_completion",
            "created": 1,
            "model": "adapter" if body.get("model") == "adapter" else v.served_name,  # the first served name
            "choices": choices,
            "service_tier": None,
            "system_fingerprint": None,
            "usage": {
                "prompt_tokens": len(body["prompt"]),
                "total_tokens": len(body["prompt"]) + n_out,
                "completion_tokens": n_out,
                "prompt_tokens_details": None,
            },
            "kv_transfer_params": None,
        }

    def models(server: Server, body: dict[str, Any]) -> tuple[int, Any]:
        card = {"id": v.served_name, "object": "model", "created": 1, "owned_by": "vllm", "root": v.root}
        card.update(parent=None, max_model_len=4096, permission=[])
        lora = {"id": "adapter", "object": "model", "created": 1, "owned_by": "vllm", "root": "/loras/a"}
        lora.update(parent=v.served_name, max_model_len=None, permission=[])
        more = [{**card, "id": name} for name in v.aliases]
        return 200, {"object": "list", "data": [card, *more, lora]}

    return {("POST", "/v1/completions"): complete, ("GET", "/v1/models"): models}


def make_agent(policy: Any, temperature: float = 1.0) -> Agent:
    policy.vocab_size = FORMAT.codec.vocab_size
    sampling = SamplingParams(max_tokens=3, temperature=temperature)
    return Agent(
        policy,
        ReachTarget(),
        FORMAT,
        context=AppendOnly(),
        branch_points=EveryDecision(),
        max_steps=4,
        sampling=sampling,
    )


async def rollout(policy: Any, seed: int = 11) -> Any:
    agent = make_agent(policy)
    try:
        root = await agent.start(Task("reach-9", {"target": 9}))
        return await agent.rollout(root, seed=seed)
    finally:
        await policy.aclose()


def check_exact(ro: Any, server: Server, prompts: list[list[int]]) -> None:
    """The turns hold the ids and log-probs the server sampled, in order; each request
    sent exactly the recorded prompt, which extends the turn before it by its ids."""
    turns = ro.turns
    assert turns and all(p.kind != "failed" for p in ro.pieces), ro.pieces
    assert [(list(t.completion_ids), list(t.logprobs)) for t in turns] == server.sampled
    assert prompts == [list(t.prompt_ids) for t in turns]
    for a, b in zip(turns, turns[1:], strict=False):
        assert list(b.prompt_ids[: len(a.prompt_ids) + len(a.completion_ids)]) == [*a.prompt_ids, *a.completion_ids]


VLLM_RELEASES = {
    "0.10.2+": Vllm(),
    "0.8-0.10.1": Vllm(token_ids_field=False),
    "0.7 --return-tokens-as-token-ids": Vllm(token_ids_field=False, ids_as_request_field=False, ids_flag=True),
}


@pytest.mark.parametrize("release", sorted(VLLM_RELEASES))
def test_a_rollout_against_vllm_records_the_sampled_ids_and_logprobs(release):
    v = VLLM_RELEASES[release]

    async def go() -> None:
        async with serve(vllm_routes(v)) as server:
            ro = await rollout(OpenAICompatPolicy(server.url, v.served_name, config=FAST))
            check_exact(ro, server, server.prompts("/v1/completions", "prompt"))
            body = server.bodies[0][1]
            assert body["logprobs"] == 0 and body["return_token_ids"] and body["return_tokens_as_token_ids"]
            assert EOT in body["stop_token_ids"] and body["skip_special_tokens"] is False
            assert all(t.policy_version == v.served_name for t in ro.turns)
            # the model's generation_config.json never reaches a sample: the request sets every field
            assert server.used and all(u == {**OFF, "temperature": 1.0, "top_p": 1.0} for u in server.used)

    run(go())


def test_a_vllm_that_names_tokens_by_text_stops_with_the_flag_to_set():
    """vLLM before 0.8 started without ``--return-tokens-as-token-ids`` ignores both id
    fields FOCUS sends and names log-prob tokens by their text: no ids to record, and
    re-tokenising text is what FOCUS never does. The collection stops with one line
    that names the server flag (it named only the token it could not read)."""
    v = Vllm(token_ids_field=False, ids_as_request_field=False)

    async def go() -> None:
        async with serve(vllm_routes(v)) as server:
            with pytest.raises(UnreadableAnswers) as e:
                await rollout(OpenAICompatPolicy(server.url, v.served_name, config=FAST))
        line = str(e.value)
        assert "\n" not in line and "--return-tokens-as-token-ids" in line and "vLLM >= 0.8" in line, line

    run(go())


def grouping_policy(server: Server) -> OpenAICompatPolicy:
    """An OpenAI-compatible client of ``server`` that sends siblings' first calls as one request."""
    policy = OpenAICompatPolicy(server.url, "Qwen/Qwen3-4B", config=FAST.model_copy(update={"group_siblings": True}))
    policy.vocab_size = FORMAT.codec.vocab_size
    return policy


def test_n_samples_with_a_seed_are_one_request_as_vllm_answers_them():
    """vLLM samples choice ``i`` of a seeded request with ``seed + i``: FOCUS sends
    siblings as one request (after one check of the rule) and records each choice's ids."""

    async def go() -> None:
        async with serve(vllm_routes(Vllm())) as server:
            policy = grouping_policy(server)
            prompt = FORMAT.codec.render([])
            params = SamplingParams(max_tokens=3, seed=40)
            try:
                for _ in range(2):
                    got = await policy.sample_siblings(prompt, params, [("a",), ("b",), ("c",)])
                    assert [list(c.token_ids) for c in got] == [draw(prompt, 40 + i, 3)[0] for i in range(3)]
                    assert [list(c.logprobs) for c in got] == [draw(prompt, 40 + i, 3)[1] for i in range(3)]
            finally:
                await policy.aclose()
            ns = [b.get("n") for p, b in server.bodies if p == "/v1/completions"]
            assert sorted(ns) == [1, 3, 3]  # the first grouped request and its check, then one request

    run(go())


def test_siblings_at_temperature_0_go_one_request_each_as_vllm_refuses_n_when_greedy():
    """vLLM samples greedily below temperature 1e-5 and refuses a greedy request for
    ``n`` > 1 with status 400 ("n must be 1 when using greedy sampling", every release:
    ``SamplingParams._verify_greedy_sampling``). The first calls of sibling rollouts
    went as one such request, so at temperature 0 (an evaluation) each of them failed
    as a refused request; now they go one request each, as they would ungrouped."""

    async def go() -> None:
        async with serve(vllm_routes(Vllm())) as server:
            policy = grouping_policy(server)
            prompt = FORMAT.codec.render([])
            params = SamplingParams(max_tokens=3, seed=40, temperature=0.0)
            try:
                got = await policy.sample_siblings(prompt, params, [("a",), ("b",), ("c",)])
            finally:
                await policy.aclose()
            assert [list(c.token_ids) for c in got] == [draw(prompt, 40 + i, 3)[0] for i in range(3)]
            assert [b.get("n") for p, b in server.bodies if p == "/v1/completions"] == [1, 1, 1]

    run(go())


def test_a_server_that_refuses_n_gets_one_request_per_sibling_after_one_warning(caplog):
    """A server, router or gateway that refuses ``n`` > 1 (one that maps one request to
    one answer) answered the first
    grouped request of every sibling set with 400: the check of vLLM's seed rule failed
    with it and stayed undecided, so every grouped call was refused and its rollouts
    failed. Now a refused grouped request whose lone sample was answered is one
    warning, and the calls go one by one from then on."""
    routes = vllm_routes(Vllm())
    complete = routes[("POST", "/v1/completions")]

    def no_n(server: Server, body: dict[str, Any]) -> tuple[int, Any]:
        if body.get("n", 1) > 1:
            message = f"n must be 1 (parallel sampling is not supported), got {body['n']}"
            return 400, {"error": {"message": message, "type": "BadRequestError", "param": "n", "code": 400}}
        return complete(server, body)

    async def go() -> None:
        async with serve({**routes, ("POST", "/v1/completions"): no_n}) as server:
            config = FAST.model_copy(update={"group_siblings": True})
            policy = OpenAICompatPolicy(server.url, "Qwen/Qwen3-4B", config=config)
            policy.vocab_size = FORMAT.codec.vocab_size
            prompt = FORMAT.codec.render([])
            try:
                for seed in (40, 50):
                    params = SamplingParams(max_tokens=3, seed=seed)
                    got = await policy.sample_siblings(prompt, params, [("a",), ("b",), ("c",)])
                    assert [list(c.token_ids) for c in got] == [draw(prompt, seed + i, 3)[0] for i in range(3)]
            finally:
                await policy.aclose()
            assert [b.get("n") for p, b in server.bodies if p == "/v1/completions"].count(
                3
            ) == 1  # asked once, then one by one

    with caplog.at_level("WARNING", logger="focus.backends.http_policy"):
        run(go())
    warned = [r.getMessage() for r in caplog.records if "n samples" in r.getMessage()]
    assert len(warned) == 1 and "it refused n = 3" in warned[0] and "status 400" in warned[0], warned


def test_a_model_name_vllm_does_not_serve_is_one_line_before_and_a_refusal_after():
    from focus.backends.openai_compat import unserved_model
    from focus.policy import PolicyError

    async def go() -> None:
        import asyncio

        async with serve(vllm_routes(Vllm())) as server:
            line = await asyncio.to_thread(unserved_model, server.url, "focus-tinylm")
            assert line == (
                f"model.model 'focus-tinylm' is not served at {server.url} (it serves 'Qwen/Qwen3-4B', 'adapter'); "
                "set it, e.g. --set model.model=Qwen/Qwen3-4B"
            )
            assert await asyncio.to_thread(unserved_model, f"{server.url}/v1", "adapter") is None
            policy = OpenAICompatPolicy(server.url, config=FAST)
            with pytest.raises(PolicyError, match="status 404.*The model `focus-tinylm` does not exist"):
                try:
                    await policy.sample([1, 2], SamplingParams(max_tokens=2, seed=1))
                finally:
                    await policy.aclose()

    run(go())


@pytest.mark.parametrize(
    "v, model",
    [
        (
            Vllm(served_name="policy", root="/models/qwen3-4b"),
            "policy",
        ),  # vllm serve /models/qwen3-4b --served-model-name policy
        (Vllm(), "adapter"),  # a LoRA adapter (--lora-modules adapter=/loras/a): listed after the base model
        (Vllm(served_name="policy", aliases=("alias",)), "alias"),  # --served-model-name policy alias
    ],
)
def test_a_fleet_of_vllm_replicas_samples_when_the_served_name_is_not_the_weights_path(v, model):
    """The fleet compares the version each replica reports before the first call with
    the version each answer names. vLLM's answers name the served model (``model``);
    its ``/v1/models`` card names that as ``id`` and the weights' path as ``root``. The
    fleet took ``root`` of the first card, so a server started with
    ``--served-model-name``, or a LoRA adapter as ``model.model``, failed every call as
    "answered with weights policy, the other replicas' are /models/qwen3-4b"."""

    async def go() -> None:
        async with serve(vllm_routes(v)) as a, serve(vllm_routes(v)) as b:
            fleet = FleetPolicy([OpenAICompatPolicy(s.url, model, config=FAST) for s in (a, b)])
            ro = await rollout(fleet)
            assert [p.kind for p in ro.pieces][-1] == "truncated" and all(p.kind != "failed" for p in ro.pieces)
            named = "policy" if model == "alias" else model  # vLLM's answers give the first served name
            # with the root its card names for it where that is not the name (test_weights_restart.py)
            named += {"policy": "@/models/qwen3-4b", "adapter": "@/loras/a", "alias": "@Qwen/Qwen3-4B"}[model]
            assert {t.policy_version for t in ro.turns} == {named} and fleet.policy_version == named

    run(go())


# ---- SGLang ----


#: ``--preferred-sampling-params`` (or the model's ``generation_config.json``): the
#: default of each field a request leaves out.
SGLANG_PREFERRED = {"top_k": 20, "repetition_penalty": 1.05}
SGLANG_DEFAULTS = {**OFF, "temperature": 1.0, "top_p": 1.0}


def sglang_routes(completions_token_ids: bool = True, weight_version: str = "default") -> dict[tuple[str, str], Any]:
    def sample(server: Server, prompt: list[int], sp: dict[str, Any]) -> tuple[list[int], list[float], dict[str, Any]]:
        server.used.append(effective(sp, SGLANG_PREFERRED, SGLANG_DEFAULTS))
        ids, lps, stopped = draw(prompt, sp.get("sampling_seed") or 0, sp["max_new_tokens"])  # unseeded: any draw
        server.sampled.append((ids, lps))
        return ids, lps, ({"type": "stop", "matched": EOT} if stopped else {"type": "length", "length": len(ids)})

    def generate(server: Server, body: dict[str, Any]) -> tuple[int, Any]:
        ids, lps, finish = sample(server, body["input_ids"], body["sampling_params"])
        meta = {
            "id": "0c7e",
            "finish_reason": finish,
            "prompt_tokens": len(body["input_ids"]),
            "weight_version": weight_version,
            "completion_tokens": len(ids),
            "cached_tokens": 0,
            "e2e_latency": 0.01,
            "input_token_logprobs": [],
            "output_token_logprobs": [
                [lp, t, None] for lp, t in zip(lps, ids, strict=True)
            ],  # return_text_in_logprobs is off
        }
        return 200, {"text": "".join(chr(t) for t in ids if t != EOT), "output_ids": ids, "meta_info": meta}

    def completions(server: Server, body: dict[str, Any]) -> tuple[int, Any]:
        sp = {"sampling_seed": body.get("seed"), "max_new_tokens": body["max_tokens"]}
        ids, lps, finish = sample(server, body["prompt"], sp)
        choice = {
            "index": 0,
            "text": "".join(chr(t) for t in ids if t != EOT),
            "logprobs": {
                "text_offset": list(range(len(ids))),
                "token_logprobs": lps,
                "tokens": [chr(t) for t in ids],
                "top_logprobs": [],
            },
            "finish_reason": finish["type"],
            "matched_stop": finish.get("matched"),
        }
        if completions_token_ids and body.get("return_token_ids"):
            choice.update(token_ids=ids, prompt_token_ids=body["prompt"])
        usage = {
            "prompt_tokens": len(body["prompt"]),
            "completion_tokens": len(ids),
            "total_tokens": len(body["prompt"]) + len(ids),
        }
        return 200, {
            "id": "0c7e",
            "object": "text_completion",
            "created": 1,
            "model": body["model"],  # SGLang echoes the name it was sent
            "choices": [choice],
            "usage": usage,
            "metadata": {"weight_version": weight_version},
        }

    return {
        ("POST", "/generate"): generate,
        ("GET", "/get_weight_version"): lambda server, body: (200, {"weight_version": weight_version}),
        ("POST", "/v1/completions"): completions,
        ("GET", "/v1/models"): lambda s, b: (
            200,
            {"object": "list", "data": [{"id": "Qwen/Qwen3-4B", "owned_by": "sglang", "root": "Qwen/Qwen3-4B"}]},
        ),
    }


def test_a_rollout_against_sglang_generate_records_the_sampled_ids_and_logprobs():
    async def go() -> None:
        async with serve(sglang_routes(weight_version="step-3")) as server:
            ro = await rollout(SGLangPolicy(server.url, config=FAST))
            check_exact(ro, server, server.prompts("/generate", "input_ids"))
            body = server.bodies[0][1]
            assert body["return_logprob"] is True and body["stream"] is False
            sp = body["sampling_params"]
            assert sp["sampling_seed"] == 11 and sp["max_new_tokens"] == 3 and EOT in sp["stop_token_ids"]
            assert {t.policy_version for t in ro.turns} == {"step-3"}
            assert server.used and all(u == SGLANG_DEFAULTS for u in server.used)

    run(go())


def test_a_fleet_of_current_sglang_replicas_asks_model_info_for_their_weight_versions():
    """SGLang since late 2025 answers ``/get_weight_version`` with 404 ("deprecated.
    Please use '/model_info' instead"): a fleet's check of its replicas' weights before
    the first call asked it alone, got refusals, and checked nothing."""

    def current(weight_version: str) -> dict[tuple[str, str], Any]:
        routes = sglang_routes(weight_version=weight_version)
        gone = "Endpoint '/get_weight_version' or '/weight_version' is deprecated. Please use '/model_info' instead."
        routes[("GET", "/get_weight_version")] = lambda s, b: (404, {"detail": gone})
        routes[("GET", "/model_info")] = lambda s, b: (
            200,
            {"model_path": "Qwen/Qwen3-4B", "is_generation": True, "weight_version": weight_version},
        )
        return routes

    async def version(url: str) -> str | None:
        policy = SGLangPolicy(url, config=FAST)
        try:
            return await policy.served_version()
        finally:
            await policy.aclose()

    async def go() -> None:
        async with serve(current("default")) as a, serve(current("step-9")) as b:
            assert await version(a.url) == "default@Qwen/Qwen3-4B"  # the default version: with its model_path
            fleet = FleetPolicy([SGLangPolicy(s.url, config=FAST) for s in (a, b)])
            with pytest.raises(ReplicasDiffer, match="serve different weights.*default.*step-9"):
                await fleet.verify()
            await fleet.aclose()
        async with serve(sglang_routes(weight_version="step-3")) as old:  # a release before /model_info
            assert await version(old.url) == "step-3"

    run(go())


def test_a_fleet_of_sglang_replicas_checks_their_weight_versions():
    async def go() -> None:
        async with serve(sglang_routes()) as a, serve(sglang_routes()) as b:
            ro = await rollout(FleetPolicy([SGLangPolicy(s.url, config=FAST) for s in (a, b)]))
            assert all(p.kind != "failed" for p in ro.pieces) and {t.policy_version for t in ro.turns} == {"default"}
        async with serve(sglang_routes()) as a, serve(sglang_routes(weight_version="step-9")) as b:
            fleet = FleetPolicy([SGLangPolicy(s.url, config=FAST) for s in (a, b)])
            with pytest.raises(ReplicasDiffer, match="serve different weights.*default.*step-9"):
                await fleet.verify()
            await fleet.aclose()

    run(go())


def test_sglang_openai_completions_with_token_ids_work_and_without_them_say_which_kind_to_use():
    """SGLang's ``/v1/completions`` names log-prob tokens by text; versions with
    ``return_token_ids`` add the sampled ids, which is all FOCUS needs. Older ones give
    no ids: the collection stops with one line naming ``model.kind = sglang``."""

    async def go() -> None:
        async with serve(sglang_routes()) as server:
            ro = await rollout(OpenAICompatPolicy(server.url, "Qwen/Qwen3-4B", config=FAST))
            check_exact(ro, server, server.prompts("/v1/completions", "prompt"))
        async with serve(sglang_routes(completions_token_ids=False)) as server:
            with pytest.raises(UnreadableAnswers) as e:
                await rollout(OpenAICompatPolicy(server.url, "Qwen/Qwen3-4B", config=FAST))
        assert "model.kind = sglang" in str(e.value), e.value

    run(go())


def test_sglang_openai_completions_record_the_weights_version_sglang_names():
    """SGLang's ``/v1/completions`` answers ``model`` with the name asked for and names
    the weights that sampled in ``metadata.weight_version``: every turn was recorded
    with the model's name, so a weights update (``update_weights_from_disk`` with a
    ``weight_version``) went unseen, and a fleet of replicas on different weights
    passed its check."""

    async def go() -> None:
        async with serve(sglang_routes(weight_version="step-3")) as server:
            ro = await rollout(OpenAICompatPolicy(server.url, "Qwen/Qwen3-4B", config=FAST))
            check_exact(ro, server, server.prompts("/v1/completions", "prompt"))
            assert {t.policy_version for t in ro.turns} == {"step-3"}
        async with (
            serve(sglang_routes(weight_version="step-3")) as a,
            serve(sglang_routes(weight_version="step-3")) as b,
        ):
            ro = await rollout(FleetPolicy([OpenAICompatPolicy(s.url, "Qwen/Qwen3-4B", config=FAST) for s in (a, b)]))
            assert all(p.kind != "failed" for p in ro.pieces) and {t.policy_version for t in ro.turns} == {"step-3"}
        async with serve(sglang_routes()) as a, serve(sglang_routes(weight_version="step-9")) as b:
            fleet = FleetPolicy([OpenAICompatPolicy(s.url, "Qwen/Qwen3-4B", config=FAST) for s in (a, b)])
            with pytest.raises(ReplicasDiffer, match="serve different weights.*default.*step-9"):
                await fleet.verify()
            await fleet.aclose()

    run(go())


def test_vllm_finish_reasons_as_recorded():
    """``repetition`` (a request with ``repetition_detection``) ended the sample at a
    place its own tokens decide, as ``length`` does; it was an unknown finish reason, a
    bad response retried until the rollout failed."""
    from focus.backends.openai_compat import parse_completion

    def answer(finish: str, stop_reason: Any) -> dict[str, Any]:
        lp = {"text_offset": [0], "token_logprobs": [-0.5], "tokens": ["token_id:49"], "top_logprobs": [None]}
        choice = {"index": 0, "text": "1", "logprobs": lp, "finish_reason": finish, "stop_reason": stop_reason}
        return {
            "id": "cmpl-0",
            "object": "text_completion",
            "created": 1,
            "model": "m",
            "choices": [choice],
            "usage": {},
        }

    got = [
        parse_completion(answer(f, r)).finish_reason
        for f, r in [("stop", EOT), ("stop", "</s>"), ("length", None), ("repetition", None)]
    ]
    assert got == ["stop", "stop", "length", "length"]


def old_sglang(fail_all: bool = False) -> dict[tuple[str, str], Any]:
    """SGLang before ``sampling_seed``: ``SamplingParams(**sampling_params)`` raises
    ``TypeError`` on the field it lacks, and ``/generate`` catches only ``ValueError``:
    FastAPI's bare 500. (``fail_all``: a server that fails every request so.)"""
    routes = sglang_routes()
    generate = routes[("POST", "/generate")]

    def answer(server: Server, body: dict[str, Any]) -> tuple[int, Any]:
        if fail_all or "sampling_seed" in body["sampling_params"]:
            return 500, "Internal Server Error"
        return generate(server, body)

    return {**routes, ("POST", "/generate"): answer}


def test_an_sglang_without_sampling_seed_stops_with_one_line_not_an_outage():
    """Every seeded request got a 500, which read as an outage of the model service
    (``ServiceUnavailable`` after the retries, then the wave's outage). Now the call
    that gave up asks once without the seed: answered, the collection stops with one
    line that says what the server lacks; refused too, it is the outage it was."""
    from focus.policy import ServiceUnavailable

    async def go() -> None:
        async with serve(old_sglang()) as server:
            with pytest.raises(UnreadableAnswers) as e:
                await rollout(SGLangPolicy(server.url, config=FAST))
            assert str(e.value) == (
                f"the SGLang server at {server.url}/generate answered a request carrying sampling_seed with status 500 "
                "on every try and the same request without it: it predates per-request seeds (September 2025), "
                "which FOCUS sends with every request; run a later SGLang release"
            )
            asked = [b["sampling_params"] for _, b in server.bodies]
            assert ["sampling_seed" in sp for sp in asked] == [True] * 7 + [False] and asked[-1]["max_new_tokens"] == 1
        async with serve(old_sglang(fail_all=True)) as server:
            policy = SGLangPolicy(server.url, config=FAST)
            policy.vocab_size = FORMAT.codec.vocab_size
            try:
                with pytest.raises(ServiceUnavailable, match="status 500"):
                    await policy.sample([1, 2], SamplingParams(max_tokens=2, seed=3))
            finally:
                await policy.aclose()

    run(go())
