"""A loopback S3 for the storage benchmarks: moto's server on 127.0.0.1, credentials and
endpoint in this process's environment (what s3fs and the stores read), one fresh
bucket."""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
from collections.abc import Iterator


@contextlib.contextmanager
def loopback_bucket(prefix: str) -> Iterator[str]:
    """Start moto's S3 server, point this process at it and yield a new bucket's name."""
    import s3fs
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        os.environ.update(
            AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1",
            AWS_ENDPOINT_URL=f"http://{host}:{port}",
        )  # fmt: skip
        bucket = f"{prefix}-{uuid.uuid4().hex[:8]}"
        s3fs.S3FileSystem(skip_instance_cache=True).mkdir(bucket)
        yield bucket
    finally:
        server.stop()
