"""Send a FOCUS batch to Tinker: Datums, ``forward_backward``, ``optim_step``.

The batch (a URL from ``storage.BatchStore``) becomes ``tinker.Datum`` records with
``focus.exporters.to_tinker_datums``: ``model_input`` = tokens[:-1], and
``target_tokens``, ``logprobs`` (behaviour), ``advantages`` aligned with tokens[1:]
(0 on prompt and observation tokens). With ``TINKER_API_KEY`` set, a LoRA training
client on ``--base-model`` runs one ``forward_backward`` with the chosen built-in loss
(``importance_sampling`` or ``ppo``) and one ``optim_step``. Without a key (or with
``--dry-run``) it converts and reports what it would send: counts, shapes, loss.

The tokens must be the base model's: collect the batch with that model (Tinker's
sampler through ``focus.backends.TinkerPolicy``, or a vLLM server of the same model with
``focus.hf_codec.HFChatCodec``). ``--collect-toy`` makes a small batch with the
embedded tiny model, which is enough to see the conversion but not to train a
Tinker model.

    python -m examples.train_tinker.run --store runs/math --batch-url file://.../iter-000000
    python -m examples.train_tinker.run --collect-toy --out /tmp/focus-tinker      # no key: dry run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections import Counter
from typing import Any

from focus.batch import Batch

LOSS_FNS = ("importance_sampling", "ppo")


def describe(datums: list[Any], loss_fn: str) -> dict[str, Any]:
    """What a request would carry (pure): counts, shapes and the loss."""
    if not datums:
        raise ValueError("the batch has no trainable sequences: nothing to send")
    inputs = [d.model_input.length for d in datums]
    fields: Counter[str] = Counter()
    trained = 0
    for i, d in enumerate(datums):
        for key, t in d.loss_fn_inputs.items():
            if list(t.shape) != [inputs[i]]:
                raise ValueError(f"datum {i}: {key} has shape {t.shape}, model_input has {inputs[i]} tokens")
            fields[key] += 1
        trained += sum(1 for a in d.loss_fn_inputs["advantages"].data if a != 0.0)
    return {
        "datums": len(datums),
        "loss_fn": loss_fn,
        "loss_fn_inputs": sorted(fields),
        "tokens": sum(inputs),
        "tokens_with_advantage": trained,
        "max_len": max(inputs),
        "shapes": [[n] for n in inputs[:5]] + ([["..."]] if len(inputs) > 5 else []),
    }


def train(datums: list[Any], base_model: str, loss_fn: str, lr: float) -> dict[str, Any]:
    """One forward_backward and one optim_step on a fresh LoRA client."""
    import tinker

    service = tinker.ServiceClient()
    client = service.create_lora_training_client(base_model=base_model)
    out = client.forward_backward(datums, loss_fn).result()
    client.optim_step(adam_params=tinker.AdamParams(learning_rate=lr)).result()
    return {"metrics": dict(out.metrics)}


async def toy_batch(out: str, url: str | None = None) -> tuple[str, Batch]:
    from examples.common import model_server
    from focus.collector import Collector
    from focus.critic import ConstantCritic
    from focus.priority import Phase, Selective
    from focus.toy import reach_target_tasks
    from focus.train_local import toy_agent
    from storage import BatchStore

    with model_server(url) as server_url:
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


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from focus.exporters import to_tinker_datums
    from storage import BatchStore

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", help="batch store root the batch lives in")
    ap.add_argument("--batch-url", help="URL of the batch (BatchStore.write's answer)")
    ap.add_argument("--collect-toy", action="store_true", help="collect a small toy batch first (embedded model)")
    ap.add_argument("--out", default="runs/tinker", help="store root for --collect-toy")
    ap.add_argument("--model-url", help="server for --collect-toy (default: the embedded tiny model)")
    ap.add_argument("--base-model", default="Qwen/Qwen3-4B-Instruct-2507")
    ap.add_argument("--loss-fn", choices=LOSS_FNS, default="importance_sampling")
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--dry-run", action="store_true", help="convert and report, even with a key")
    args = ap.parse_args(argv)
    if args.collect_toy:
        url, batch = asyncio.run(toy_batch(args.out, args.model_url))
    elif args.store and args.batch_url:
        url, batch = args.batch_url, BatchStore(args.store).read(args.batch_url)
    else:
        ap.error("give --store and --batch-url, or --collect-toy")
    # Tinker's built-in RL losses take target_tokens, logprobs and advantages only.
    datums = to_tinker_datums(batch, include_mask=False)
    result: dict[str, Any] = {"batch": url, **describe(datums, args.loss_fn)}
    if os.environ.get("TINKER_API_KEY") and not args.dry_run:
        result |= {"sent": True, "base_model": args.base_model, **train(datums, args.base_model, args.loss_fn, args.lr)}
    else:
        why = "--dry-run" if args.dry_run else "TINKER_API_KEY is not set"
        result |= {
            "sent": False,
            "reason": f"{why}: would call forward_backward(datums, {args.loss_fn!r}) and "
            f"optim_step(AdamParams(learning_rate={args.lr})) on a LoRA client of {args.base_model}",
        }
    json.dump(result, sys.stdout, indent=2)
    print()
    return result


if __name__ == "__main__":
    main()
