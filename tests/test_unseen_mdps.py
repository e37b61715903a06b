"""MDPs unlike the project's families, driven through the public API with its defaults.

A counter env written here (not :mod:`focus.synthetic`): the state is (step, position),
each action adds its index to the position, and the reward is whatever the test's
function says; the policy reads the state from the prompt ids and picks uniformly by
the request's seed. The edge cases a user's env and critic bring: bad rewards, every
rollout truncated, a trainable critic warm-started on such evidence.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import random
from collections.abc import Callable, Sequence

from focus import Agent, Collector, ConstantCritic, DirectBranchTd, Execution, LocalCritic, SamplingParams, Task
from focus.env import Action, Env, Message, Reset, StepResult
from focus.format import ActionParser, ByteCodec, ParseError, PolicyFormat
from focus.policy import Completion, Policy

Reward = Callable[[str, int, int, int], object]  # (task id, step, position, action) -> reward


def _state(ids: Sequence[int]) -> tuple[int, int]:
    text = bytes(i for i in ids if i < 256).decode()
    step, pos = text[text.rfind("s=") + 2 :].split("|")[0].split(",")
    return int(step), int(pos)


class Counter(Env):
    """Position += action (0 or 1) for ``horizon`` steps; ``reward(task, step, pos, action)``."""

    def __init__(self, reward: Reward, horizon: int) -> None:
        self.reward, self.horizon = reward, horizon

    async def reset(self, task: Task, workspace: object) -> Reset:
        return Reset((task.id, 0, 0), (Message("user", f"{task.id} s=0,0|"),))

    async def step(self, state: tuple[str, int, int], action: Action, workspace: object) -> StepResult:
        task, t, x = state
        a = int(action.text)
        return StepResult(
            (task, t + 1, x + a), f"s={t + 1},{x + a}|", self.reward(task, t, x, a), t + 1 >= self.horizon
        )


class Digit(ActionParser):
    def parse(self, text: str) -> Action | ParseError:
        return Action("text", text=text.strip()) if text.strip().isdigit() else ParseError("a digit")


class Coin(Policy):
    vocab_size = ByteCodec.vocab_size

    async def sample(self, prompt_ids: Sequence[int], params) -> Completion:  # type: ignore[no-untyped-def]
        _state(prompt_ids)  # the prompt names a state
        a = random.Random(params.seed).randrange(2)
        return Completion((48 + a, ByteCodec.EOT), (math.log(0.5), 0.0), "stop")


def collector(reward: Reward, horizon: int, critic, *, max_steps: int, tasks: int = 2) -> tuple[Collector, list[Task]]:  # type: ignore[no-untyped-def]
    agent = Agent(
        Coin(),
        Counter(reward, horizon),
        PolicyFormat(ByteCodec(), Digit()),
        max_steps=max_steps,
        sampling=SamplingParams(max_tokens=4),
    )
    col = Collector(agent, critic=critic, estimator=DirectBranchTd(), execution=Execution(max_concurrency=8))
    return col, [Task(f"t{i}") for i in range(tasks)]


def test_a_bad_reward_is_one_line_naming_the_task_the_step_and_the_value(caplog) -> None:  # type: ignore[no-untyped-def]
    """A NaN reward at step 2 of task t1 fails those rollouts and keeps their finished
    segments; before, the wave's warning named the value (``returned the reward nan``)
    but neither the task nor the step, and ``failure_causes`` counts one cause for all."""

    def reward(task: str, t: int, x: int, a: int) -> float:
        return math.nan if task == "t1" and t == 2 else float(a)

    col, tasks = collector(reward, 4, ConstantCritic(0.5), max_steps=6)
    with caplog.at_level(logging.WARNING, logger="focus.collector"):
        batch = asyncio.run(col.collect(tasks))
    lines = [r.getMessage() for r in caplog.records if "rollouts failed" in r.getMessage()]
    assert lines and all(
        "last cause (task 't1', step 2): env: Counter.step returned the reward nan" in line for line in lines
    ), lines
    assert batch.stats["failed_env"] > 0
    # the failed rollouts' first two steps are segments between checkpoints: kept and trained
    assert {r.node_id for r in batch.actor if r.task_id == "t1"} and all(
        math.isfinite(r.advantage) for r in batch.actor
    )


def test_a_trainable_critic_is_warm_started_on_evidence_that_every_rollout_truncates() -> None:
    """Rewards of -1 a step for 8 steps, 3 seen (``max_steps``): every rollout truncates.
    The warm start's targets left every truncated leaf out (unscored), so there were
    none: the critic stayed unfitted at 0 and the batch's targets were the 3 steps'
    rewards alone (-3 at the root, where every return is -8). Valued by the critic as it
    was, the leaves give it targets; fitted on them, it predicts the steps it saw, and
    the batch bootstraps on that."""
    critic = LocalCritic()
    col, tasks = collector(lambda task, t, x, a: -1.0, 8, critic, max_steps=3)
    batch = asyncio.run(col.collect(tasks))
    assert batch.stats["truncated_rollouts"] == batch.stats["rollouts"] > 0
    assert critic.fitted
    roots = [c for c in batch.critic if c.node_id == 0]
    assert roots and all(c.prediction is not None and c.prediction < -2.5 for c in roots), roots
    assert all(c.target < -3.25 for c in roots), roots  # the 3 rewards and a bootstrap below 0


def test_a_scoring_service_s_nan_is_refused_at_once_naming_the_state() -> None:
    """A service answering NaN (JSON allows it) for the states at step 2 of task t1. It
    was retried as a malformed answer, 11 attempts over 9-14 s, and the collection
    stopped naming the position in one HTTP request ('at position 15'), not the state.
    A direct ``predict`` still refuses it, at once."""
    import httpx
    import pytest

    from focus import HttpCritic
    from focus.critic import CriticError

    sent: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        contexts = json.loads(request.content)
        sent.append(len(contexts))
        values = []
        for c in contexts:
            text = bytes(i for i in c if i < 256).decode()
            values.append(math.nan if text.startswith("t1") and _state(c)[0] == 2 else 0.5)
        return httpx.Response(200, content=json.dumps(values).encode())  # json writes NaN

    critic = HttpCritic("http://critic.invalid/score", transport=httpx.MockTransport(handler))
    col, tasks = collector(lambda task, t, x, a: float(a), 4, critic, max_steps=6)
    with pytest.raises(
        CriticError,
        match=r"^critic HttpCritic returned a non-finite value nan at position \d+ "
        r"\(checkpoint node \d+ at depth 2 of tree t1#1\)(\n|$)",  # a note may follow
    ):
        asyncio.run(col.collect(tasks))
    assert critic.stats()["retries"] == {}
    calls = len(sent)
    with pytest.raises(
        CriticError, match=r"^critic at http://critic.invalid/score returned a non-finite value nan at position 1$"
    ):
        asyncio.run(critic.predict([list(b"t0 s=0,0|"), list(b"t1 s=2,0|")]))
    assert len(sent) == calls + 1


def test_a_scoring_service_s_null_or_short_answer_is_refused_at_once() -> None:
    """A service answering null for the states at step 2 of task t1 (JavaScript's
    ``JSON.stringify`` writes a NaN so), or one value too few for a request: both were
    retried as malformed answers, 11 attempts over 9-14 s, and the null named a position
    in one HTTP request. Now the null stops the collection at once naming the state, and
    the short answer stops it at once naming the counts."""
    import httpx
    import pytest

    from focus import HttpCritic
    from focus.critic import CriticError

    def handler(request: httpx.Request) -> httpx.Response:
        contexts = json.loads(request.content)
        values: list[float | None] = []
        for c in contexts:
            text = bytes(i for i in c if i < 256).decode()
            values.append(None if text.startswith("t1") and _state(c)[0] == 2 else 0.5)
        return httpx.Response(200, content=json.dumps(values).encode())

    critic = HttpCritic("http://critic.invalid/score", transport=httpx.MockTransport(handler))
    col, tasks = collector(lambda task, t, x, a: float(a), 4, critic, max_steps=6)
    with pytest.raises(
        CriticError,
        match=r"^critic HttpCritic returned a non-numeric value None at position \d+ "
        r"\(checkpoint node \d+ at depth 2 of tree t1#1\)(\n|$)",  # a note may follow
    ):
        asyncio.run(col.collect(tasks))
    assert critic.stats()["retries"] == {}
    with pytest.raises(
        CriticError, match=r"^critic at http://critic.invalid/score returned a non-numeric value None at position 1$"
    ):
        asyncio.run(critic.predict([list(b"t0 s=0,0|"), list(b"t1 s=2,0|")]))

    def short(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"values": [0.5] * (len(json.loads(request.content)) - 1), "stds": None})

    critic = HttpCritic("http://critic.invalid/score", transport=httpx.MockTransport(short))
    col, tasks = collector(lambda task, t, x, a: float(a), 4, critic, max_steps=6)
    with pytest.raises(
        CriticError, match=r"^critic at http://critic.invalid/score returned \d+ values for \d+ contexts(\n|$)"
    ):
        asyncio.run(col.collect(tasks))
    assert critic.stats()["retries"] == {}


def test_an_env_that_fails_every_fresh_episode_alike_stops_unfinished_and_a_rerun_collects() -> None:
    """Every task's step 2 raises the same error (its index aside). The collection spent
    its whole budget on 30 waves of continuations failing at that step, one warning a
    wave, and finished with truncated segments under a spent id. Now the evidence wave
    raises :class:`BrokenEnv`, keeps nothing, and the same journal collects once the env
    is fixed: the batch of a clean run."""
    import pytest

    from focus import BrokenEnv
    from focus.journal import MemoryJournal

    fixed = False

    def reward(task: str, t: int, x: int, a: int) -> float:
        if t == 2 and not fixed:
            raise ValueError(f"bad index {x} in table of {task}")
        return float(a)

    col, tasks = collector(reward, 5, ConstantCritic(0.5), max_steps=8, tasks=4)
    journal = MemoryJournal()
    with pytest.raises(
        BrokenEnv,
        match=r"^the env failed every fresh episode of the wave the same way \(\d+ of \d+ rollouts from the root, "
        r"4 tasks\): .* last \(task 't\d', step 2\): ValueError: bad index \d+ in table of t\d$",
    ):
        asyncio.run(col.search(tasks, journal))
    assert journal.steps == {}  # the evidence wave kept nothing
    fixed = True
    after = col.prepare(asyncio.run(col.search(tasks, journal)))
    clean_col, _ = collector(reward, 5, ConstantCritic(0.5), max_steps=8, tasks=4)
    clean = asyncio.run(clean_col.collect(tasks))
    assert after.stats["failed_env"] == 0 and [r.advantage for r in after.actor] == [r.advantage for r in clean.actor]


def test_an_env_that_fails_at_some_states_or_one_task_goes_on() -> None:
    """Failing alike at one state every continuation of a wave leads to is the env's
    rule for that state, not a broken env; nor is every rollout of one task failing."""
    col, tasks = collector(
        lambda task, t, x, a: 1 / 0 if (t == 3 and x == 3) or task == "t0" else float(a),
        5,
        ConstantCritic(0.5),
        max_steps=8,
        tasks=3,
    )
    batch = asyncio.run(col.collect(tasks))
    assert batch.stats["failed_env"] > 0 and batch.actor


def test_a_collection_without_a_journal_says_what_an_error_lost_and_how_to_keep_it() -> None:
    """A critic that fails after the evidence's scores stops the collection. Without a
    journal ``collect`` lost the steps it had finished and nothing said so; ``collect``
    took no journal at all (``search`` did). Now the error's note counts the lost steps
    and says to pass a journal; given one, a call again after the critic is mended
    continues after its last recorded step and ends with a clean run's batch."""
    import pytest

    from focus.critic import CriticError, Prediction
    from focus.journal import MemoryJournal

    class Flaky(ConstantCritic):
        row_wise = False  # one call per scoring step

        def __init__(self) -> None:
            super().__init__(0.5)
            self.calls, self.broken = 0, True

        async def predict_with_std(self, contexts: Sequence[Sequence[int]]) -> list[Prediction]:
            self.calls += 1
            if self.broken and self.calls > 1:
                raise CriticError("the scoring service is down")
            return await super().predict_with_std(contexts)

    clean = asyncio.run(
        collector(lambda task, t, x, a: float(a), 4, ConstantCritic(0.5), max_steps=6)[0].collect(
            [Task("t0"), Task("t1")]
        )
    )
    col, tasks = collector(lambda task, t, x, a: float(a), 4, Flaky(), max_steps=6)
    with pytest.raises(CriticError) as lost:
        asyncio.run(col.collect(tasks))
    (note,) = lost.value.__notes__
    assert note.startswith("Lost with this error: 3 finished steps of this collection"), note
    assert "focus.journal.MemoryJournal()" in note and "collector.collect(tasks, journal)" in note, note

    col, tasks = collector(lambda task, t, x, a: float(a), 4, Flaky(), max_steps=6)
    journal = MemoryJournal()
    with pytest.raises(CriticError) as stopped:
        asyncio.run(col.collect(tasks, journal))
    assert not getattr(stopped.value, "__notes__", None)  # kept: nothing to say
    recorded = set(journal.steps)
    col.critic.broken = False  # type: ignore[attr-defined]
    batch = asyncio.run(col.collect(tasks, journal))
    assert recorded < set(journal.steps)
    assert batch.actor_table.equals(clean.actor_table) and batch.critic_table.equals(clean.critic_table)
