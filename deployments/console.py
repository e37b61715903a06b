"""What ``focus deploy`` prints while it serves: a line to start, a line per event an
operator acts on, nothing per task run.

Prefect's ``serve`` printed a banner table, then every flow run's console lines - one
INFO line per task run (``Task run 'wave-1-3' - Finished in state Completed()``, a
dozen a collection) - and, when the Prefect server restarted, the runner's WARNING with
a websocket traceback; nothing said when the server was back. Now:

- the flow-run processes the runner starts print WARNING and above on the console
  (:func:`quiet_flow_runs`); their INFO lines still reach the run's log in the UI, which
  Prefect's API handler sends whatever the console shows (``-v`` shows them again);
- the serving process's own logging is the command's (quiet console, log file);
- :class:`ServerWatch` says once that the server stopped answering and once that it
  answers again (the runner's own warnings and tracebacks go to the log file).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, MutableMapping
from typing import Any

#: The Prefect setting (``logging.yml``'s ``handlers.console.level``, overridden from the
#: environment) that the flow-run processes started by the runner inherit.
CONSOLE_LEVEL = "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL"


def quiet_flow_runs(verbosity: int, environ: MutableMapping[str, str] | None = None) -> None:
    """Have the flow-run processes this one starts print only WARNING and above on the
    console (``verbosity`` 0; a level the user set is kept). Only the console handler's
    level: the ``prefect`` loggers keep INFO, so the run's log in the UI is whole."""
    env = os.environ if environ is None else environ
    if verbosity == 0:
        env.setdefault(CONSOLE_LEVEL, "WARNING")


def start_line(names: list[str], api: str, ui: str | None) -> str:
    """The one line ``focus deploy`` starts with: what it serves, and where to look."""
    where = f"the Prefect UI: {ui.rstrip('/')}/deployments" if ui else f"the Prefect API at {api} (no UI)"
    return (
        f"serving {' and '.join(names)}; runs, their logs and the Run button are in {where}; "
        "this console shows warnings and errors only (-v: every run's log); Ctrl-C stops"
    )


def ui_url() -> str | None:
    """The Prefect UI's address as Prefect derives it (``PREFECT_UI_URL``), or None."""
    from prefect.settings import PREFECT_UI_URL

    value = PREFECT_UI_URL.value()
    return str(value) if value else None


def server_unanswered(api: str, timeout_s: float = 5.0) -> str | None:
    """Why the Prefect server at ``api`` gave no answer to ``GET /health``, or None when
    it answered (a 4xx is an answer: a server that wants a key is there, and the calls
    that follow say the rest). Asked before anything registers, so that an unreachable
    server is one line about deploying, not one about resuming a collection."""
    import httpx

    try:
        response = httpx.get(f"{api.rstrip('/')}/health", timeout=timeout_s)
    # a host no lookup takes (IDNAError, a UnicodeError) or a URL httpx refuses: no answer
    # either, and `focus deploy` showed a rich traceback
    except (httpx.HTTPError, httpx.InvalidURL, UnicodeError) as e:
        return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    return f"status {response.status_code}" if response.status_code >= 500 else None


class ServerWatch:
    """A thread that asks the Prefect server's ``/health`` every ``every_s`` seconds and
    says (through ``say``) once when it stops answering and once when it answers again.
    While it is gone the runner cannot start or report runs; it does once it is back."""

    def __init__(self, api: str, say: Callable[[str], Any], every_s: float = 2.0, timeout_s: float = 5.0) -> None:
        self.api, self.say, self.every_s, self.timeout_s = api.rstrip("/"), say, every_s, timeout_s
        self.gone = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="focus-prefect-watch", daemon=True)

    def why_unanswered(self) -> str | None:
        """Why ``/health`` gave no answer now, or None when it answered (as ``focus deploy`` asks at its start)."""
        return server_unanswered(self.api, self.timeout_s)

    def check(self) -> None:
        """Ask once; say so if the answer changed."""
        why = self.why_unanswered()
        if why and not self.gone:
            self.gone = True
            self.say(
                f"the Prefect server at {self.api} stopped answering ({why}): no run starts or reports until it "
                "is back; serving goes on"
            )
        elif why is None and self.gone:
            self.gone = False
            self.say(f"the Prefect server at {self.api} answers again: serving as before")

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.check()
            except Exception:  # noqa: BLE001, S112 - a watch that fails must not stop the serving
                continue

    def __enter__(self) -> ServerWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
