"""A Dask worker process's warnings (a model service that does not answer, a server
that ignores seeds) went to Python's last-resort handler: the bare message on standard
error, where an in-process run says ``warning: <message>``, and not in the log file.
They now read as the command's own lines (``focus/dask_preload.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from fixtures.prefect import ROOT

MESSAGE = "model service at http://x unreachable, waiting"


def run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("DASK_LOGGING")}
    environ |= {"PYTHONPATH": str(ROOT), **env}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=environ, capture_output=True, text=True, timeout=120
    )


WORKER = f"""
    import logging
    from focus.dask_preload import warnings_as_the_command_says_them
    warnings_as_the_command_says_them()
    log = logging.getLogger("focus.backends.outage")
    log.warning("{MESSAGE}", extra={{"focus_console": True}})
    log.warning("a warning the quiet console leaves to the log file")
"""


def test_a_worker_warning_reads_as_the_commands(tmp_path):
    done = run(WORKER)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        f"warning: {MESSAGE}",
        "warning: a warning the quiet console leaves to the log file",
    ]
    # the command's console is quiet (its log file named for the workers): as in-process,
    # only the lines marked for the console show; every one is in the file
    log = tmp_path / "focus.log"
    quiet = run(WORKER, DASK_LOGGING__HANDLERS__FILE__FILENAME=str(log))
    assert quiet.stderr.splitlines() == [f"warning: {MESSAGE}"], quiet.stderr
    assert MESSAGE in log.read_text() and "leaves to the log file" in log.read_text()


@pytest.mark.integration  # a LocalCluster's worker process
@pytest.mark.timeout(180)
def test_a_real_workers_warning_reads_as_the_commands():
    done = run(f"""
        import logging
        from distributed import Client, LocalCluster

        def warn():
            logging.getLogger("focus.backends.outage").warning("{MESSAGE}", extra={{"focus_console": True}})

        if __name__ == "__main__":
            with LocalCluster(
                n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                preload=["focus.dask_preload"], dashboard_address=None,
            ) as cluster, Client(cluster) as client:
                client.submit(warn).result()
    """)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"warning: {MESSAGE}" in done.stderr.splitlines(), done.stderr[-3000:]
