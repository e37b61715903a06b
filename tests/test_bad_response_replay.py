"""The collector's loop with rollouts that get bad responses on every run (no server:
synthetic tasks, a policy that answers some continuation calls with a bad response).

Waves: the collection stops at the wave, a journal holds the wave's other rollouts as
unfinished, and a rerun with the same journal runs only the stopped rollouts, ending
with the batch of a clean run. Streaming: the phase stops (nothing of it is kept).
The same through the real model server and the pipeline: tests/test_bad_response.py.
"""

from __future__ import annotations

import pytest

from focus.agent import Agent
from focus.collector import Collector
from focus.env import Task
from focus.estimation import DirectBranchTd
from focus.execution import BadResponses, Execution, is_bad_response
from focus.journal import MemoryJournal, unfinished_step, wave_step
from focus.policy import BadResponse
from focus.priority import Phase, Selective
from focus.synthetic import SHAPES, SyntheticCritic, SyntheticEnv, SyntheticPolicy, synthetic_format
from focus.testing import run

PHASES = (
    Phase("evidence", rollouts_per_task=2),
    Phase("continue", transitions=40, wave_size=8, max_branches=3, max_depth=8),
)


class Breakable(SyntheticPolicy):
    """Once ``broken``, answers a call whose seed is a multiple of 5 with a bad response
    (every run of a rollout makes the same calls, so its every run gets it)."""

    broken = False

    async def sample(self, prompt_ids, params):  # type: ignore[no-untyped-def]
        if self.broken and params.seed is not None and params.seed % 5 == 0:
            raise BadResponse("12 tokens sampled where max_tokens = 8 were asked")
        return await super().sample(prompt_ids, params)


def collector(*, streaming: bool = False) -> tuple[Collector, Breakable, list[Task]]:
    mdps = [SHAPES[s](i) for i, s in enumerate(["uniform", "critical", "long"])]
    policy = Breakable(mdps)
    agent = Agent(policy, SyntheticEnv(mdps), synthetic_format(), max_steps=20)
    ex = Execution(max_concurrency=4, max_outage_share=1.0, streaming=streaming)
    col = Collector(agent, Selective(phases=PHASES), SyntheticCritic(mdps, 0.1), DirectBranchTd(), ex, seed=3)
    return col, policy, [Task(f"t{i}", {"mdp": i}) for i in range(len(mdps))]


class BreakingJournal(MemoryJournal):
    """Breaks the policy once the evidence's scores are recorded."""

    def __init__(self, policy: Breakable) -> None:
        super().__init__()
        self.policy = policy

    async def record(self, step, value):  # type: ignore[no-untyped-def]
        await super().record(step, value)
        if step.kind == "evidence_scores":
            self.policy.broken = True


def rows(batch):  # type: ignore[no-untyped-def]
    return [(a.tree_id, a.edge_id, a.completion_ids, a.logprobs, a.advantage) for a in batch.actor]


def test_a_wave_stopped_by_bad_responses_is_replayed_from_the_journal_to_a_clean_runs_batch():
    clean, _, tasks = collector()
    want = clean.prepare(run(clean.search(tasks)))

    col, policy, _ = collector()
    journal = BreakingJournal(policy)
    with pytest.raises(BadResponses, match=r"^bad responses: \d+ of \d+ rollouts of phase continue wave ") as e:
        run(col.search(tasks, journal))
    phase, wave = e.value.wave
    assert phase == 1
    partial = journal.steps[unfinished_step(phase, wave)]
    stopped = [i for i, r in enumerate(partial.rollouts) if is_bad_response(r)]
    assert stopped and len(stopped) < len(partial.rollouts)  # the others are kept
    assert wave_step(phase, wave) not in journal.steps  # the wave is not recorded whole...
    assert not [s for s in journal.steps if s.phase == phase and s.wave > wave]  # ...nor anything after it

    # a rerun against a server still broken stops again and records nothing new
    steps = dict(journal.steps)
    with pytest.raises(BadResponses, match=rf"^bad responses: {len(stopped)} of {len(partial.rollouts)} rollouts"):
        run(col.search(tasks, journal))
    assert journal.steps == steps

    policy.broken = False  # fixed: the rerun runs the stopped rollouts and ends as a clean run
    got = col.prepare(run(col.search(tasks, journal)))
    assert rows(got) == rows(want) and got.stats["failed_rollouts"] == 0
    assert journal.steps[wave_step(phase, wave)].rollouts[stopped[0]] != partial.rollouts[stopped[0]]


def test_a_streamed_phase_stops_at_a_bad_response():
    col, policy, tasks = collector(streaming=True)
    state = run(col.run_evidence(tasks))
    policy.broken = True
    with pytest.raises(BadResponses, match=r"^bad responses: \d+ of \d+ rollouts of phase continue wave \d+"):
        run(col.stream_phase(state, 1))
