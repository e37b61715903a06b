"""Two signals are two, however close together they come.

Python runs a signal's handler once for any number of deliveries that came before the
main thread got back to its bytecode (one "tripped" flag per signal): two Ctrl-Cs 50 ms
apart on a loaded machine, or while the main thread was inside a long call into C, read
as one, and the second's "stop now" was lost (the command went on stopping slowly).
:class:`cli.interrupts.Interrupts` counts the deliveries from the wake-up descriptor,
which gets a byte for each.

The test makes the merge certain rather than likely: both signals come while the main
thread is inside one C call (``os.system``), the second once the kernel has delivered the
first (its pending bit cleared, so the kernel does not merge them either). SIGINT takes
the same path, but ``system()`` ignores SIGINT in the caller while it runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not Path(f"/proc/{os.getpid()}/status").exists(), reason="reads /proc (Linux)")

ROOT = Path(__file__).resolve().parents[1]

CHILD = textwrap.dedent(
    """
    import asyncio, os, signal, sys
    from cli.interrupts import Interrupts

    SIG = sys.argv[1]
    signal.signal(signal.SIGHUP, signal.SIG_DFL)  # as a terminal's shell starts it (the tests may run under nohup)

    async def main():
        await asyncio.sleep(0)
        pid = os.getpid()
        delivered = f"while grep -q '^ShdPnd:.*[1-9a-f]' /proc/{pid}/status; do :; done"
        os.system(f"kill -{SIG} {pid}; {delivered}; kill -{SIG} {pid}")
        await asyncio.sleep(60)  # a first signal alone: cancelled here

    with Interrupts() as interrupts:
        try:
            interrupts.run(main())
        except BaseException as e:
            print(f"stopped slowly by {interrupts.signals} ({type(e).__name__})", flush=True)
            sys.exit(1)
    """
)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_two_signals_the_handler_sees_as_one_call_stop_at_once(sig, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, sig.name[3:]],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 128 + sig, (proc.stdout, proc.stderr)
    assert f"interrupted again ({sig.name}): stopped at once" in proc.stderr, (proc.stdout, proc.stderr)


def test_the_descriptor_is_put_back_and_other_signals_are_not_counted():
    from cli.interrupts import Interrupts

    before = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(before)
    with Interrupts() as interrupts:
        theirs = signal.getsignal(signal.SIGUSR1)
        signal.signal(signal.SIGUSR1, lambda *a: None)
        try:
            signal.raise_signal(signal.SIGUSR1)
        finally:
            signal.signal(signal.SIGUSR1, theirs)
        assert interrupts._deliveries.read(interrupts._old) == []
        with pytest.raises(KeyboardInterrupt):  # one signal, nothing running yet: it unwinds
            signal.raise_signal(signal.SIGTERM)
    assert interrupts.signals == [signal.SIGTERM]
    assert signal.set_wakeup_fd(before) == before


TOGETHER = textwrap.dedent(
    """
    import asyncio, os, signal
    from cli.interrupts import Interrupts

    BOTH = {signal.SIGINT, signal.SIGTERM}

    async def main():
        await asyncio.sleep(0)
        signal.pthread_sigmask(signal.SIG_BLOCK, BOTH)
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, BOTH)  # both pending: delivered together
        await asyncio.sleep(60)

    with Interrupts() as interrupts:
        interrupts.run(main())
    """
)


def test_signals_pending_together_count_in_the_handlers_order():
    """The kernel hands SIGINT and SIGTERM pending together to the descriptor SIGTERM
    first, and Python runs their handlers SIGINT first: counted in the descriptor's
    order, the command exited 143 naming SIGINT as the second signal; it exits 130 (the
    first handler's signal) naming SIGTERM, as when each handler call was one signal."""
    proc = subprocess.run(
        [sys.executable, "-c", TOGETHER],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 130, (proc.stdout, proc.stderr)
    assert "interrupted again (SIGTERM): stopped at once" in proc.stderr, (proc.stdout, proc.stderr)
