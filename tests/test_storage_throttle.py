"""An object store that throttles (S3's ``503 SlowDown``) or fails (``500
InternalError``) for a few seconds: the stores' default retries wait it out, so a
collection goes on and writes the batch an undisturbed one writes; a store that keeps
failing stops the step with one line saying it answered with errors (not that it was
unreachable). Moto's S3 on loopback behind :class:`focus.testing.s3faults.S3FaultProxy`.

Before: 3 attempts over 0.6 s, so a 1.2 s ``SlowDown`` stopped the step with ``storage
unreachable after 3 attempt(s)`` (and a collection run by ``focus collect`` with it).
"""

from __future__ import annotations

import contextlib

import pytest
from fixtures.journal import AfterStep, run_collect
from test_faults_infra import config

from focus.journal import wave_step
from focus.testing.s3faults import S3FaultProxy
from storage import BatchStore, CheckpointStore, Retry, StorageUnavailable

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def throttled(s3_server):
    """(bucket URL, storage options through the proxy, the proxy)."""
    with S3FaultProxy(s3_server.endpoint_url) as proxy:
        opts = {"key": s3_server.key, "secret": s3_server.secret, "endpoint_url": proxy.url}
        yield s3_server.make_bucket("focus-throttle"), opts, proxy


@pytest.mark.parametrize("status", [503, 500])
def test_a_store_that_throttles_or_fails_for_seconds_is_waited_for(throttled, status):
    bucket, opts, proxy = throttled
    store = CheckpointStore(f"{bucket}/runs", storage_options=opts)
    store.save("c", "evidence", 0, {"x": 1})
    proxy.fail(status, for_s=1.2)
    store.save("c", "evidence", 1, {"x": 2})  # raised StorageUnavailable after 0.6 s
    assert proxy.failed >= 2 and store.load("c", "evidence", 1) == {"x": 2}


def test_a_store_that_keeps_failing_says_it_answered_with_errors(throttled):
    bucket, opts, proxy = throttled
    store = CheckpointStore(f"{bucket}/runs", storage_options=opts, retry=Retry(attempts=2, backoff_s=0.05))
    proxy.fail(503)
    with pytest.raises(StorageUnavailable) as e:
        store.save("c", "evidence", 0, {"x": 1})
    msg = str(e.value)
    assert "kept answering with errors (throttled or failing) after 2 attempt(s)" in msg, msg
    assert "unreachable" not in msg and "OSError: [Errno 16]" in msg


class Unleased(AfterStep):
    """No lease (its renewals would meet the throttle too; the steps' saves are the point)."""

    def lease(self):  # type: ignore[no-untyped-def]
        return contextlib.nullcontext()


def test_a_collection_goes_on_through_a_throttled_store(throttled):
    bucket, opts, proxy = throttled
    root = f"{bucket}/runs"
    stores = {
        "store": CheckpointStore(root, storage_options=opts),
        "batch_store": BatchStore(root, storage_options=opts),
    }

    def run(cid: str, then=None) -> dict:  # type: ignore[no-untyped-def]
        cfg = config(root, cid, transitions=10)
        return run_collect(cfg, Unleased(cfg, wave_step(1, 0), then, **stores))

    clean = run("clean")
    # once the first continuation wave is saved, every request is answered SlowDown for 1.2 s
    throttled_run = run("throttled", then=lambda: proxy.fail(503, for_s=1.2))
    assert proxy.failed >= 2
    batches = BatchStore(root, storage_options=opts)
    got, want = batches.read(throttled_run["batch_url"]), batches.read(clean["batch_url"])
    assert len(want.actor) > 0

    def rows(batch):  # type: ignore[no-untyped-def]
        return [(r.tree_id, r.edge_id, r.turn_index, r.completion_ids, r.logprobs, r.advantage) for r in batch.actor]

    assert rows(got) == rows(want)
