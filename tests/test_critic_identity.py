"""A batch is scored by one critic: the collection saves the identity of the critic it
started with (what it predicts on fixed probe contexts), and a resume that meets
another critic behind the same configuration is refused in one line naming both,
unless the user allows it (``--allow-policy-change``, the journal's
``allow_policy_change``)."""

from __future__ import annotations

import asyncio

import pytest
from fixtures.journal import StopAfter, Stopped, run_collect
from test_pipeline import small_config

from focus.critic import ConstantCritic, LocalCritic
from focus.critic_server import serve_critic
from focus.journal import wave_step
from storage import BatchStore
from tasks.fingerprint import CRITIC_KEY, CriticChanged, critic_identity
from tasks.journal import CheckpointJournal


@pytest.mark.needs("torch")
def test_the_identity_tells_critics_apart_and_is_stable():
    same = [asyncio.run(critic_identity(ConstantCritic(0.5))) for _ in range(2)]
    assert same[0] == same[1] and same[0].startswith("ConstantCritic ")
    assert asyncio.run(critic_identity(ConstantCritic(0.25))) != same[0]
    fresh, refit = LocalCritic(seed=0), LocalCritic(seed=0)
    rows = [type("Row", (), {"context_ids": (1, 2, 3), "target": 1.0, "weight": 1.0})()]
    refit.fit(rows, epochs=5)
    assert asyncio.run(critic_identity(fresh)) != asyncio.run(critic_identity(refit))


def test_the_identity_of_a_critic_that_raises_or_answers_plain_numbers():
    """The pipeline's first critic call is the identity's probe: a critic raising inside
    ``predict_with_std`` stopped the run with its bare error (``KeyError: 'value'``),
    and one answering plain numbers (a list of floats, a numpy array), which the
    collector reads as values without a std, with "'float' object has no attribute
    'value'" from tasks/fingerprint.py."""
    import numpy as np

    from focus.critic import Critic, CriticError

    class Raising(Critic):
        async def predict(self, contexts):  # type: ignore[no-untyped-def]
            return {}["value"]

    class Plain(Critic):
        def __init__(self, answer):  # type: ignore[no-untyped-def]
            self.answer = answer

        async def predict(self, contexts):  # type: ignore[no-untyped-def]
            raise AssertionError  # pragma: no cover - predict_with_std is overridden

        async def predict_with_std(self, contexts):  # type: ignore[no-untyped-def]
            return self.answer(len(contexts))

    with pytest.raises(CriticError, match=r"^critic Raising raised KeyError: 'value' while scoring 6 contexts$"):
        asyncio.run(critic_identity(Raising()))
    same = asyncio.run(critic_identity(ConstantCritic(0.5))).split()[1]
    assert asyncio.run(critic_identity(Plain(lambda n: [0.5] * n))) == f"Plain {same}"
    assert asyncio.run(critic_identity(Plain(lambda n: np.full(n, 0.5)))) == f"Plain {same}"
    with pytest.raises(CriticError, match=r"^critic Plain returned a non-finite value nan at position 0$"):
        asyncio.run(critic_identity(Plain(lambda n: [float("nan")] * n)))


@pytest.mark.integration
def test_a_resume_with_another_critic_behind_the_same_url_is_refused_unless_allowed(tmp_path):
    """A scoring service restarted with other weights at the same URL: the configuration
    is the same, the critic is not. The resume is refused before anything is replayed or
    saved, naming both critics; allowed explicitly, it finishes."""
    served = ConstantCritic(0.5)
    with serve_critic(served) as url:
        cfg = small_config(str(tmp_path / "store"), "critic-switch", **{"critic.kind": "http", "critic.url": url})
        with pytest.raises(Stopped):
            run_collect(cfg, StopAfter(cfg, wave_step(1, 0)))
        first = CheckpointJournal(cfg).load(CRITIC_KEY)
        assert first.startswith("HttpCritic ")
        served.value = 0.75  # the service now serves another critic
        refused = CheckpointJournal(cfg)
        with pytest.raises(CriticChanged) as err:
            run_collect(cfg, refused)
        message = str(err.value)
        assert "\n" not in message and f"scored by critic {first}, the critic now is HttpCritic " in message
        assert "--allow-policy-change" in message
        assert refused.records == [r for r in refused.records if r.kind == "config"]  # nothing replayed
        assert refused.load(("1.continue", 1)) is None and refused.load(CRITIC_KEY) == first
        out = run_collect(cfg, CheckpointJournal(cfg, allow_policy_change=True))
        assert out["stats"]["steps_reused"] > 0
        assert BatchStore(cfg.storage.root).read(out["batch_url"]).critic
        # the same critic again: the resume of a finished collection goes ahead as before
        served.value = 0.5
        assert run_collect(cfg)["batch_url"] == out["batch_url"]


@pytest.mark.integration
def test_a_resume_with_the_same_critic_is_bit_identical(tmp_path):
    """The probe is one more critic call per run: it changes no score, so a stopped and
    resumed collection with the same critic writes the batch an uninterrupted one does."""
    with serve_critic(ConstantCritic(0.5)) as url:
        critic = {"critic.kind": "http", "critic.url": url}
        cfg = small_config(str(tmp_path / "store"), "critic-same", **critic)
        whole = small_config(str(tmp_path / "store"), "critic-whole", **critic)
        with pytest.raises(Stopped):
            run_collect(cfg, StopAfter(cfg, wave_step(1, 0)))
        resumed = run_collect(cfg)
        want = run_collect(whole)
    store = BatchStore(cfg.storage.root)
    a, b = store.read(resumed["batch_url"]), store.read(want["batch_url"])
    assert a.actor_table.drop(["collection_id"]).equals(b.actor_table.drop(["collection_id"]))
    assert a.critic_table.drop(["collection_id"]).equals(b.critic_table.drop(["collection_id"]))


@pytest.mark.integration
@pytest.mark.needs("torch")  # a LocalCritic
def test_a_resume_after_the_critic_weights_file_was_refit_is_refused(tmp_path):
    """``critic.weights`` names a file, not its contents: the train loop (or a person)
    writes a refit critic to the same path, and the configuration still agrees."""
    weights = str(tmp_path / "critic.pt")
    LocalCritic(seed=0).save(weights)
    cfg = small_config(str(tmp_path / "store"), "critic-refit", **{"critic.kind": "local", "critic.weights": weights})
    with pytest.raises(Stopped):
        run_collect(cfg, StopAfter(cfg, wave_step(1, 0)))
    refit = LocalCritic(seed=0)
    refit.fit([type("Row", (), {"context_ids": (1, 2, 3), "target": 1.0, "weight": 1.0})()], epochs=5)
    refit.save(weights)
    with pytest.raises(CriticChanged, match=r"scored by critic LocalCritic \w+, the critic now is LocalCritic \w+"):
        run_collect(cfg)
