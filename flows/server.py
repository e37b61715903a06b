"""Which Prefect API the ``focus`` command talks to, and a quick temporary server.

With ``PREFECT_API_URL`` set (in the environment or the active Prefect profile) the CLI
uses that server. Without one it starts a temporary server for the command, as Prefect's
ephemeral mode does - the same ``uvicorn`` command, database and settings - with two
differences measured to matter: it is started *before* anything else and waited for
only when the flow begins, so its start (3-4 s, mostly imports) overlaps with the model
server's start and the CLI's own imports; and this process never imports
``prefect.server`` (2.9 s) just to launch it, as Prefect's ``SubprocessASGIServer`` does.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import IO, Any

from focus.spawn import spawn


def configured_api_url(environ: dict[str, str] | None = None) -> str | None:
    """``PREFECT_API_URL`` from the environment, else from the active Prefect profile
    (``$PREFECT_PROFILES_PATH`` or ``$PREFECT_HOME/profiles.toml``), read without
    importing Prefect (whose settings freeze on import)."""
    env = os.environ if environ is None else environ
    if env.get("PREFECT_API_URL"):
        return env["PREFECT_API_URL"]
    home = Path(env.get("PREFECT_HOME") or Path.home() / ".prefect").expanduser()
    path = Path(env.get("PREFECT_PROFILES_PATH") or home / "profiles.toml").expanduser()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    active = env.get("PREFECT_PROFILE") or data.get("active")
    url = data.get("profiles", {}).get(active, {}).get("PREFECT_API_URL") if active else None
    return str(url) if url else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: Where a Prefect server's database is named (Prefect 3's name, and its older one).
DATABASE_URL_VARIABLES = ("PREFECT_SERVER_DATABASE_CONNECTION_URL", "PREFECT_API_DATABASE_CONNECTION_URL")


class PrefectHomeUnwritable(RuntimeError):
    """``PREFECT_HOME`` names a folder this user cannot write: a temporary server keeps its
    database there. ``str()`` is the one line."""


def check_prefect_home(env: Any = None) -> None:
    """Refuse, in one line naming it, a ``PREFECT_HOME`` the user set that cannot hold the
    temporary server's database (``<home>/prefect.db``): the server exited with status 3
    and the line said only ``the temporary Prefect server exited with status 3 while
    starting (see the log file)``, the cause (``sqlite3.OperationalError: unable to open
    database file``) 40 lines into the log. An unset one is moved where it can be written
    (:func:`cli.common.writable_prefect_home`); a database named elsewhere is not checked."""
    env = os.environ if env is None else env
    if not env.get("PREFECT_HOME") or any(env.get(k) for k in DATABASE_URL_VARIABLES):
        return
    home = Path(env["PREFECT_HOME"]).expanduser()
    try:
        home.mkdir(parents=True, exist_ok=True)
        if os.access(home, os.W_OK | os.X_OK):
            return
        why = "Permission denied"
    except OSError as e:
        why = e.strerror or type(e).__name__
    raise PrefectHomeUnwritable(
        f"PREFECT_HOME={home} cannot be written ({why}): the temporary Prefect server keeps its database "
        "there; set PREFECT_HOME to a folder you can write (or unset it), or PREFECT_API_URL to a running server"
    )


class TemporaryServer:
    """A Prefect API server on 127.0.0.1 for the life of one command."""

    def __init__(self, log: IO[bytes] | None = None, startup_timeout_s: float = 120.0) -> None:
        self.port = _free_port()
        self.log = log
        self.startup_timeout_s = startup_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def start(self) -> TemporaryServer:
        """Launch the server process (returns at once; :meth:`wait` for it)."""
        import importlib.util

        spec = importlib.util.find_spec("prefect")
        if spec is None or spec.origin is None:
            raise RuntimeError("Prefect is not installed: pip install 'focus-rl[pipeline]'")
        check_prefect_home()
        app_dir = str(Path(spec.origin).parent.parent)
        env = {
            **os.environ,
            "PREFECT_UI_ENABLED": "0",
            "PREFECT__SERVER_EPHEMERAL": "1",
            "PREFECT__SERVER_FINAL": "1",
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        }
        env.pop("PREFECT_API_URL", None)
        out: Any = self.log if self.log is not None else subprocess.DEVNULL
        self.proc = spawn(
            # flows.guard: it stops when this process is gone, however this process ended
            [sys.executable, "-m", "flows.guard", "--parent-pid", str(os.getpid()), "-m", "uvicorn"]
            + ["--app-dir", app_dir, "--factory"]
            + ["prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(self.port)]
            + ["--log-level", "error", "--lifespan", "on"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            # its own session: a terminal's Ctrl-C reaches the command, which stops the
            # server itself once the flow run is recorded, not the server first
            start_new_session=True,
        )
        return self

    def wait(self) -> None:
        """Until ``/api/health`` answers; ``RuntimeError`` naming the cause if it does not."""
        import httpx

        assert self.proc is not None, "start() first"
        deadline = time.monotonic() + self.startup_timeout_s
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        f"the temporary Prefect server exited with status {self.proc.returncode} while starting "
                        "(see the log file); set PREFECT_API_URL to use a running server instead"
                    )
                try:
                    if client.get(f"{self.api_url}/health").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
        raise RuntimeError(
            f"the temporary Prefect server did not answer within {self.startup_timeout_s:.0f} s; "
            "set PREFECT_API_URL to use a running server instead"
        )

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)

    def __enter__(self) -> TemporaryServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
