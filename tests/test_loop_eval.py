"""The train loop's held-out evaluation stops with the loop.

It ran in a daemon thread with an event loop of its own: a `focus train` stopped by a
first Ctrl-C or SIGTERM while it evaluated went on calling the model server after the
command had stopped it, and printed the model service's outage warning above its last
line. It now runs on the loop's own event loop, so the cancellation reaches its rollouts.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from fixtures.digits import DigitPolicy
from test_pipeline import small_config

from flows.loop import LoopSteps, eval_config, eval_phase
from storage import CheckpointStore

pytestmark = pytest.mark.timeout(60)

CALLS: list[float] = []


class Counting(DigitPolicy):
    async def sample(self, prompt_ids: Any, params: Any) -> Any:
        CALLS.append(time.monotonic())
        return await super().sample(prompt_ids, params)


def counting_policy(**options: Any) -> Counting:
    return Counting(latency_s=0.02, **options)


def test_a_cancelled_evaluation_makes_no_more_model_calls(tmp_path):
    base = small_config(str(tmp_path), "ev", **{"model.factory": "test_loop_eval:counting_policy"})
    cfg = eval_config(base.with_updates(**{"train.eval_tasks": 64, "execution.max_concurrency": 2}), {
        "weights": None, "policy_version": "digits-0",
    })  # fmt: skip
    CALLS.clear()

    async def main() -> tuple[int, int]:
        evaluating = asyncio.ensure_future(LoopSteps().evaluate(cfg, "ev", 0, None))
        while len(CALLS) < 5:
            assert not evaluating.done()
            await asyncio.sleep(0.01)
        evaluating.cancel()
        with pytest.raises(asyncio.CancelledError):
            await evaluating
        stopped = len(CALLS)
        await asyncio.sleep(0.5)  # 25 calls' worth at two at a time
        return stopped, len(CALLS)

    stopped, later = asyncio.run(main())
    time.sleep(0.3)
    assert later == stopped and len(CALLS) == stopped, (stopped, later, len(CALLS))
    assert not CheckpointStore(str(tmp_path)).exists("ev", eval_phase(cfg), 0)  # nothing half-made recorded


def test_an_evaluation_is_recorded_and_reused(tmp_path):
    base = small_config(str(tmp_path), "ev", **{"model.factory": "test_loop_eval:counting_policy"})
    cfg = eval_config(base.with_updates(**{"train.eval_tasks": 4}), {"weights": None, "policy_version": "digits-0"})
    first = asyncio.run(LoopSteps().evaluate(cfg, "ev", 0, None))
    again = asyncio.run(LoopSteps().evaluate(cfg, "ev", 0, None))
    assert first["reused"] is False and again["reused"] is True
    assert {k: v for k, v in again.items() if k != "reused"} == {k: v for k, v in first.items() if k != "reused"}
