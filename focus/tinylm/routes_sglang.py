"""SGLang's native routes: ``/generate``, weight updates and model info.

``/generate`` takes one prompt or a batch (``text`` or ``input_ids``), with
``sampling_params`` for all or one per prompt, ``n`` samples each (sample ``j`` with
``sampling_seed + j``). With ``return_logprob`` the answer's ``meta_info`` carries
``output_token_logprobs`` as ``[logprob, token_id, text_or_null]`` triples,
``output_top_logprobs`` when ``top_logprobs_num`` > 0 and, from ``logprob_start_len``
on, ``input_token_logprobs`` (the first prompt token's log-prob is null); without
``return_logprob`` the keys are absent, as in SGLang. Every answer names
``weight_version``, the version of the weights that sampled it, and ``meta_info.id``, the
request's id (the client's ``rid`` if given), the same on every chunk of a stream.
``stream: true`` sends ``data:`` events with the cumulative text and ids, then ``data:
[DONE]``, as SGLang does; the text never shows what a stop string will remove.

``/update_weights_from_disk`` loads a weights file while serving: requests already
running finish on the old weights; the reported version changes at once.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from focus.tinylm.engine import GenRequest, GenResult, TokenEvent
from focus.tinylm.protocol import RequestError
from focus.tinylm.serving import (
    Routes,
    ServerState,
    TextStream,
    finite,
    parse,
    results,
    run,
    summary,
    token_str,
    token_text,
    trim_stop,
)
from focus.tinylm.sglang_protocol import (
    FinishReason,
    GenerateReqInput,
    GenerateResponse,
    MetaInfo,
    SamplingParams,
    UpdateWeightFromDiskReqInput,
    UpdateWeightFromDiskReqOutput,
)


def router(state: ServerState) -> list[Route]:
    r = Routes()
    engine = state.engine

    @r.post("/generate")
    async def generate(request: Request) -> Any:
        req = await parse(request, GenerateReqInput)
        prompts, batch = req.prompts()
        jobs: list[Job] = []
        for i, p in enumerate(prompts):
            raw = req.sampling_params
            sp_raw = (raw[i] if len(raw) == len(prompts) else _bad_len()) if isinstance(raw, list) else raw
            try:
                sp = SamplingParams.model_validate(sp_raw or {})
            except ValidationError as e:
                loc = e.errors()[0].get("loc") or ("",)
                raise RequestError(f"invalid sampling_params: {summary(e)}", f"sampling_params.{loc[0]}") from e
            sp.check()
            opts = {
                "return_logprob": bool(req.per_prompt("return_logprob", i, len(prompts), False)),
                "start": req.per_prompt("logprob_start_len", i, len(prompts), -1),
                "top": req.per_prompt("top_logprobs_num", i, len(prompts), 0),
            }
            if opts["top"] < 0:
                raise RequestError("top_logprobs_num must be non-negative", "top_logprobs_num")
            ids = tuple(engine.codec.encode_text(p)) if isinstance(p, str) else tuple(p)
            for j in range(sp.n):
                g = _gen_request(sp, ids, j, opts)
                engine.check(g)
                jobs.append(Job(g, sp, opts, _rid(req.rid, i, j, sp.n)))
        if req.stream:
            return StreamingResponse(_stream(state, req, jobs), media_type="text/event-stream")
        res = await results(state, [job.gen for job in jobs], request)
        out = [_response(job, rr, req.return_text_in_logprobs) for job, rr in zip(jobs, res, strict=True)]
        return out if batch or len(out) > 1 else out[0]

    @r.post("/update_weights_from_disk")
    async def update_weights(request: Request) -> Any:
        req = await parse(request, UpdateWeightFromDiskReqInput)
        try:
            version = await asyncio.get_running_loop().run_in_executor(
                None, engine.reload, req.model_path, req.weight_version
            )
        except (FileNotFoundError, ValueError) as e:
            body = UpdateWeightFromDiskReqOutput(success=False, message=str(e)).model_dump()
            body["policy_version"] = engine.policy_version
            return JSONResponse(body, status_code=400)
        body = UpdateWeightFromDiskReqOutput(success=True, message=f"loaded {req.model_path}").model_dump()
        body["policy_version"] = body["weight_version"] = version
        return body

    @r.get("/model_info")  # SGLang's since late 2025; /get_model_info the older name
    @r.get("/get_model_info")
    async def model_info(request: Request) -> dict[str, Any]:
        return {
            "model_path": engine.weights_path,
            "tokenizer_path": None,
            "is_generation": True,
            "weight_version": engine.policy_version,
        }

    @r.get("/get_weight_version")
    async def weight_version(request: Request) -> dict[str, Any]:
        return {"weight_version": engine.policy_version}

    @r.post("/flush_cache")
    async def flush_cache(request: Request) -> dict[str, Any]:
        engine.flush_cache()
        return {"success": True}

    return r.routes


@dataclass(frozen=True)
class Job:
    """One sample of one prompt: the engine request, its parameters and its request id
    (``meta_info.id`` on every answer and chunk of it, as SGLang's ``rid``)."""

    gen: GenRequest
    sp: SamplingParams
    opts: dict[str, Any]
    rid: str


def _rid(given: str | list[str] | None, i: int, j: int, n: int) -> str:
    """Prompt ``i``'s sample ``j``: the client's ``rid`` (one per prompt in a batch, with
    ``_j`` when ``n`` > 1), else a fresh one."""
    base = given[i] if isinstance(given, list) and i < len(given) else given
    if not isinstance(base, str):
        return uuid.uuid4().hex
    return base if n == 1 else f"{base}_{j}"


def _bad_len() -> Any:
    raise RequestError("sampling_params has a different length than the batch", "sampling_params")


def _gen_request(sp: SamplingParams, ids: tuple[int, ...], j: int, opts: dict[str, Any]) -> GenRequest:
    return GenRequest(
        prompt_ids=ids,
        max_tokens=sp.max_new_tokens,
        temperature=sp.temperature,
        top_p=sp.top_p,
        top_k=sp.top_k if sp.top_k > 0 else 0,
        min_p=sp.min_p,
        stop=sp.stops(),
        stop_token_ids=tuple(sp.stop_token_ids or ()),
        seed=None if sp.sampling_seed is None else sp.sampling_seed + j,
        ignore_eos=sp.ignore_eos,
        min_tokens=sp.min_new_tokens,
        logprobs=opts["top"] if opts["return_logprob"] else 0,
        prompt_logprobs=opts["top"] if opts["return_logprob"] and opts["start"] >= 0 else None,
    )


def _triple(lp: float, tok: int, with_text: bool) -> tuple[float, int, str | None]:
    return (finite(lp), tok, token_str(tok) if with_text else None)


def _in_triple(lp: float | None, tok: int, with_text: bool) -> tuple[float | None, int, str | None]:
    return (None if lp is None else finite(lp), tok, token_str(tok) if with_text else None)


def _response(job: Job, res: GenResult, with_text: bool) -> dict[str, Any]:
    g, sp, opts = job.gen, job.sp, job.opts
    finish: dict[str, Any] = {"type": res.finish_reason}
    if res.finish_reason == "stop":
        finish["matched"] = res.matched
    elif res.finish_reason == "length":
        finish["length"] = len(res.token_ids)
    meta = MetaInfo(
        id=job.rid,
        finish_reason=FinishReason(**finish),
        prompt_tokens=len(g.prompt_ids),
        completion_tokens=len(res.token_ids),
        cached_tokens=res.cached_tokens,
        weight_version=res.policy_version,
    )
    if opts["return_logprob"]:
        meta.output_token_logprobs = _output_logprobs(res.token_ids, res.logprobs, with_text)
        meta.input_token_logprobs = []
        if opts["top"] > 0:
            meta.output_top_logprobs = [[_triple(v, t, with_text) for t, v in top] for top in res.top_logprobs]
        if res.prompt_logprobs is not None:
            start = opts["start"]
            entries = list(zip(g.prompt_ids, res.prompt_logprobs, strict=True))[start:]
            meta.input_token_logprobs = [_in_triple(None if e is None else e.logprob, t, with_text) for t, e in entries]
            if opts["top"] > 0:
                meta.input_top_logprobs = [
                    None if e is None else [_triple(v, tt, with_text) for tt, v in e.top] for _, e in entries
                ]
    text = token_text(res.token_ids, sp.skip_special_tokens)
    if not sp.no_stop_trim:
        text = trim_stop(text, res, False)
    out = GenerateResponse(text=text, output_ids=list(res.token_ids), meta_info=meta).model_dump()
    _drop_unasked(out["meta_info"])
    out["meta_info"]["policy_version"] = res.policy_version
    return out


def _output_logprobs(ids: Sequence[int], logprobs: Sequence[float], with_text: bool) -> list[Any]:
    return [_triple(lp, t, with_text) for t, lp in zip(ids, logprobs, strict=True)]


def _drop_unasked(meta: dict[str, Any]) -> None:
    """SGLang adds log-prob entries to ``meta_info`` only when asked for (the top ones only
    with ``top_logprobs_num`` > 0): no key rather than a null."""
    for key in _LOGPROB_KEYS:
        if meta.get(key, 0) is None:
            del meta[key]


_LOGPROB_KEYS = ("output_token_logprobs", "output_top_logprobs", "input_token_logprobs", "input_top_logprobs")


async def _stream(state: ServerState, req: GenerateReqInput, jobs: Sequence[Job]) -> AsyncIterator[str]:
    """SGLang's stream: each chunk carries the running ``text`` (held back as a vLLM stream
    holds it, so it only grows into the final text), all ``output_ids`` so far and
    ``meta_info`` with the request's id and the version of the weights sampling it."""
    texts = [TextStream(job.sp.stops(), job.sp.skip_special_tokens, job.sp.no_stop_trim) for job in jobs]
    lps: list[list[float]] = [[] for _ in jobs]
    try:
        async for i, ev in run(state, [job.gen for job in jobs], stream=True):
            job, text = jobs[i], texts[i]
            if isinstance(ev, TokenEvent):
                text.push(ev.draw.token)
                lps[i].append(ev.draw.logprob)
                meta: dict[str, Any] = {
                    "id": job.rid,
                    "finish_reason": None,
                    "prompt_tokens": len(job.gen.prompt_ids),
                    "completion_tokens": len(text.ids),
                    "cached_tokens": ev.cached,
                    "weight_version": ev.version,
                }
                if job.opts["return_logprob"]:
                    meta["output_token_logprobs"] = _output_logprobs(text.ids, lps[i], req.return_text_in_logprobs)
                body: dict[str, Any] = {"text": text.sent, "output_ids": list(text.ids), "meta_info": meta}
            elif isinstance(ev, GenResult):
                body = _response(job, ev, req.return_text_in_logprobs)
            else:
                continue
            body["index"] = i
            yield f"data: {json.dumps(body, separators=(',', ':'))}\n\n"
    except Exception as e:  # noqa: BLE001 - the status line is sent; report in-band
        yield f"data: {json.dumps({'error': {'message': str(e)}})}\n\n"
    yield "data: [DONE]\n\n"
