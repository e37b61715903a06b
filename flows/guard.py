"""``python -m flows.guard --parent-pid N -m <module> <args>``: run ``<module>`` as
``python -m`` does, for as long as process ``N`` (the one that started it) lives.

The temporary Prefect server of a command (:mod:`flows.server`) runs in a session of its
own, so that a terminal's Ctrl-C reaches the command and not the server; the command
stops it as it ends. A command that died instead - SIGKILL, the OOM killer, a SIGHUP it
could not answer - left the server running for good (a uvicorn process holding its port
and its database, one more per such run). The embedded model server already exits when
its parent is gone (``focus.tinylm.server --parent-pid``); this does the same for any
module: once the parent is gone (this process was handed to another parent), it sends
itself SIGTERM, the server's own graceful stop, and exits at the latest
:data:`GRACE_S` seconds later.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import threading
import time

#: How often the parent is looked for, and how long a graceful stop may take.
POLL_S = 0.5
GRACE_S = 10.0


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(POLL_S)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(GRACE_S)
    os._exit(1)


def main(argv: list[str]) -> None:
    if len(argv) < 4 or argv[0] != "--parent-pid" or argv[2] != "-m":
        sys.exit("usage: python -m flows.guard --parent-pid N -m MODULE [ARGS...]")
    threading.Thread(target=_watch, args=(int(argv[1]),), daemon=True, name="focus-parent-watch").start()
    sys.argv = [argv[3], *argv[4:]]
    runpy.run_module(argv[3], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
