"""What an operator reads when the orchestration around a collection fails: a Prefect
server that does not answer is named with its URL in one line; a log file that cannot
be written (a full disk: ``/dev/full``) costs one warning, not a traceback per record."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from fixtures.prefect import base_env, free_port

from flows.errors import one_line

#: The installed command, as an operator runs it.
FOCUS = str(Path(sys.executable).with_name("focus"))
#: A collection that needs no model server: the digit policy of the Prefect fixtures.
SMALL = [
    "--set",
    "model.kind=factory",
    "--set",
    "model.factory=fixtures.digits:digit_policy",
    "--set",
    "env.n_tasks=2",
    "--set",
    "search.phases.1.transitions=8",
]


def prefect_client_error() -> tuple[str, httpx.ConnectError]:
    """The error Prefect's client raises for a server that is not there (no retries),
    and that server's API URL."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, PREFECT_CLIENT_MAX_RETRIES, temporary_settings

    api = f"http://127.0.0.1:{free_port()}/api"

    async def read() -> None:
        with temporary_settings({PREFECT_API_URL: api, PREFECT_CLIENT_MAX_RETRIES: 0}):
            async with get_client() as client:
                await client.read_flow_runs()

    with pytest.raises(httpx.ConnectError) as e:
        asyncio.run(read())
    return api, e.value


def test_prefect_clients_version_check_failure_names_how_it_failed():
    """The engine's first call (its API version check) raises a bare ``RuntimeError``
    from the connection's error: the line said only "(RuntimeError)"."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, PREFECT_CLIENT_MAX_RETRIES, temporary_settings

    api = f"http://127.0.0.1:{free_port()}/api"

    async def check() -> None:
        with temporary_settings({PREFECT_API_URL: api, PREFECT_CLIENT_MAX_RETRIES: 0}):
            async with get_client() as client:
                await client.raise_for_api_version_mismatch()

    with pytest.raises(RuntimeError, match="Failed to reach API") as e:
        asyncio.run(check())
    line = one_line(e.value)
    assert line.startswith(f"the Prefect server at {api} did not answer (ConnectError: "), line


def test_prefect_clients_failure_names_prefect_and_its_url():
    api, error = prefect_client_error()
    line = one_line(error)
    assert line.startswith(f"the Prefect server at {api} did not answer (ConnectError: "), line
    # another client's connection error is not blamed on Prefect
    with pytest.raises(httpx.ConnectError) as other:
        httpx.get(f"http://127.0.0.1:{free_port()}/v1/models", timeout=5)
    assert one_line(other.value).startswith("ConnectError: ")


@pytest.mark.integration
def test_cli_names_an_unreachable_prefect_server(tmp_path):
    api = f"http://127.0.0.1:{free_port()}/api"
    env = {**base_env(tmp_path / "prefect"), "PREFECT_API_URL": api, "FOCUS_STORAGE__ROOT": str(tmp_path / "runs")}
    done = subprocess.run([FOCUS, "collect", *SMALL], env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 1
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: the Prefect server at {api} did not answer"), lines


@pytest.mark.integration
def test_a_log_file_that_cannot_be_written_is_one_warning(tmp_path):
    env = {**base_env(tmp_path / "prefect"), "FOCUS_STORAGE__ROOT": str(tmp_path / "runs")}
    done = subprocess.run(
        [FOCUS, "collect", "--log-file", "/dev/full", *SMALL],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "Logging error" not in done.stderr, done.stderr[:2000]
    warnings = [ln for ln in done.stderr.splitlines() if ln.startswith("warning: ")]
    assert warnings == [
        "warning: cannot write the log file /dev/full (No space left on device); nothing more is logged to it"
    ]
    assert "batch: " in done.stdout
