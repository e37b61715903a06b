"""Send a FOCUS batch to Tinker: Datums, ``forward_backward``, ``optim_step``, new sampler.

The batch (a URL from ``storage.BatchStore``) becomes ``tinker.Datum`` records with
``focus.exporters.to_tinker_datums``: ``model_input`` = tokens[:-1], and
``target_tokens``, ``logprobs`` (behaviour), ``advantages`` aligned with tokens[1:]
(0 on prompt and observation tokens). One step of the library's Tinker trainer
(``focus.backends.tinker_backend``, the same one ``focus train`` runs with
``train.trainer = "tinker"``) builds every request with the SDK's own types and checks
it as serialised for sending; with ``TINKER_API_KEY`` set it then runs
``forward_backward`` (built-in loss ``importance_sampling`` or ``ppo``) and
``optim_step`` on a LoRA training client of ``--base-model`` (or from ``--state``),
saves its state and sampler weights, and prints the ``tinker://`` paths: the sampler
path is what the next collection samples from (``model.kind = "tinker"``,
``model.weights = <path>``). Without a key (or with ``--dry-run``) it sends nothing
and prints what it would send.

The tokens must be the base model's: collect the batch with that model (Tinker's
sampler through ``focus.backends.TinkerPolicy``, or a vLLM server of the same model with
``focus.hf_codec.HFChatCodec``). ``--collect-toy`` makes a small batch with the
embedded tiny model, which is enough to see the requests but not to train a Tinker model.

    .venv/bin/python -m examples.train_tinker.run --store runs/math --batch-url runs/math/batches/math/iter-000000
    .venv/bin/python -m examples.train_tinker.run --collect-toy --out /tmp/focus-tinker      # no key: dry run
"""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any

from examples import common
from focus.batch import Batch

LOSS_FNS = ("importance_sampling", "ppo", "cispo", "gspo")


async def toy_batch(out: str, url: str | None = None) -> tuple[str, Batch]:
    from focus.collector import Collector
    from focus.critic import ConstantCritic
    from focus.priority import Phase, Selective
    from focus.toy import reach_target_tasks
    from focus.train_local import toy_agent
    from storage import BatchStore

    with common.model_server(url) as server_url:
        agent = toy_agent(server_url)
        search = Selective(phases=(Phase("evidence", rollouts_per_task=2), Phase("continue", transitions=8)))
        collector = Collector(agent, search=search, critic=ConstantCritic(0.3), collection_id="tinker-toy")
        try:
            batch = await collector.collect(reach_target_tasks(4))
        finally:
            await agent.policy.aclose()
    store = BatchStore(out)
    url = store.write(batch, overwrite=True)
    return url, store.read(url)


def parser() -> argparse.ArgumentParser:
    ap = common.ArgumentParser(prog="python -m examples.train_tinker.run", description=__doc__.splitlines()[0])
    ap.add_argument("--store", help="batch store root the batch lives in")
    ap.add_argument("--batch-url", help="URL of the batch (BatchStore.write's answer)")
    ap.add_argument("--collect-toy", action="store_true", help="collect a small toy batch first (embedded model)")
    ap.add_argument("--out", default="runs/tinker", help="store root for --collect-toy")
    ap.add_argument("--model-url", help="server for --collect-toy (default: the embedded tiny model)")
    ap.add_argument("--base-model", default="Qwen/Qwen3-4B-Instruct-2507")
    ap.add_argument("--state", help="tinker:// state saved by the previous step (default: a new LoRA run)")
    ap.add_argument("--name", default="focus-step", help="name of the saved state and sampler weights")
    ap.add_argument("--loss-fn", choices=LOSS_FNS, default="importance_sampling")
    ap.add_argument("--lr", type=common.positive, default=1e-5)
    ap.add_argument("--dry-run", action="store_true", help="build and check every request, even with a key")
    common.add_json_option(ap)
    common.add_debug_option(ap)
    return ap


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from focus.backends.tinker_backend import TinkerTrainer, TinkerUpdateConfig, build_requests, check_requests
    from focus.exporters import to_tinker_datums
    from storage import BatchStore

    ap = parser()
    args = ap.parse_args(argv)
    if args.collect_toy:
        common.check_out(ap, args.out)
        common.check_model_url(ap, args.model_url)
        url, batch = asyncio.run(toy_batch(args.out, args.model_url))
    elif args.store and args.batch_url:
        url, batch = args.batch_url, BatchStore(args.store).read(args.batch_url)
    else:
        ap.error("give --store and --batch-url, or --collect-toy")
    cfg = TinkerUpdateConfig(loss_fn=args.loss_fn, learning_rate=args.lr, dry_run=args.dry_run)
    # Exactly the inputs of the loss: the service refuses any other key.
    datums = to_tinker_datums(batch, loss_fn=args.loss_fn, include_mask=False)
    requests = build_requests(datums, cfg, base_model=args.base_model, name=args.name, state_path=args.state)
    result: dict[str, Any] = {"batch": url, **check_requests(requests)}
    if os.environ.get("TINKER_API_KEY") and not args.dry_run:
        step = TinkerTrainer(cfg, args.base_model).step(datums, args.name, args.state)
        result |= {"sent": True, "sampler_path": step.sampler_path, "state_path": step.state_path}
        result |= {"metrics": step.metrics}
    else:
        why = "--dry-run" if args.dry_run else "TINKER_API_KEY is not set"
        result |= {
            "sent": False,
            "reason": f"{why}: built and checked {', '.join(result['requests'].values())}; would call "
            f"forward_backward(datums, {args.loss_fn!r}) and optim_step(AdamParams(learning_rate={args.lr})) "
            f"on a LoRA client of {args.base_model}",
        }
    common.emit(result, args.json_path)
    return result


if __name__ == "__main__":
    common.command(main)
