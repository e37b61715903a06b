"""Two runs of one collection started together: one writes, the other is refused with one
line naming the owner and the expiry, and the collection stays replayable."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time

import pytest

from storage import BatchStore, CheckpointStore, LeaseHeld
from tasks.config import load_config

pytestmark = pytest.mark.timeout(180)


def test_a_second_run_of_the_same_collection_is_refused_and_the_first_finishes(prefect_api, tmp_path):
    from flows.collect import collect

    gate = tmp_path / "gate"
    cfg = load_config(
        overrides={
            "collection_id": "twice",
            "seed": 3,
            "model.kind": "factory",
            "model.factory": "fixtures.digits:gated_policy",
            "model.options": {"gate": str(gate)},
            "env.n_tasks": 2,
            "search.phases": [
                {"name": "evidence", "rollouts_per_task": 2},
                {"name": "continue", "transitions": 12, "wave_size": 4, "max_depth": 6},
            ],
            "execution.kind": "local",
            "storage.root": str(tmp_path / "store"),
            "progress": False,
        },
        environ={},
    )
    # Prefect runs the flow runs of one thread one after another: start them on two
    # threads, each with a copy of this thread's context (where the API settings live)
    results: list = [None, None]
    contexts = [contextvars.copy_context() for _ in range(2)]

    def run(i: int) -> None:
        try:
            results[i] = contexts[i].run(asyncio.run, collect(cfg))
        except BaseException as e:  # noqa: BLE001 - checked below
            results[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    t_end = time.monotonic() + 120
    while all(r is None for r in results) and time.monotonic() < t_end:
        time.sleep(0.05)  # the refused run ends at once; the other waits at the gate
    gate.touch()
    for t in threads:
        t.join(timeout=120)
    refused = [r for r in results if isinstance(r, BaseException)]
    done = [r for r in results if isinstance(r, dict)]
    assert len(refused) == 1 and len(done) == 1, results
    msg = str(refused[0])
    assert isinstance(refused[0], LeaseHeld) and "\n" not in msg
    assert "collection 'twice'" in msg and "lease held by" in msg and "until" in msg
    # the finished run's batch is intact, its lease is released, and a rerun replays it
    assert not (tmp_path / "store" / "leases" / "twice.json").exists()
    batch = BatchStore(cfg.storage.root).read(done[0]["batch_url"])
    assert len(batch.actor) > 0
    again = asyncio.run(collect(cfg))
    assert again["batch_url"] == done[0]["batch_url"] and again["stats"]["steps_reused"] == again["stats"]["steps"]
    store = CheckpointStore(cfg.storage.root)
    for phase, wave in store.list("twice"):
        store.load("twice", phase, wave)  # every manifest matches its data


@pytest.mark.integration  # without the loop's lease the second loop starts the embedded model
def test_a_second_train_loop_of_the_same_run_is_refused(tmp_path):
    """``focus train`` twice at once on one loop: the second is refused before it starts
    anything. It ran beside the first: collected nothing new (the collections' leases or
    their finished batches), but trained every iteration again and wrote its weights and
    records a second time."""
    from test_pipeline_train import loop_config

    from flows.loop import train_direct
    from storage import collection_lease

    cfg = loop_config(str(tmp_path / "store"))
    with collection_lease(cfg.storage.root, "loop"):  # the first loop, running
        with pytest.raises(LeaseHeld, match=r"collection 'loop' in .* is being written by another run"):
            asyncio.run(train_direct(cfg))
    assert CheckpointStore(cfg.storage.root).list("loop-it0") == []
