"""What an operator meets between FOCUS and an S3-compatible store, on moto's S3 behind
:class:`focus.testing.s3faults.S3FaultProxy`: a gateway's 502/504 page, MinIO's own 503
code, a 429; credentials that expire mid-run (S3's ``400 ExpiredToken``, which a
``HEAD`` gets without a body); no credentials at all.

Before: s3fs made ``OSError(EIO)`` of any answer whose code it does not know, which was
not retried, so one 502 of a load balancer stopped a collection with ``OSError: [Errno
5] ...``; an expired token stopped ``focus collect`` with ``OSError: [Errno 22] Bad
Request``, raised by the lease's release as the run ended (it replaced the step's
error); no credentials gave botocore's ``NoCredentialsError: Unable to locate
credentials``.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request

import pytest
import s3fs
from fixtures.prefect import base_env
from test_errors import SMALL, error_line, run_cli

from flows.preflight import check_root
from focus.testing.s3faults import S3FaultProxy
from storage import (
    BatchStore,
    CheckpointStore,
    Lease,
    Retry,
    StorageAccessDenied,
    StorageUnavailable,
    StorageUnsupported,
)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def proxied(s3_server):
    """(bucket URL, storage options through the proxy, the proxy)."""
    with S3FaultProxy(s3_server.endpoint_url) as proxy:
        opts = {"key": s3_server.key, "secret": s3_server.secret, "endpoint_url": proxy.url}
        yield s3_server.make_bucket("focus-faults"), opts, proxy


@pytest.mark.parametrize(
    "fault",
    [
        {"status": 502, "html": True},  # a load balancer's page: no S3 code at all
        {"status": 504, "html": True},
        {
            "status": 503,
            "code": "XMinioServerNotInitialized",
            "methods": {"PUT"},
        },  # MinIO starting (a HEAD gets no code)
        {"status": 429},
    ],
    ids=["502-page", "504-page", "503-minio", "429"],
)
def test_a_gateway_or_a_store_with_its_own_codes_is_waited_for(proxied, fault):
    bucket, opts, proxy = proxied
    store = CheckpointStore(f"{bucket}/runs", storage_options=opts)
    store.save("c", "evidence", 0, {"x": 1})
    proxy.fail(**fault, for_s=1.0)
    store.save("c", "evidence", 1, {"x": 2})  # raised OSError: [Errno 5] at the first answer
    assert proxy.failed >= 2 and store.load("c", "evidence", 1) == {"x": 2}


def test_a_timed_fault_lasts_its_time_from_the_first_request_it_answers(proxied):
    # it lasted from the call: a save whose first request came 0.8 s late (two workers on
    # a loaded machine) met one failure of a one-second fault, and the test above failed
    _, _, proxy = proxied

    def status() -> int:
        try:
            with urllib.request.urlopen(proxy.url + "/", timeout=10) as answer:
                return int(answer.status)
        except urllib.error.HTTPError as e:
            return e.code

    proxy.fail(503, for_s=0.3)
    time.sleep(0.5)
    assert status() == 503 and proxy.failed == 1  # the window opens here
    time.sleep(0.5)
    assert status() != 503 and proxy.failed == 1


def test_a_gateway_that_keeps_failing_is_one_line_with_what_to_do(proxied):
    bucket, opts, proxy = proxied
    store = CheckpointStore(f"{bucket}/runs", storage_options=opts, retry=Retry(attempts=2, backoff_s=0.05))
    proxy.fail(502, html=True)
    with pytest.raises(StorageUnavailable) as e:
        store.save("c", "evidence", 0, {"x": 1})
    msg = str(e.value)
    assert "kept answering with errors (throttled or failing) after 2 attempt(s)" in msg, msg
    assert "a collection resumes from its last saved step" in msg and "(502)" in msg, msg


def test_a_failed_release_never_replaces_the_runs_own_error(proxied):
    bucket, opts, proxy = proxied
    with pytest.raises(RuntimeError, match="the run's own error"):  # was OSError: [Errno 22] from the release
        with Lease(f"{bucket}/runs", "c", storage_options=opts):
            proxy.fail(400, code="InvalidArgument", methods={"GET"})  # the release reads the lease back
            raise RuntimeError("the run's own error")


def test_no_credentials_say_which_to_set(s3_server, monkeypatch):
    bucket = s3_server.make_bucket()
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance role to look for
    s3fs.S3FileSystem.clear_instance_cache()  # fsspec would hand back a filesystem made with credentials
    try:
        with pytest.raises(StorageAccessDenied) as e:
            check_root(f"{bucket}/runs")
    finally:  # fsspec keeps the filesystem it made, without credentials, for later tests
        s3fs.S3FileSystem.clear_instance_cache()
    msg = str(e.value)
    assert "no credentials for the object store" in msg and "AWS_ACCESS_KEY_ID" in msg, msg


@pytest.mark.slow
def test_credentials_that_expire_mid_run_end_in_one_line_and_the_rerun_resumes(tmp_path, s3_server, proxied):
    bucket, _, proxy = proxied
    root = f"{bucket}/runs"
    env = {**base_env(tmp_path / "prefect"), "AWS_ENDPOINT_URL": proxy.url}  # no Prefect: steps run directly
    args = [*SMALL, "--store", root, "--collection-id", "c", "--json"]
    # from the first request about the continuation's first wave on, the token has expired
    proxy.fail(400, from_path="n-1.continue")
    line = error_line(run_cli(args, env, tmp_path, timeout=90))
    assert "OSError" not in line, line  # was 'OSError: [Errno 22] Bad Request' (the lease's release)
    assert "AWS_SESSION_TOKEN" in line and "a collection resumes from its last saved step" in line, line
    proxy.restore()
    again = run_cli(args, env, tmp_path, timeout=90)
    assert again.returncode == 0, again.stderr
    result = json.loads(again.stdout.strip().splitlines()[-1])
    assert result["stats"]["steps_reused"] >= 1, result["stats"]  # the evidence, saved before the fault
    assert BatchStore(root).read(result["batch_url"]).actor
    assert os.environ["AWS_ENDPOINT_URL"] == s3_server.endpoint_url  # the proxy was the subprocess's only


@pytest.mark.parametrize("what", ["batches/c/iter-000000", "batches/c"])
def test_inspect_of_a_missing_bucket_says_so(s3_server, what):
    from typer.testing import CliRunner

    from cli.app import app

    done = CliRunner().invoke(app, ["inspect", f"s3://no-such-bucket-focus/runs/{what}"])
    assert done.exit_code == 1
    # was "no batch at ...: _manifest.json is missing" / "no finished batch in ..."
    # and which server was asked: a bucket 'missing' from another endpoint than meant
    assert f"bucket 'no-such-bucket-focus' does not exist at {s3_server.endpoint_url}" in done.output, done.output


def test_a_store_without_conditional_writes_is_named_in_one_line(proxied):
    bucket, opts, proxy = proxied
    proxy.fail(501, methods={"PUT"}, from_path="leases/")  # the lease's If-None-Match create
    with pytest.raises(StorageUnsupported, match=r"does not support conditional writes \(it answered 501"):
        Lease(f"{bucket}/runs", "c", storage_options=opts).acquire()  # was OSError: [Errno 38] ...


def test_a_store_that_throttles_as_the_lease_is_taken_is_waited_for_as_a_save_is(proxied):
    """A store answering 503 SlowDown for a second as a run began stopped it: taking the
    lease used the renewals' quick retries (3 attempts in 1.2 s; a renewal must end
    within the lease's time), where a step's save waits out 15 s of it. The lease is taken
    as patiently as a save; its renewals stay quick."""
    bucket, opts, proxy = proxied
    proxy.fail(503, code="SlowDown", for_s=1.5)
    with Lease(f"{bucket}/runs", "c", storage_options=opts) as lease:
        assert lease.held and proxy.failed >= 2
        assert lease._slot.retry.attempts == 3  # renewals: still the quick retries


def test_a_store_that_throttles_as_a_batch_is_published_is_waited_for(proxied):
    """The lease object is read before a batch is published (a store removed under the
    run); that read waits out a throttle as the batch's own writes do, not the renewals' 1.2 s."""
    from test_storage import batch_from_trees, grow_tree

    bucket, opts, proxy = proxied
    with Lease(f"{bucket}/runs", "c1", storage_options=opts):
        store = BatchStore(f"{bucket}/runs", storage_options=opts)
        proxy.fail(503, code="SlowDown", for_s=1.5, methods={"HEAD", "GET"}, from_path="leases/")
        url = store.write(batch_from_trees([grow_tree()], collection_id="c1"))
        assert proxy.failed >= 2 and store.list("c1") == [url]
