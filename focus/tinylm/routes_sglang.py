"""SGLang's native routes: ``/generate``, weight updates and model info.

``/generate`` takes one prompt or a batch (``text`` or ``input_ids``), with
``sampling_params`` for all or one per prompt, ``n`` samples each (sample ``j`` with
``sampling_seed + j``). With ``return_logprob`` the answer's ``meta_info`` carries
``output_token_logprobs`` as ``[logprob, token_id, text_or_null]`` triples,
``output_top_logprobs`` when ``top_logprobs_num`` > 0 and, from ``logprob_start_len``
on, ``input_token_logprobs`` (the first prompt token's log-prob is null). Every answer
names ``weight_version``. ``stream: true`` sends ``data:`` events with the cumulative
text and ids, then ``data: [DONE]``, as SGLang does.

``/update_weights_from_disk`` loads a weights file while serving: requests already
running finish on the old weights; the reported version changes at once.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from focus.tinylm.engine import Engine, GenRequest, GenResult, TokenEvent
from focus.tinylm.protocol import RequestError
from focus.tinylm.serving import (
    Routes,
    ServerState,
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
        jobs: list[tuple[GenRequest, SamplingParams, dict[str, Any]]] = []
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
                jobs.append((g, sp, opts))
        if req.stream:
            return StreamingResponse(_stream(engine, req, jobs), media_type="text/event-stream")
        res = await results(engine, [g for g, _, _ in jobs])
        out = [
            _response(g, sp, opts, rr, req.return_text_in_logprobs).model_dump()
            for (g, sp, opts), rr in zip(jobs, res, strict=True)
        ]
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


def _response(
    g: GenRequest, sp: SamplingParams, opts: dict[str, Any], res: GenResult, with_text: bool
) -> GenerateResponse:
    finish: dict[str, Any] = {"type": res.finish_reason}
    if res.finish_reason == "stop":
        finish["matched"] = res.matched
    elif res.finish_reason == "length":
        finish["length"] = len(res.token_ids)
    meta = MetaInfo(
        id=uuid.uuid4().hex,
        finish_reason=FinishReason(**finish),
        prompt_tokens=len(g.prompt_ids),
        completion_tokens=len(res.token_ids),
        cached_tokens=res.cached_tokens,
        weight_version=res.policy_version,
    )
    if opts["return_logprob"]:
        meta.output_token_logprobs = [
            _triple(lp, t, with_text) for t, lp in zip(res.token_ids, res.logprobs, strict=True)
        ]
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
    out = GenerateResponse(text=text, output_ids=list(res.token_ids), meta_info=meta)
    extra = out.meta_info.__pydantic_extra__
    if extra is not None:
        extra["policy_version"] = res.policy_version
    return out


async def _stream(
    engine: Engine, req: GenerateReqInput, jobs: Sequence[tuple[GenRequest, SamplingParams, dict[str, Any]]]
) -> AsyncIterator[str]:
    ids: list[list[int]] = [[] for _ in jobs]
    try:
        async for i, ev in run(engine, [g for g, _, _ in jobs], stream=True):
            g, sp, opts = jobs[i]
            if isinstance(ev, TokenEvent):
                ids[i].append(ev.draw.token)
                body: dict[str, Any] = {
                    "index": i,
                    "text": token_text(ids[i], sp.skip_special_tokens),
                    "output_ids": list(ids[i]),
                    "meta_info": {
                        "id": str(i),
                        "finish_reason": None,
                        "prompt_tokens": len(g.prompt_ids),
                        "completion_tokens": len(ids[i]),
                        "weight_version": engine.policy_version,
                    },
                }
            elif isinstance(ev, GenResult):
                body = _response(g, sp, opts, ev, req.return_text_in_logprobs).model_dump()
                body["index"] = i
            else:
                continue
            yield f"data: {json.dumps(body, separators=(',', ':'))}\n\n"
    except Exception as e:  # noqa: BLE001 - the status line is sent; report in-band
        yield f"data: {json.dumps({'error': {'message': str(e)}})}\n\n"
    yield "data: [DONE]\n\n"
