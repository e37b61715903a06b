"""A model service that changes weights while a collection's first step runs (a server
restarted on a new checkpoint, a weights update pushed during the evidence wave).

Later steps were already refused when their rollouts report another version than the
steps before them (tests/test_pipeline_journal.py); the first step had nothing to
compare with, so rollouts of two policies in it were kept and the batch mixed them
without a word (seen through the loopback proxy: 10 actor rows of the old weights, 38
of the new). Now a first step whose rollouts report several versions is refused the
same way, naming them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from fixtures.journal import run_collect
from fixtures.prefect import DigitPolicy
from test_pipeline import small_config

from storage import BatchStore
from tasks.fingerprint import PolicyChanged
from tasks.journal import CheckpointJournal

pytestmark = pytest.mark.timeout(120)


class Switching(DigitPolicy):
    """The digit policy, reporting ``weights-b`` from its ``after``-th answer on."""

    def __init__(self, after: int, **options: Any) -> None:
        super().__init__(**options)
        self.after, self.calls = after, 0

    async def sample(self, prompt_ids: Any, params: Any) -> Any:
        out = await super().sample(prompt_ids, params)
        self.calls += 1
        return dataclasses.replace(out, policy_version="weights-b" if self.calls > self.after else "weights-a")


def switching_policy(after: int) -> Switching:
    return Switching(after)


MODEL = {"model.factory": "test_weights_mid_run:switching_policy"}


def test_weights_that_change_during_the_first_step_are_refused(tmp_path):
    cfg = small_config(str(tmp_path / "store"), "mid-evidence", **MODEL, **{"model.options": {"after": 3}})
    journal = CheckpointJournal(cfg)
    with pytest.raises(PolicyChanged, match=r"evidence step were sampled by 2 policies \(weights-a, weights-b\)"):
        run_collect(cfg, journal)
    assert journal.load(("evidence", 0)) is None  # nothing of the mixed step is saved
    out = run_collect(cfg, CheckpointJournal(cfg, allow_policy_change=True))
    versions = {r.policy_version for r in BatchStore(cfg.storage.root).read(out["batch_url"]).actor}
    assert versions == {"weights-a", "weights-b"}  # allowed: the column says which row is which


def test_one_policy_throughout_is_collected_as_before(tmp_path):
    cfg = small_config(str(tmp_path / "store"), "steady", **MODEL, **{"model.options": {"after": 10**9}})
    out = run_collect(cfg)
    versions = {r.policy_version for r in BatchStore(cfg.storage.root).read(out["batch_url"]).actor}
    assert versions == {"weights-a"}


def test_weights_that_change_during_a_later_wave_name_only_the_new_version(tmp_path):
    """A server restarted on other weights in the middle of a continuation wave: the
    wave's rollouts report both versions. The line said `sampled by policy weights-a,
    the model service now serves weights-a, weights-b` (seen with `focus serve-model`
    killed and restarted with a trained version mid-collection); it names the new one."""
    steady = small_config(str(tmp_path / "count"), "count", **MODEL, **{"model.options": {"after": 10**9}})
    journal = CheckpointJournal(steady)
    run_collect(steady, journal)
    evidence = journal.load(("evidence", 0))
    calls = sum(len(e.turns) for t in evidence.trees for e in t.edges.values())
    cfg = small_config(str(tmp_path / "store"), "mid-wave", **MODEL, **{"model.options": {"after": calls + 2}})
    refused = CheckpointJournal(cfg)
    with pytest.raises(PolicyChanged) as err:
        run_collect(cfg, refused)
    assert "sampled by policy weights-a, the model service now serves weights-b:" in str(err.value), err.value
    assert refused.load(("evidence", 0)) is not None  # the finished steps are kept
