"""Collect a FOCUS batch on the generated multi-hop browsing questions.

Default: the embedded tiny model (which has not learned tool calls: expect parse
errors shown back as observations, and no solved questions). ``--model-url`` and
``--tokenizer`` point it at any OpenAI-compatible server, as in ``examples.math``.

    .venv/bin/python -m examples.browse.run --questions 4 --out /tmp/focus-browse
    .venv/bin/python -m examples.browse.run --write-corpus /tmp/corpus.jsonl   # inspect the corpus

The tiny model answers slowly here (long tool observations in every prompt): a line on
standard error every 10 s says how far the run got; standard output is the result.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from examples import common
from examples.browse.corpus import Corpus, generate_corpus
from examples.browse.env import browse_env, browse_tasks
from focus.agent import Agent
from focus.collector import Collector
from focus.critic import ConstantCritic
from focus.execution import Execution
from focus.format import PolicyFormat, XmlToolCallParser
from focus.policy import SamplingParams
from focus.priority import Phase, Selective


def make_collector(url: str, corpus: Corpus, args: argparse.Namespace, progress: common.Progress) -> Collector:
    codec = common.make_codec(args.tokenizer)
    agent = Agent(
        common.CountingPolicy(url, model=args.model, vocab_size=codec.vocab_size, progress=progress),
        browse_env(corpus, max_tool_calls=args.max_tool_calls),
        PolicyFormat(codec, XmlToolCallParser()),
        max_steps=args.max_tool_calls + 2,
        sampling=SamplingParams(max_tokens=args.max_tokens, temperature=1.0),
    )
    search = Selective(
        phases=(
            Phase("evidence", rollouts_per_task=args.rollouts_per_task),
            Phase("continue", transitions=args.transitions, wave_size=8, max_branches=3),
        )
    )
    return Collector(
        agent,
        search=search,
        critic=ConstantCritic(0.2),
        execution=Execution(max_concurrency=16),
        collection_id=args.collection_id,
        seed=args.seed,
    )


async def collect(url: str, args: argparse.Namespace, progress: common.Progress) -> dict[str, Any]:
    from storage import BatchStore

    progress.doing = "generating the corpus and its search index"
    corpus = generate_corpus(args.seed)
    tasks = browse_tasks(corpus)[: args.questions]
    collector = make_collector(url, corpus, args, progress)
    progress.doing = f"collecting on {len(tasks)} questions"
    try:
        state = await collector.search(tasks)
    finally:
        await collector.agent.policy.aclose()
    progress.doing = "writing the batch"
    batch = collector.prepare(state.trees)
    url_out = BatchStore(args.out).write(batch, overwrite=True)
    return {
        "batch": url_out,
        "documents": len(corpus.documents),
        "questions": len(tasks),
        "solve_rate": round(common.solve_rate(state.trees), 4),
        "actor_rows": len(batch.actor),
        "critic_rows": len(batch.critic),
    }


def parser() -> argparse.ArgumentParser:
    ap = common.ArgumentParser(prog="python -m examples.browse.run", description=__doc__.splitlines()[0])
    ap.add_argument("--model-url")
    ap.add_argument("--tokenizer")
    ap.add_argument("--model", default="focus-tinylm")
    ap.add_argument("--questions", type=common.count(1), default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rollouts-per-task", type=common.count(1), default=2)
    ap.add_argument("--transitions", type=common.count(0), default=16, help="continuation budget (0: evidence only)")
    ap.add_argument("--max-tool-calls", type=common.count(0), default=6)
    ap.add_argument("--max-tokens", type=common.count(1), default=96)
    ap.add_argument("--out", default="runs/browse")
    ap.add_argument("--collection-id", default="browse")
    ap.add_argument("--write-corpus", help="write the generated corpus as JSON lines here and exit")
    common.add_json_option(ap)
    common.add_debug_option(ap)
    return ap


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = parser()
    args = ap.parse_args(argv)
    if args.write_corpus:
        corpus = generate_corpus(args.seed)
        corpus.save(args.write_corpus)
        result: dict[str, Any] = {
            "corpus": args.write_corpus,
            "documents": len(corpus.documents),
            "questions": len(corpus.questions),
        }
    else:
        if args.tokenizer and not args.model_url:
            ap.error("--tokenizer belongs to a model served at --model-url")
        common.check_out(ap, args.out)
        common.check_model_url(ap, args.model_url)
        with common.Progress("browse") as progress, common.model_server(args.model_url, progress) as url:
            result = asyncio.run(collect(url, args, progress))
    common.emit(result, args.json_path)
    return result


if __name__ == "__main__":
    common.command(main)
