"""Starting a helper process (model server, Prefect server, simulated server).

``subprocess.Popen`` on Linux starts its child with ``vfork``: the child borrows the
parent's memory until it ``exec``-s. Twice in full test runs (2026-12, Linux 6.18 in a
Firecracker VM, Python 3.11) that ``exec`` failed with ``EFAULT`` ("Bad address") while
other threads of the parent were busy, and the command ended on an error for a fault
of the moment. Nothing was started, so starting again is safe; :func:`spawn` does that,
a few times, and raises anything else at once.
"""

from __future__ import annotations

import errno
import subprocess
import time
from typing import Any

#: Starts tried before an ``EFAULT`` is raised.
EFAULT_TRIES = 3


def spawn(cmd: list[str], **popen_kwargs: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen(cmd, **popen_kwargs)``, tried again on a transient ``EFAULT``."""
    for attempt in range(1, EFAULT_TRIES + 1):
        try:
            return subprocess.Popen(cmd, **popen_kwargs)
        except OSError as e:
            if e.errno != errno.EFAULT or attempt == EFAULT_TRIES:
                raise
            time.sleep(0.05 * attempt)
    raise AssertionError("unreachable")
