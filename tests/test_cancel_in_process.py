"""The UI's Cancel of a run no runner or worker started - ``focus collect`` or ``focus
train`` with a Prefect server, a flow called from Python - stops it as a Ctrl-C does: the
run ends ``Cancelled`` within seconds, its finished steps saved and its lease released,
and a rerun with the same collection id resumes and writes the batch an uninterrupted
run writes, bit for bit (``flows.watch.watched``).

Before, nothing acted on the Cancel (Prefect leaves it to the runner or worker that
started the run): the run went on to the end, ``Cancelling`` meanwhile, and ended
``Completed``. Against the session's real Prefect server, with the UI's call (``POST
/api/flow_runs/{id}/set_state`` ``{"type": "CANCELLING"}``)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import httpx
import pytest
from fixtures.digits import ran_out
from test_run_parameters import SMALL, flushed

from storage import BatchStore, CheckpointStore

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def config(root: str, gate: str, cid: str) -> dict[str, Any]:
    phases = [
        {"name": "evidence", "rollouts_per_task": 2},
        {"name": "continue", "transitions": 30, "wave_size": 3, "max_depth": 4},
    ]
    return {
        **SMALL,
        "collection_id": cid,
        "search": {"phases": phases},
        # answers the evidence and three waves, then waits for the gate (as tests/test_deploy.py)
        "model": {
            "kind": "factory",
            "factory": "fixtures.digits:gated_policy",
            "options": {"gate": gate, "free_calls": 21},
        },
        "storage": {"root": root},
    }


def cancel_once_a_wave_is_saved(api: str, root: str, cid: str) -> threading.Thread:
    def act() -> None:
        store, deadline = CheckpointStore(root), time.monotonic() + 60
        while not any(p.startswith("1.continue") for p, _ in store.list(cid)):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        body = {"flow_runs": {"name": {"any_": [cid]}}}
        (run,) = httpx.post(f"{api}/flow_runs/filter", json=body, timeout=30).json()
        r = httpx.post(f"{api}/flow_runs/{run['id']}/set_state", json={"state": {"type": "CANCELLING"}}, timeout=30)
        assert r.json()["status"] == "ACCEPT", r.text

    thread = threading.Thread(target=act, daemon=True)
    thread.start()
    return thread


def test_a_cli_or_python_run_cancelled_in_the_ui_ends_cancelled_and_resumes_bit_for_bit(prefect_api, tmp_path):
    from flows.collect import collect

    root, gate, cid = str(tmp_path / "store"), tmp_path / "gate", "cancelled-here"
    cfg = config(root, str(gate), cid)
    acting = cancel_once_a_wave_is_saved(prefect_api, root, cid)
    t0 = time.monotonic()
    state = asyncio.run(flushed(collect(cfg, return_state=True)))
    took = time.monotonic() - t0
    acting.join(5)
    assert state.is_cancelled(), state
    assert "was cancelled (the Prefect UI's Cancel, or the API)" in (state.message or ""), state.message
    # the Cancel stopped the held call, not the gate's 90 s hold running out: read from the
    # gate, not wall time (a loaded machine is slow)
    assert not ran_out(gate).exists(), f"a call was held its 90 s; the run took {took:.1f} s"
    assert not (tmp_path / "store" / "leases" / f"{cid}.json").exists(), "the cancelled run kept its lease"
    saved = [k for k in CheckpointStore(root).list(cid) if k[0].startswith("1.continue")]
    assert saved

    gate.touch()
    done = asyncio.run(flushed(collect(cfg)))
    assert done["stats"]["steps_reused"] >= len(saved)
    plain = asyncio.run(collect(config(str(tmp_path / "plain"), str(gate), cid)))
    # the same batch as a run nobody cancelled
    assert (
        BatchStore(root).verify(done["batch_url"]).fingerprint
        == BatchStore(str(tmp_path / "plain")).verify(plain["batch_url"]).fingerprint
    )
