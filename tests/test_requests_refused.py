"""A model service that refuses every request (401/403/404: a wrong key, path or model
name) stops the collection unfinished, with one line naming the cause.

A 4xx is not retried, so every rollout failed at once, and the collection finished with
an empty batch: in the library (``Collector``, ``tasks.collect``) and the pipeline
(``focus train``, Prefect deployments), with the collection id marked finished, so a
rerun after fixing the key returned the same empty batch. Now the wave raises
:class:`~focus.refusals.RequestsRefused`, nothing of it is kept, and a rerun with the
same id collects. Real parts: a scripted server on loopback, then the same server
answering."""

from __future__ import annotations

import pytest
from fixtures.journal import run_collect

from flows.errors import exit_code, one_line
from focus.agent import Piece, Rollout
from focus.execution import check_outage
from focus.refusals import RequestsRefused
from storage import BatchStore, CheckpointStore
from tasks.config import load_config

pytestmark = pytest.mark.timeout(120)


def _failed(cause: str, steps: int = 0) -> Rollout:
    return Rollout("t", (Piece((), "failed", steps, (1,), cause=cause),))


def test_only_a_wave_refused_whatever_its_requests_hold_stops():
    refused = _failed("model: POST http://m/v1/completions was rejected with status 401: invalid key")
    too_long = _failed("model: POST http://m/v1/completions was rejected with status 400: context length")
    done = Rollout("t", (Piece((), "terminal", 1, ()),))
    with pytest.raises(RequestsRefused, match=r"^the model service refused every request \(3 of 3 .*status 401\)"):
        check_outage([refused] * 3, 1.0)
    check_outage([refused] * 3 + [done], 1.0)  # one answered: a request's own refusal, kept as a failed rollout
    # a 400 may be the prompt's own (over the context length): kept as failed, past a task's
    # opening prompt, and at it too (the task is left out; only where every task of the
    # collection is so does it stop: focus.refusals.check_tasks_refused, test_context_limit.py)
    check_outage([_failed(too_long.leaf.cause, steps=2)] * 3, 1.0)
    check_outage([too_long] * 3, 1.0)
    check_outage([], 1.0)


def _answer() -> dict:
    """A completion as vLLM writes it: two tokens, their log-probs, their ids."""
    ids = [65, 66]
    return {
        "model": "focus-tinylm",
        "choices": [
            {
                "text": "AB",
                "logprobs": {"token_logprobs": [-0.5, -0.7], "tokens": [f"token_id:{t}" for t in ids]},
                "finish_reason": "stop",
                "token_ids": ids,
            }
        ],
    }


def _config(url: str, root: str, cid: str, phases: list[dict]):  # type: ignore[no-untyped-def]
    return load_config(
        overrides={
            "collection_id": cid,
            "model.kind": "openai",
            "model.url": url,
            "model.http": {"outage_wait_s": 0},
            "env.n_tasks": 2,
            "agent.sampling.max_tokens": 8,
            "search.phases": phases,
            "execution.kind": "local",
            "storage.root": root,
            "progress": False,
        },
        environ={},
    )


@pytest.mark.integration
def test_through_prefect_the_flow_run_fails_with_the_line_and_a_rerun_collects(scripted, prefect_api, tmp_path):
    import asyncio

    from prefect.client.orchestration import get_client

    from flows.collect import collect

    cfg = _config(scripted.url, str(tmp_path), "flow-refused", [{"name": "evidence", "rollouts_per_task": 2}])
    scripted.answers[:] = [(403, {}, {"error": "forbidden"})]
    with pytest.raises(RequestsRefused):
        asyncio.run(collect(cfg))

    async def last_run():  # type: ignore[no-untyped-def]
        async with get_client() as client:
            (run,) = await client.read_flow_runs(limit=1, sort="EXPECTED_START_TIME_DESC")
            return run

    run = asyncio.run(last_run())
    assert run.state.is_failed()
    assert "the model service refused every request (4 of 4 rollouts of the wave, status 403)" in run.state.message
    scripted.answers[:] = [(200, {}, _answer())]
    out = asyncio.run(collect(cfg))
    assert BatchStore(str(tmp_path)).read(out["batch_url"]).stats["failed_rollouts"] == 0


def test_a_method_or_protocol_the_server_does_not_implement_is_a_refusal_not_an_outage():
    """501 (Not Implemented) and 505 (HTTP Version Not Supported) say the server cannot do
    this at all: a plain web server behind model.url answers 501 to every POST. They were
    retried as an outage (exit 1 after the outage wait) like 502/503/504, a restart."""
    from focus.backends.retry import is_retry_status

    assert [is_retry_status(s) for s in (500, 502, 503, 504, 501, 505)] == [True] * 4 + [False] * 2
    refused = _failed("model: POST http://m/v1/completions was rejected with status 501: Unsupported method")
    with pytest.raises(RequestsRefused, match=r"status 501\)"):
        check_outage([refused] * 2, 1.0)


def test_the_same_400_for_every_rollout_of_a_wave_is_a_setting_and_stops_it():
    """A sampling setting the server does not take (a temperature outside its range)
    is carried by every request and refused the same way each time: every rollout
    failed, and the collection finished with an empty batch under a spent collection id.
    A 400 that differs from rollout to rollout, or stands alone, or is a prompt over the
    context, is a request's own and is kept as a failed rollout."""
    why = "model: POST http://m/v1/completions was rejected with status 400: temperature must be in [0, 2], got 2.5"
    with pytest.raises(RequestsRefused, match=r"\(3 of 3 rollouts of the wave, status 400\): a setting every"):
        check_outage([_failed(why)] * 3, 1.0)
    with pytest.raises(RequestsRefused, match="status 422"):
        check_outage([_failed(why.replace("400", "422"))] * 2, 1.0)
    check_outage([_failed(why)], 1.0)  # one rollout: its own prompt's as likely as a setting's
    check_outage([_failed(why), _failed(why + "!")], 1.0)  # refusals that differ are the requests' own
    check_outage([_failed(why), Rollout("t", (Piece((), "terminal", 1, ()),))], 1.0)  # one answered
    over = "model: POST http://m/v1/completions was rejected with status 400: maximum context length is 4096"
    check_outage([_failed(over, steps=1)] * 3, 1.0)  # past the opening prompt the agent truncates such a prompt


REFUSALS = {401: "invalid API key", 501: "Unsupported method", 400: "temperature must be in [0, 2], got 2.5"}


@pytest.mark.integration
@pytest.mark.parametrize("status", sorted(REFUSALS))
def test_a_refused_collection_stops_unfinished_and_a_rerun_after_the_fix_collects(scripted, tmp_path, status):
    cfg = load_config(
        overrides={
            "collection_id": "refused",
            "model.kind": "openai",
            "model.url": scripted.url,
            "model.http": {"outage_wait_s": 0},  # (a 501 used to be waited out as an outage)
            "env.n_tasks": 2,
            "agent.sampling.max_tokens": 8,
            "search.phases": [
                {"name": "evidence", "rollouts_per_task": 2},
                {"name": "continue", "transitions": 4, "wave_size": 2, "max_depth": 3},
            ],
            "execution.kind": "local",
            "storage.root": str(tmp_path),
            "progress": False,
        },
        environ={},
    )
    scripted.answers[:] = [(status, {}, {"error": {"message": REFUSALS[status], "code": status}})]
    with pytest.raises(RequestsRefused) as stopped:
        run_collect(cfg)
    line = one_line(stopped.value)
    assert line.startswith(f"the model service refused every request (4 of 4 rollouts of the wave, status {status})"), (
        line
    )
    assert REFUSALS[status] in line and "\n" not in line and exit_code(stopped.value) == 2
    store = CheckpointStore(str(tmp_path))
    assert ("evidence", 0) not in store.list("refused")
    scripted.answers[:] = [(200, {}, _answer())]  # the key is fixed
    out = run_collect(cfg)
    batch = BatchStore(str(tmp_path)).read(out["batch_url"])
    assert batch.stats["failed_rollouts"] == 0 and len(batch.actor) > 0


def test_the_refusal_line_names_only_settings_that_exist():
    """The line said to check ``model.http.api_key``, a field the configuration does not
    have (``--set model.http.api_key=...`` is refused as unknown): every ``model.*`` it
    names must be a configuration field, and the key it names an ``HttpConfig`` field."""
    import re

    from focus.backends import HttpConfig
    from tasks.config.schema import FocusConfig, field_paths

    refused = _failed("model: POST http://m/v1/completions was rejected with status 401: invalid key")
    with pytest.raises(RequestsRefused) as caught:
        check_outage([refused] * 2, 1.0)
    line = str(caught.value)
    named = re.findall(r"\bmodel\.[a-z_.]*[a-z_]", line)
    assert named and set(named) <= set(field_paths(FocusConfig)), named
    assert "HttpConfig.api_key" in line and "api_key" in HttpConfig.model_fields
    # the command's own setting for the key, not the library's alone: a `focus collect` user
    # read `focus.backends.HttpConfig.api_key` and had no field of that name to set
    assert "model.api_key_env" in named, line
