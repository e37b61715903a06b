"""The ``deployments/prefect.yaml`` path against a real Prefect server: a process work
pool, ``prefect deploy --all``, the two deployments with their schedules, and a run of
the manual deployment (the Run button's call, with a config parameter) picked up by
``prefect worker start`` and completed with its batch in storage.

tests/test_deploy.py covers the ``deployments/serve.py`` path; this one covers what an
operator does with a work pool. The CLI runs as subprocesses with the session server's
environment (its own PREFECT_HOME); the worker is started in its own session and killed
by PID. The deployments and the pool are deleted afterwards, so the ``collect/...``
names are free again for other tests that use the same server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pytest
from fixtures.prefect import ROOT, kill_tree, using_api

from storage import BatchStore

pytestmark = pytest.mark.timeout(120)

YAML = ROOT / "deployments" / "prefect.yaml"
FINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
NAMES = ("collect/pool-scheduled", "collect/pool-manual")


def toy_config() -> dict[str, Any]:
    """A small collection of the embedded toy task with the digit policy: the test
    measures the deployment path, not the model, so the run takes a few seconds. It
    names no store and no execution: the worker's FOCUS_* variables do, at run time."""
    return {
        "seed": 5,
        "progress": False,
        "model": {"kind": "factory", "factory": "fixtures.digits:digit_policy"},
        "env": {"n_tasks": 2},
        "search": {
            "phases": [
                {"name": "evidence", "rollouts_per_task": 2},
                {"name": "continue", "transitions": 6, "wave_size": 3},
            ]
        },
    }


def cli(
    args: list[str], env: dict[str, str], timeout: float = 90, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run a ``prefect`` CLI command from the repository root; fail with its output."""
    proc = subprocess.run(
        [sys.executable, "-m", "prefect", "--no-prompt", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        start_new_session=True,
    )
    assert proc.returncode == 0 or not check, (
        f"prefect {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    )
    return proc


async def _forget(pool: str) -> None:
    """Delete the yaml's deployments (their scheduled runs go with them) and the pool."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    async with get_client() as client:
        for name in NAMES:
            try:
                await client.delete_deployment((await client.read_deployment_by_name(name)).id)
            except ObjectNotFound:
                pass
        try:
            await client.delete_work_pool(pool)
        except ObjectNotFound:
            pass


@pytest.fixture(scope="module")
def deployed(
    prefect_server: str, prefect_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, dict[str, str]]]:
    """A fresh process work pool with the yaml's deployments in it: (pool, worker env).

    Made once for the module's tests (three Prefect and ``focus`` commands, 5-7 s of a
    test's time on 2 cores): neither test changes what the other reads. The run test drops
    ``pool-scheduled`` (the other reads only ``pool-manual``) and deletes the deployments
    ``focus deploy`` registers beside them; the refusal test deletes the one run it makes."""
    pool = f"focus-test-{uuid.uuid4().hex[:8]}"
    # FOCUS_WORK_POOL is read by `prefect deploy`; FOCUS_PROJECT_DIR is left to the worker,
    # where each flow run's pull step reads it (set at deploy time, it would be stored)
    env = {**prefect_env, "FOCUS_WORK_POOL": pool}
    try:
        cli(["work-pool", "create", pool, "--type", "process"], env)
        cli(["deploy", "--all", "--prefect-file", str(YAML)], env)
        # the documented step after `prefect deploy`: close the schemas (the watchdog: tests/test_deploy.py)
        focus = [sys.executable, "-m", "cli", "deploy", "--work-pool", "--crash-after", "0"]
        done = subprocess.run(focus, env=env, cwd=ROOT, capture_output=True, text=True, timeout=90)
        assert done.returncode == 0, done.stdout + done.stderr
        closed = {line.split()[1].rstrip(":") for line in done.stdout.splitlines() if line.startswith("deployment ")}
        assert set(NAMES) <= closed, done.stdout
        yield pool, {**env, "FOCUS_PROJECT_DIR": str(ROOT)}
    finally:
        with using_api(prefect_server, tmp_path_factory.mktemp("workpool_client")):
            asyncio.run(_forget(pool))


async def _wait_final(client: Any, run_id: Any, worker: subprocess.Popen, log: Path, timeout: float = 90) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        run = await client.read_flow_run(run_id)
        if run.state_type.value in FINAL:
            return run
        if worker.poll() is not None:
            raise AssertionError(f"worker exited with {worker.returncode}: {log.read_text(encoding='utf-8')[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(
                f"flow run stayed {run.state_type.value}; worker log: {log.read_text(encoding='utf-8')[-3000:]}"
            )
        await asyncio.sleep(0.3)


async def _kill_unfinished_run(client: Any, run_id: Any) -> None:
    """A worker may start a flow run in a session of its own, out of reach of killing the
    worker's group: if the run did not finish, kill it by the PID the worker recorded."""
    run = await client.read_flow_run(run_id)
    if run.state_type.value in FINAL or not run.infrastructure_pid:
        return
    pid = int(str(run.infrastructure_pid).rpartition(":")[2])
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)


async def _deploy_and_run(pool: str, env: dict[str, str], store: Path, tmp_path: Path) -> Any:
    """Check the deployments, start the manual one with a config, let a worker run it."""
    from prefect.client.orchestration import get_client

    async with get_client() as client:
        scheduled = await client.read_deployment_by_name("collect/pool-scheduled")
        manual = await client.read_deployment_by_name("collect/pool-manual")
        assert scheduled.work_pool_name == pool and manual.work_pool_name == pool
        assert scheduled.entrypoint == manual.entrypoint == "flows/collect.py:collect"
        assert [s.schedule.cron for s in scheduled.schedules] == ["0 * * * *"]
        assert all(s.active for s in scheduled.schedules)
        assert manual.schedules == []
        phases = scheduled.parameters["config"]["search"]["phases"]
        assert [p["name"] for p in phases] == ["evidence", "continue"] and manual.parameters == {}
        assert scheduled.global_concurrency_limit.limit == manual.global_concurrency_limit.limit == 1
        # the pull step is stored unresolved: the worker's FOCUS_PROJECT_DIR decides at run time
        assert manual.pull_steps == [
            {"prefect.deployments.steps.set_working_directory": {"directory": "{{ $FOCUS_PROJECT_DIR }}"}}
        ]
        # near the top of the hour the scheduler would hand this pool an hourly run with the
        # default (heavy) config: drop the scheduled deployment before a worker starts
        await client.delete_deployment(scheduled.id)

        # `focus deploy`'s deployments registered next to these do not replace them
        from deployments.serve import DeploySpec, build_deployments

        served = await asyncio.to_thread(build_deployments, DeploySpec(manual={"seed": 42}, cron="0 3 * * *"))
        try:
            for d in served:
                await d.aapply()
            after = await client.read_deployment_by_name("collect/pool-manual")
            assert after.id == manual.id and after.parameters == {} and after.work_pool_name == pool
            assert (await client.read_deployment_by_name("collect/manual")).parameters == {"config": {"seed": 42}}
        finally:
            for d in served:
                with contextlib.suppress(Exception):
                    await client.delete_deployment((await client.read_deployment_by_name(f"collect/{d.name}")).id)

        # the Run button: a flow run of the deployment with an edited config parameter
        run = await client.create_flow_run_from_deployment(manual.id, parameters={"config": toy_config()})
        log = tmp_path / "worker.log"
        with open(log, "wb") as out:
            # cwd is not the project: the pull step must move the flow run there
            # where the store is and how rollouts run: the worker's environment, read at run time
            run_env = {**env, "FOCUS_STORAGE__ROOT": str(store), "FOCUS_EXECUTION__KIND": "local"}
            worker = subprocess.Popen(
                [sys.executable, "-m", "prefect", "worker", "start", "--pool", pool, "--type", "process"],
                env=run_env,
                cwd=tmp_path,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                done = await _wait_final(client, run.id, worker, log)
            finally:
                kill_tree(worker)
                await _kill_unfinished_run(client, run.id)
        assert done.state_type.value == "COMPLETED", log.read_text(encoding="utf-8")[-3000:]
        assert done.deployment_id == manual.id and done.work_pool_name == pool

        # the flow's return value is not persisted; its batch URL is in the stats artifact
        from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

        arts = await client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[done.id]))
        )
        return done, [a for a in arts if (a.key or "").endswith("-stats")]


def test_prefect_yaml_work_pool_deploys_and_runs(deployed, prefect_api, tmp_path):
    pool, env = deployed
    store = tmp_path / "store"
    done, stats_artifacts = asyncio.run(_deploy_and_run(pool, env, store, tmp_path))

    assert len(stats_artifacts) == 1
    data = stats_artifacts[0].data
    stats = {r["statistic"]: r["value"] for r in (json.loads(data) if isinstance(data, str) else data)}
    # a run without a collection id gets a readable one: deployment, scheduled time, random part
    cid = stats["collection_id"]
    assert re.fullmatch(r"pool-manual-\d{8}-\d{6}-[0-9a-f]{6}", cid) and cid.endswith(
        str(done.id).replace("-", "")[-6:]
    )
    # the worker's FOCUS_STORAGE__ROOT decided where the batch went
    batch_url = BatchStore(str(store)).url_for(cid, 0)
    assert stats["batch_url"] == batch_url

    # the batch, read back from its Parquet files by DuckDB and polars
    path = Path(batch_url.removeprefix("file://"))
    assert batch_url.startswith("file://") and (path / "_manifest.json").is_file()
    with duckdb.connect() as db:
        rows, cids, tasks = db.execute(
            "select count(*), count(distinct collection_id), count(distinct task_id) "
            f"from read_parquet('{path}/actor/*.parquet')"
        ).fetchone()
    assert rows > 0 and cids == 1 and tasks == 2
    actor = pl.read_parquet(path / "actor" / "*.parquet")
    assert actor["collection_id"].unique().to_list() == [cid]
    assert (actor["completion_ids"].list.len() == actor["logprobs"].list.len()).all()
    assert pl.read_parquet(path / "critic" / "*.parquet").height > 0


def test_work_pool_deployments_refuse_a_parameter_the_flow_lacks(deployed, prefect_api):
    """`prefect deploy` stores the flow's open schema; after `focus deploy --work-pool` the
    server refuses a run naming a parameter the flow does not take when it is created.
    Before, it was created and crashed in Prefect's engine (`Process exited with status
    code: 1`) on the worker, the cause only in the worker's console."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import PrefectHTTPStatusError

    async def runs() -> tuple[str, Any]:
        async with get_client() as client:
            manual = await client.read_deployment_by_name("collect/pool-manual")
            with pytest.raises(PrefectHTTPStatusError) as refused:
                await client.create_flow_run_from_deployment(manual.id, parameters={"bogus": 1})
            # a run of the parameters the flow takes is still created (and not run here)
            run = await client.create_flow_run_from_deployment(manual.id, parameters={"config": {"seed": 3}})
            await client.delete_flow_run(run.id)
            return str(refused.value), manual.parameter_openapi_schema

    refused, schema = asyncio.run(runs())
    assert "409" in refused and "'bogus' was unexpected" in refused, refused
    # the rest of the schema is Prefect's own: the config form's properties are kept
    assert schema["additionalProperties"] is False and set(schema["properties"]) == {"config", "allow_policy_change"}


def test_prefect_yaml_without_pool_variable_fails_naming_it(prefect_env):
    """Prefect's templating has no defaults: an unset FOCUS_WORK_POOL must stop the deploy
    with an error that names the unresolved pool, not register deployments nobody runs."""
    proc = cli(["deploy", "--all", "--prefect-file", str(YAML)], prefect_env, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "{{ $FOCUS_WORK_POOL }}" in out and "does not exist" in out, out
