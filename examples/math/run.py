"""Collect a FOCUS batch on the generated MATH-style problems.

Default: the embedded tiny model (``LocalModelServer``) with its byte codec, no
service needed. ``--model-url http://host:8000 --tokenizer PATH`` collects from any
OpenAI-compatible server (vLLM, SGLang) instead, rendering ChatML with the model's
own ``tokenizer.json`` (``focus.hf_codec.HFChatCodec``; the file is read locally, never
fetched). The batch goes to ``--out`` (any fsspec URL) through ``storage.BatchStore``.

    .venv/bin/python -m examples.math.run --problems 5 --out /tmp/focus-math-x
    .venv/bin/python -m examples.math.run --model-url http://127.0.0.1:8000 --tokenizer ./qwen/tokenizer.json

A line on standard error every 10 s says how far it got; standard output is the result.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from examples import common
from examples.math.env import MathEnv, default_tasks
from focus.agent import Agent
from focus.collector import Collector
from focus.critic import ConstantCritic
from focus.execution import Execution
from focus.format import ChatCodec, FinalAnswerParser, PolicyFormat
from focus.policy import SamplingParams
from focus.priority import Phase, Selective


class MathConfig(BaseModel):
    """Everything one run needs; picklable, so a pipeline can ship it to workers."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model_url: str | None = None
    tokenizer: str | None = None
    model: str = "focus-tinylm"
    problems: int = Field(20, ge=1)
    #: ``standard`` (MATH-style families) or ``digit_sum`` (single-digit sums, the
    #: difficulty the embedded tiny model solves now and then: examples/math/README.md).
    difficulty: Literal["standard", "digit_sum"] = "standard"
    seed: int = 0
    max_attempts: int = Field(2, ge=1)
    rollouts_per_task: int = Field(4, ge=1)
    transitions: int = Field(32, ge=0)
    wave_size: int = Field(8, ge=1)
    max_tokens: int = Field(64, gt=0)
    temperature: float = Field(1.0, ge=0.0)
    max_concurrency: int = Field(16, ge=1)
    out: str = "runs/math"
    collection_id: str = "math"


def make_codec(config: MathConfig) -> ChatCodec:
    return common.make_codec(config.tokenizer)


def make_collector(config: MathConfig, url: str, progress: common.Progress | None = None) -> Collector:
    from focus.backends import OpenAICompatPolicy

    codec = make_codec(config)
    policy = (
        OpenAICompatPolicy(url, model=config.model, vocab_size=codec.vocab_size)
        if progress is None
        else common.CountingPolicy(url, model=config.model, vocab_size=codec.vocab_size, progress=progress)
    )
    agent = Agent(
        policy,
        MathEnv(config.max_attempts),
        PolicyFormat(codec, FinalAnswerParser(require_marker=False)),
        max_steps=config.max_attempts + 2,
        sampling=SamplingParams(max_tokens=config.max_tokens, temperature=config.temperature),
    )
    search = Selective(
        phases=(
            Phase("evidence", rollouts_per_task=config.rollouts_per_task),
            Phase("continue", transitions=config.transitions, wave_size=config.wave_size, max_branches=4),
        )
    )
    return Collector(
        agent,
        search=search,
        critic=ConstantCritic(0.5),
        execution=Execution(max_concurrency=config.max_concurrency),
        collection_id=config.collection_id,
        seed=config.seed,
    )


async def collect(config: MathConfig, url: str, progress: common.Progress | None = None) -> dict[str, Any]:
    from storage import BatchStore

    collector = make_collector(config, url, progress)
    tasks = default_tasks(config.problems, config.seed, config.difficulty)
    if progress is not None:
        progress.doing = f"collecting on {len(tasks)} problems"
    try:
        state = await collector.search(tasks)
    finally:
        await collector.agent.policy.aclose()
    batch = collector.prepare(state.trees)
    batch_url = BatchStore(config.out).write(batch, overwrite=True)
    return {
        "batch": batch_url,
        "tasks": len(tasks),
        "solve_rate": round(common.solve_rate(state.trees), 4),
        **{k: v for k, v in batch.summary().items() if k in ("actor_rows", "critic_rows", "tokens", "transitions")},
    }


def parser() -> argparse.ArgumentParser:
    # the counts are checked by MathConfig, every flag out of range named in one line
    ap = common.ArgumentParser(prog="python -m examples.math.run", description=__doc__.splitlines()[0])
    ap.add_argument("--model-url", help="OpenAI-compatible server root (default: the embedded tiny model)")
    ap.add_argument("--tokenizer", help="tokenizer.json of that model (default: the tiny model's byte codec)")
    ap.add_argument("--model", default="focus-tinylm", help="model name sent with each request")
    ap.add_argument("--problems", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--difficulty", choices=["standard", "digit_sum"], default="standard")
    ap.add_argument("--max-attempts", type=int, default=2)
    ap.add_argument("--rollouts-per-task", type=int, default=4)
    ap.add_argument("--transitions", type=int, default=32, help="continuation budget (task transitions)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--out", default="runs/math", help="batch store root (path or fsspec URL)")
    ap.add_argument("--collection-id", default="math")
    common.add_json_option(ap)
    common.add_debug_option(ap)
    return ap


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = parser()
    args = ap.parse_args(argv)
    if args.tokenizer and not args.model_url:
        ap.error("--tokenizer belongs to a model served at --model-url; the embedded model uses its byte codec")
    json_path = vars(args).pop("json_path")
    vars(args).pop("debug")
    try:
        config = MathConfig(**{k: v for k, v in vars(args).items() if v is not None})
    except ValidationError as e:  # one line naming the flag, not pydantic's three per field
        ap.error("; ".join(f"--{'-'.join(map(str, err['loc'])).replace('_', '-')}: {err['msg']}" for err in e.errors()))
    common.check_out(ap, config.out)
    common.check_model_url(ap, config.model_url)
    with common.Progress("math") as progress, common.model_server(config.model_url, progress) as url:
        result = asyncio.run(collect(config, url, progress))
    common.emit(result, json_path)
    return result


if __name__ == "__main__":
    common.command(main)
