"""``make test-fast`` starts no server: the guard every test outside the integration
marker runs under (tests/conftest.py) sees a listening socket and a server process."""

from __future__ import annotations

import socket
import subprocess
import sys

from conftest import _server_in, servers_started


def test_a_listening_socket_is_seen_and_a_client_socket_is_not():
    with servers_started() as started:
        client = socket.socket()
        client.close()
        assert started == []
        server = socket.socket()
        try:
            server.bind(("127.0.0.1", 0))
            server.listen()
        finally:
            server.close()
    assert len(started) == 1 and "listening" in started[0]


def test_a_server_process_is_seen_and_another_program_is_not():
    with servers_started() as started:
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        assert started == []
        # the module's own parser answers --help and exits: nothing keeps running
        subprocess.run([sys.executable, "-m", "focus.testing.simserver", "--help"], capture_output=True, check=False)
    assert started == ["a server process (python -m focus.testing.simserver)"]


def test_what_counts_as_a_server_process():
    assert _server_in(["/x/.venv/bin/prefect", "server", "start"]) == "/x/.venv/bin/prefect"
    assert _server_in(["python", "-m", "uvicorn", "app:app"]) == "python -m uvicorn"
    assert _server_in(["python", "-m", "focus.tinylm.server", "--port", "0"]) == "python -m focus.tinylm.server"
    assert _server_in(["python", "-c", "import focus.tinylm.server"]) is None
    assert _server_in(["python", "-m", "cli", "collect"]) is None
    assert _server_in("ls") is None
