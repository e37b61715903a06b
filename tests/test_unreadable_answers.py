"""Answers the client cannot read, repeated: a setting to fix, told at once.

SGLang's ``/v1/completions`` names its log-prob tokens by their text and returns no ids
(``model.kind = openai`` against it): every answer is malformed the same way. The client
retried each call ``max_retries`` times, the rollout was run again twice, and the wave
failed after 20-28 s as a "model service outage", the cause at the end of the line. Now
the first answers of a collection, all malformed with one cause, stop it with one line
that leads with the cause. What must still be retried (an aborted answer, a cut body,
one request answered badly on every try) is in test_foreign_servers.py and
test_bad_response.py.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from flows.errors import exit_code, one_line
from focus.backends.unreadable import Unreadable, cause_key
from focus.policy import UnreadableAnswers
from focus.testing.faults import FaultProxy

pytestmark = pytest.mark.timeout(120)


def sglang_v1(answer: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """SGLang's OpenAI completions: token texts in ``logprobs.tokens``, no ``token_ids``."""
    ch = answer["choices"][0]
    ids = ch.pop("token_ids")
    ch["logprobs"]["tokens"] = [chr(97 + t % 26) for t in ids]
    return answer


def test_one_cause_in_a_row_stops_only_where_it_cannot_pass():
    assert cause_key("log-prob token 'a' is not of the form 'token_id:<id>'") == cause_key(
        "log-prob token 'q' is not of the form 'token_id:<id>'"
    )
    assert cause_key("3 tokens but 2 log-probs") == cause_key("7 tokens but 6 log-probs")
    fresh = Unreadable()
    # the first request of a collection answered badly on every try: its rollout's bad response
    assert not any(fresh.malformed("finish_reason 'abort' after 1 token", b"a") for _ in range(3 * Unreadable.FIRST))
    fresh = Unreadable()
    assert not any(fresh.malformed("finish_reason 'abort' after 1 token", b"a") for _ in range(Unreadable.FIRST - 1))
    assert fresh.malformed("finish_reason 'abort' after 3 token", b"b")  # the FIRST-th, a second request
    later = Unreadable()
    later.answered()
    # one request answered badly on every try (its seeded sample repeats): a bad response, not a format
    assert not any(later.malformed("2 tokens but 1 log-probs", b"same") for _ in range(100))
    later.answered()
    for i in range(Unreadable.LATER - 1):
        assert not later.malformed("2 tokens but 1 log-probs", b"r%d" % (i % 3))
    assert later.malformed("2 tokens but 1 log-probs", b"r0")
    # another cause, or a good answer, between: counted afresh
    mixed = Unreadable()
    for i in range(20):
        assert not mixed.malformed("not JSON" if i % 2 else "no 'choices' in the answer", b"x")
    mixed.answered()
    assert not mixed.malformed("no 'choices' in the answer", b"x")


@pytest.mark.integration
def test_a_server_of_another_shape_stops_the_collection_at_once_naming_the_cause(local_model_server, tmp_path):
    from fixtures.journal import run_collect

    from storage import CheckpointStore
    from tasks.config import load_config

    with FaultProxy(local_model_server.url, reshape=sglang_v1) as proxy:
        cfg = load_config(
            overrides={
                "collection_id": "shape",
                "model.kind": "openai",
                "model.url": proxy.url,
                "model.http": {"outage_wait_s": 0},  # the default retries otherwise
                "env.n_tasks": 4,
                "agent.sampling.max_tokens": 8,
                "search.phases": [{"name": "evidence", "rollouts_per_task": 3}],
                "execution.kind": "local",
                "storage.root": str(tmp_path),
                "progress": False,
            },
            environ={},
        )
        t0 = time.monotonic()
        with pytest.raises(UnreadableAnswers) as stopped:
            run_collect(cfg)
        took = time.monotonic() - t0
    line = one_line(stopped.value)
    assert line.startswith("the model service's answers cannot be read: MalformedResponse: log-prob token "), line
    assert "is model.kind right" in line and "none readable yet" in line and "\n" not in line
    assert exit_code(stopped.value) == 2
    assert ("evidence", 0) not in CheckpointStore(str(tmp_path)).list("shape")
    print(f"stopped after {took:.2f} s")
