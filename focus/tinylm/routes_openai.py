"""vLLM's OpenAI-compatible routes: completions, chat completions, models, tokenizer.

Prompts are token ids (or text, encoded as bytes), one or a batch; each prompt is
sampled ``n`` times (sample ``j`` with ``seed + j``); choices are numbered
``prompt_index * n + j`` as vLLM numbers them. ``logprobs: k`` returns the sampled
token's log-prob and the top ``k`` (vLLM's completions layout: the sampled token first
in each ``top_logprobs`` dict), ``text_offset`` the character offset of each token's
text; ``echo`` prepends the prompt (with its log-probs when ``logprobs`` is set);
``prompt_logprobs`` returns vLLM's per-prompt-token dicts. Streaming answers are
server-sent events as vLLM sends them (``data: {json}`` chunks, then ``data: [DONE]``).
Chat messages are rendered with the model's codec (:class:`focus.format.ByteCodec`);
``return_token_ids`` returns the exact prompt and completion ids.
"""

from __future__ import annotations

import functools
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from focus.env import Message
from focus.tinylm.engine import GenRequest, GenResult, TokenEvent
from focus.tinylm.protocol import (
    ChatCompletionLogProb,
    ChatCompletionLogProbs,
    ChatCompletionLogProbsContent,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatMessage,
    ChatMessageParam,
    CompletionLogProbs,
    CompletionRequest,
    CompletionResponse,
    CompletionResponseChoice,
    DetokenizeRequest,
    DetokenizeResponse,
    Logprob,
    ModelCard,
    ModelList,
    PromptTokenUsageInfo,
    RequestError,
    TokenizeRequest,
    TokenizeResponse,
    UsageInfo,
)
from focus.tinylm.serving import (
    Routes,
    ServerState,
    TextStream,
    finite,
    parse,
    results,
    run,
    stop_reason,
    token_str,
    token_text,
    trim_stop,
)


def _uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


def router(state: ServerState) -> list[Route]:
    """The route table, each handler bound to ``state``."""
    r = Routes()
    for method, path, handler in ROUTES:
        add = r.get if method == "GET" else r.post
        add(path)(functools.partial(handler, state))
    return r.routes


async def _models(state: ServerState, request: Request) -> dict[str, Any]:
    engine = state.engine
    card = ModelCard(id=state.model_name, owned_by="focus", root=engine.weights_path, max_model_len=engine.max_len)
    out = ModelList(data=[card]).model_dump()
    out["data"][0]["policy_version"] = engine.policy_version
    out["data"][0]["vocab_size"] = engine.vocab_size  # clients check sampled ids against it
    return out


async def _completions(state: ServerState, request: Request) -> Any:
    engine = state.engine
    req = await parse(request, CompletionRequest)
    req.check()
    state.check_model(req.model)
    prompts = _prompt_ids(req.prompt, engine.codec.encode_text)
    n = req.n or 1
    k = _top(req.logprobs, engine.vocab_size)
    plp = req.prompt_logprobs
    if plp is None and req.echo and req.logprobs is not None:
        plp = req.logprobs
    gen = [
        _gen_request(req, p, j, req.max_tokens if req.max_tokens is not None else 16, k, plp, engine.vocab_size)
        for p in prompts
        for j in range(n)
    ]
    for g in gen:
        engine.check(g)
    if req.stream:
        return _sse(_stream_completion(state, req, gen))
    res = await results(state, gen, request)
    choices = [_completion_choice(req, i, g, rr) for i, (g, rr) in enumerate(zip(gen, res, strict=True))]
    out = CompletionResponse(model=state.model_name, choices=choices, usage=_usage(gen[::n], res, n)).model_dump()
    out["policy_version"] = res[0].policy_version
    return out


async def _chat(state: ServerState, request: Request) -> Any:
    engine = state.engine
    req = await parse(request, ChatCompletionRequest)
    req.check()
    state.check_model(req.model)
    prompt = _render(req.messages, req.add_generation_prompt, req.continue_final_message)
    requested = req.requested_max_tokens()
    max_tokens = requested if requested is not None else engine.max_len - len(prompt)
    k = _top(req.top_logprobs if req.logprobs else None, engine.vocab_size)
    gen = [
        _gen_request(req, prompt, j, max_tokens, k, req.prompt_logprobs, engine.vocab_size) for j in range(req.n or 1)
    ]
    for g in gen:
        engine.check(g)
    if req.stream:
        return _sse(_stream_chat(state, req, gen))
    res = await results(state, gen, request)
    prefix = req.messages[-1].text() if req.echo and req.messages[-1].role == "assistant" else ""
    choices = []
    for i, rr in enumerate(res):
        text = trim_stop(token_text(rr.token_ids, req.skip_special_tokens), rr, req.include_stop_str_in_output)
        choices.append(
            ChatCompletionResponseChoice(
                index=i,
                message=ChatMessage(role="assistant", content=prefix + text),
                logprobs=_chat_logprobs(rr, req) if req.logprobs else None,
                finish_reason=rr.finish_reason,
                stop_reason=stop_reason(rr),
                token_ids=list(rr.token_ids) if req.return_token_ids else None,
            )
        )
    out = ChatCompletionResponse(
        model=state.model_name,
        choices=choices,
        usage=_usage(gen[:1], res, len(res)),
        prompt_logprobs=_prompt_logprobs(res[0], prompt) if req.prompt_logprobs is not None else None,
        prompt_token_ids=list(prompt) if req.return_token_ids else None,
    ).model_dump()
    out["policy_version"] = res[0].policy_version
    return out


async def _tokenize(state: ServerState, request: Request) -> dict[str, Any]:
    engine = state.engine
    req = await parse(request, TokenizeRequest)
    req.check()
    state.check_model(req.model)
    if req.messages is not None:
        ids = list(_render(req.messages, req.add_generation_prompt, False))
    else:
        ids = engine.codec.encode_text(req.prompt or "")
    strs = [token_str(t) for t in ids] if req.return_token_strs else None
    return TokenizeResponse(count=len(ids), max_model_len=engine.max_len, tokens=ids, token_strs=strs).model_dump()


async def _detokenize(state: ServerState, request: Request) -> dict[str, Any]:
    engine = state.engine
    req = await parse(request, DetokenizeRequest)
    state.check_model(req.model)
    bad = [t for t in req.tokens if not 0 <= t < engine.vocab_size]
    if bad:
        raise RequestError(f"token ids {bad[:5]} are outside the vocabulary [0, {engine.vocab_size})", "tokens")
    return DetokenizeResponse(prompt=engine.codec.decode(req.tokens)).model_dump()


#: (method, path, handler): the routes :func:`router` serves.
ROUTES: tuple[tuple[str, str, Callable[[ServerState, Request], Awaitable[Any]]], ...] = (
    ("GET", "/v1/models", _models),
    ("POST", "/v1/completions", _completions),
    ("POST", "/v1/chat/completions", _chat),
    ("POST", "/tokenize", _tokenize),
    ("POST", "/detokenize", _detokenize),
)


# --- requests ------------------------------------------------------------------------------


def _prompt_ids(prompt: Any, encode: Any) -> list[tuple[int, ...]]:
    if isinstance(prompt, str):
        return [tuple(encode(prompt))]
    if prompt and isinstance(prompt[0], str):
        return [tuple(encode(p)) for p in prompt]
    if prompt and isinstance(prompt[0], list):
        if any(not p for p in prompt):
            raise RequestError("a prompt in the batch is empty", "prompt")
        return [tuple(p) for p in prompt]
    return [tuple(prompt)]


def _top(k: int | None, vocab: int) -> int:
    return 0 if k is None else vocab if k == -1 else k


def _gen_request(
    req: CompletionRequest | ChatCompletionRequest,
    prompt: tuple[int, ...],
    j: int,
    max_tokens: int,
    top: int,
    prompt_logprobs: int | None,
    vocab: int,
) -> GenRequest:
    return GenRequest(
        prompt_ids=prompt,
        max_tokens=max_tokens,
        temperature=req.temperature if req.temperature is not None else 1.0,
        top_p=req.top_p if req.top_p is not None else 1.0,
        top_k=req.top_k if req.top_k is not None else 0,
        min_p=req.min_p if req.min_p is not None else 0.0,
        stop=req.stops(),
        stop_token_ids=tuple(req.stop_token_ids or ()),
        seed=None if req.seed is None else req.seed + j,
        ignore_eos=req.ignore_eos,
        min_tokens=req.min_tokens,
        logprobs=top,
        prompt_logprobs=_top(prompt_logprobs, vocab) if prompt_logprobs is not None else None,
    )


def _render(messages: Sequence[ChatMessageParam], add_generation_prompt: bool, continue_final: bool) -> tuple[int, ...]:
    from focus.format import ByteCodec

    msgs = []
    for m in messages:
        role = _ROLES.get(m.role)
        if role is None:
            raise RequestError(f"unknown message role {m.role!r}; known: {sorted(_ROLES)}", "messages")
        msgs.append(Message(role, m.text()))
    ids = ByteCodec().render(msgs, add_generation_prompt=add_generation_prompt and not continue_final)
    if continue_final and ids and ids[-1] == ByteCodec.EOT:
        return tuple(ids[:-1])
    return tuple(ids)


def _usage(gens: Sequence[GenRequest], res: Sequence[GenResult], n: int = 1) -> UsageInfo:
    """Prompt tokens once per prompt (``gens``: one request per prompt), completion tokens
    of every choice; cached tokens as the first sample of each prompt found them."""
    prompt = sum(len(g.prompt_ids) for g in gens)
    completion = sum(len(r.token_ids) for r in res)
    cached = sum(r.cached_tokens for r in res[::n])
    return UsageInfo(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        prompt_tokens_details=PromptTokenUsageInfo(cached_tokens=cached),
    )


# --- completions -----------------------------------------------------------------------------


def _top_dict(tok: int, lp: float, top: Sequence[tuple[int, float]], as_ids: bool) -> dict[str, float]:
    out = {token_str(tok, as_ids): finite(lp)}
    for t, v in top:
        out.setdefault(token_str(t, as_ids), finite(v))
    return out


def _completion_logprobs(
    req: CompletionRequest, g: GenRequest, res: GenResult, first: int = 0, offset: int = 0
) -> CompletionLogProbs:
    """Log-probs of sampled tokens ``first..`` (and of the prompt, if echoed and first == 0)."""
    as_ids = bool(req.return_tokens_as_token_ids)
    lp = CompletionLogProbs()
    if req.echo and first == 0 and res.prompt_logprobs is not None:
        for tok, entry in zip(g.prompt_ids, res.prompt_logprobs, strict=True):
            lp.tokens.append(token_str(tok, as_ids))
            lp.token_logprobs.append(None if entry is None else finite(entry.logprob))
            lp.top_logprobs.append(None if entry is None else _top_dict(tok, entry.logprob, entry.top, as_ids))
    for i in range(first, len(res.token_ids)):
        tok = res.token_ids[i]
        lp.tokens.append(token_str(tok, as_ids))
        lp.token_logprobs.append(finite(res.logprobs[i]))
        lp.top_logprobs.append(_top_dict(tok, res.logprobs[i], res.top_logprobs[i], as_ids))
    for t in lp.tokens:
        lp.text_offset.append(offset)
        offset += len(t)
    return lp


def _prompt_logprobs(res: GenResult, prompt: Sequence[int]) -> list[dict[int, Logprob] | None] | None:
    if res.prompt_logprobs is None:
        return None
    out: list[dict[int, Logprob] | None] = []
    for tok, entry in zip(prompt, res.prompt_logprobs, strict=True):
        if entry is None:
            out.append(None)
            continue
        d = {tok: Logprob(logprob=finite(entry.logprob), rank=entry.rank, decoded_token=token_str(tok))}
        for rank, (t, v) in enumerate(entry.top, start=1):
            d.setdefault(t, Logprob(logprob=finite(v), rank=rank, decoded_token=token_str(t)))
        out.append(d)
    return out


def _completion_choice(req: CompletionRequest, i: int, g: GenRequest, res: GenResult) -> CompletionResponseChoice:
    text = trim_stop(token_text(res.token_ids, req.skip_special_tokens), res, req.include_stop_str_in_output)
    if req.echo:
        text = token_text(g.prompt_ids, req.skip_special_tokens) + text
    return CompletionResponseChoice(
        index=i,
        text=text,
        logprobs=_completion_logprobs(req, g, res) if req.logprobs is not None else None,
        finish_reason=res.finish_reason,
        stop_reason=stop_reason(res),
        token_ids=list(res.token_ids) if req.return_token_ids else None,
        prompt_logprobs=_prompt_logprobs(res, g.prompt_ids) if req.prompt_logprobs is not None else None,
        prompt_token_ids=list(g.prompt_ids) if req.return_token_ids else None,
    )


# --- streaming -------------------------------------------------------------------------------
#
# Chunks are built as plain dicts in vLLM's layout: every choice names ``logprobs``,
# ``finish_reason`` and ``stop_reason`` (null until its last chunk; vLLM sets them on
# every choice it streams, as OpenAI does), and a completion choice also
# ``prompt_token_ids`` and ``token_ids``. The token that ends a choice comes with its
# result, in the choice's last chunk. Each chunk names the version of the weights that
# sampled its tokens. (Building dicts rather than protocol models keeps a chunk's cost
# small beside the engine's step; tests validate the chunks with the protocol models.)


def _sse(chunks: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(chunks, media_type="text/event-stream")


def _data(obj: Any) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


def _chunks(head: dict[str, Any]) -> Any:
    """``chunk(choice, version)``: the event of one choice under ``head``, whose JSON is
    written once per stream rather than once per token."""
    pre = f'data: {json.dumps(head, separators=(",", ":"))[:-1]},"choices":['

    def chunk(choice: dict[str, Any], version: str) -> str:
        return f'{pre}{json.dumps(choice, separators=(",", ":"))}],"policy_version":{json.dumps(version)}}}\n\n'

    return chunk


Toks = list[tuple[int, float, Sequence[tuple[int, float]]]]


def _rest(res: GenResult, sent: int) -> Toks:
    """The tokens of ``res`` after the first ``sent`` (streamed before it)."""
    return [(res.token_ids[k], res.logprobs[k], res.top_logprobs[k]) for k in range(sent, len(res.token_ids))]


def _text_stream(req: CompletionRequest | ChatCompletionRequest) -> TextStream:
    return TextStream(req.stops(), req.skip_special_tokens, req.include_stop_str_in_output)


def _error_event(e: Exception) -> str:
    return _data({"error": {"message": str(e), "type": "InternalServerError", "param": None, "code": 500}})


async def _stream_completion(state: ServerState, req: CompletionRequest, gen: list[GenRequest]) -> AsyncIterator[str]:
    head = {"id": _uid("cmpl"), "object": "text_completion", "created": int(time.time()), "model": state.model_name}
    texts = [_text_stream(req) for _ in gen]
    offsets, sent = [0] * len(gen), [0] * len(gen)
    started = [False] * len(gen)
    done: list[GenResult | None] = [None] * len(gen)
    as_ids = bool(req.return_tokens_as_token_ids)
    chunk = _chunks(head)

    def emit(i: int, toks: Toks, text: str, version: str, finish: str | None = None, stop: Any = None) -> str:
        prompt_ids = None
        if not started[i]:  # the echoed prompt and the prompt ids come with a choice's first chunk
            started[i] = True
            if req.echo:
                echo = token_text(gen[i].prompt_ids, req.skip_special_tokens)
                text, offsets[i] = echo + text, len(echo)
            if req.return_token_ids:
                prompt_ids = list(gen[i].prompt_ids)
        lp: dict[str, list[Any]] | None = None
        if req.logprobs is not None:
            lp = {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
            for tok, logprob, top in toks:
                s = token_str(tok, as_ids)
                lp["text_offset"].append(offsets[i])
                lp["token_logprobs"].append(finite(logprob))
                lp["tokens"].append(s)
                lp["top_logprobs"].append(_top_dict(tok, logprob, top, as_ids))
                offsets[i] += len(s)
        choice = {
            "index": i,
            "text": text,
            "logprobs": lp,
            "finish_reason": finish,
            "stop_reason": stop,
            "prompt_token_ids": prompt_ids,
            "token_ids": [t for t, _, _ in toks] if req.return_token_ids else None,
        }
        return chunk(choice, version)

    try:
        async for i, ev in run(state, gen, stream=True):
            if isinstance(ev, TokenEvent):
                d = ev.draw
                sent[i] += 1
                yield emit(i, [(d.token, d.logprob, d.top)], texts[i].push(d.token), ev.version)
            elif isinstance(ev, GenResult):
                done[i] = ev
                rest, tail = _rest(ev, sent[i]), texts[i].finish(ev)
                yield emit(i, rest, tail, ev.policy_version, ev.finish_reason, stop_reason(ev))
    except Exception as e:  # noqa: BLE001 - the status line is sent; report in-band as vLLM does
        yield _error_event(e)
        yield "data: [DONE]\n\n"
        return
    if req.stream_options is not None and req.stream_options.include_usage:
        res = [r for r in done if r is not None]
        usage = _usage(gen[:: req.n or 1], res, req.n or 1)
        yield _data({**head, "choices": [], "usage": usage.model_dump()})
    yield "data: [DONE]\n\n"


async def _stream_chat(state: ServerState, req: ChatCompletionRequest, gen: list[GenRequest]) -> AsyncIterator[str]:
    head = {
        "id": _uid("chatcmpl"),
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": state.model_name,
    }
    texts = [_text_stream(req) for _ in gen]
    sent = [0] * len(gen)
    started = [False] * len(gen)
    done: list[GenResult | None] = [None] * len(gen)
    chunk = _chunks(head)

    def choice(i: int, delta: dict[str, Any], toks: Toks, finish: str | None = None, stop: Any = None) -> Any:
        lp = {"content": [_chat_entry(t, v, top, req).model_dump() for t, v, top in toks]} if req.logprobs else None
        return {
            "index": i,
            "delta": delta,
            "logprobs": lp,
            "finish_reason": finish,
            "stop_reason": stop,
            "token_ids": [t for t, _, _ in toks] if req.return_token_ids else None,
        }

    def emit(i: int, body: dict[str, Any], version: str) -> Iterator[str]:
        if not started[i]:  # a choice's role comes first, when its first token does (vLLM)
            started[i] = True
            first: dict[str, Any] = {**head, "choices": [choice(i, {"role": "assistant", "content": ""}, [])]}
            if req.return_token_ids:
                first["prompt_token_ids"] = list(gen[i].prompt_ids)
            yield _data({**first, "policy_version": version})
        yield chunk(body, version)

    try:
        async for i, ev in run(state, gen, stream=True):
            if isinstance(ev, TokenEvent):
                d = ev.draw
                sent[i] += 1
                body = choice(i, {"content": texts[i].push(d.token)}, [(d.token, d.logprob, d.top)])
                for out in emit(i, body, ev.version):
                    yield out
            elif isinstance(ev, GenResult):
                done[i] = ev
                delta = {"content": texts[i].finish(ev)}
                body = choice(i, delta, _rest(ev, sent[i]), ev.finish_reason, stop_reason(ev))
                for out in emit(i, body, ev.policy_version):
                    yield out
    except Exception as e:  # noqa: BLE001
        yield _error_event(e)
        yield "data: [DONE]\n\n"
        return
    if req.stream_options is not None and req.stream_options.include_usage:
        usage = _usage(gen[:1], [r for r in done if r is not None], len(gen))
        yield _data({**head, "choices": [], "usage": usage.model_dump()})
    yield "data: [DONE]\n\n"


# --- chat log-probs --------------------------------------------------------------------------


def _chat_entry(
    tok: int, lp: float, top: Sequence[tuple[int, float]], req: ChatCompletionRequest
) -> ChatCompletionLogProbsContent:
    as_ids = bool(req.return_tokens_as_token_ids)

    def one(t: int, v: float) -> ChatCompletionLogProb:
        s = token_str(t, as_ids)
        return ChatCompletionLogProb(token=s, logprob=finite(v), bytes=list(s.encode()))

    base = one(tok, lp)
    return ChatCompletionLogProbsContent(
        token=base.token, logprob=base.logprob, bytes=base.bytes, top_logprobs=[one(t, v) for t, v in top]
    )


def _chat_logprobs(res: GenResult, req: ChatCompletionRequest) -> ChatCompletionLogProbs:
    return ChatCompletionLogProbs(
        content=[
            _chat_entry(t, lp, top, req)
            for t, lp, top in zip(res.token_ids, res.logprobs, res.top_logprobs, strict=True)
        ]
    )
