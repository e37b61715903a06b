"""Test doubles and conformance mixins shipped beside the interfaces.

The mixins hold the contract every implementation must keep. Inherit one in a pytest
class named ``Test...`` and provide the factory::

    class TestMyEnv(EnvConformance):
        def make_env(self): return MyEnv()
        def make_task(self): return Task("t0", {"prompt": "..."})
        def make_action(self): return Action("answer", text="42")
"""

from __future__ import annotations

import asyncio
import math
import pickle
from collections.abc import Sequence

from focus.env import Action, Env, EnvError, Task, accepts_seed, check_reset, check_step_result
from focus.format import ByteCodec, ChatCodec
from focus.policy import LOGPROB_SLACK, Completion, Policy, SamplingParams
from focus.workspace import Workspace


class ScriptedPolicy(Policy):
    """Answers with scripted texts in turn, encoded by ``codec``; log-prob -1 per token.

    A double for unit tests of one piece. It records every prompt it was sent. A text
    is encoded with ``codec.encode_text`` (``ByteCodec``'s and ``HFChatCodec``'s); a codec
    without one gets the text's UTF-8 bytes as ids, so give such a codec an
    ``encode_text`` unless its ids are bytes.
    """

    def __init__(self, responses: Sequence[str], codec: ChatCodec | None = None, *, end_turn: bool = True) -> None:
        if not responses:
            raise ValueError("ScriptedPolicy needs at least one response")
        self.responses = list(responses)
        self.codec = codec or ByteCodec()
        self.vocab_size = self.codec.vocab_size
        self.end_turn = end_turn
        self.prompts: list[tuple[int, ...]] = []

    async def sample(self, prompt_ids: Sequence[int], params: SamplingParams) -> Completion:
        self.check_prompt(prompt_ids)
        text = self.responses[len(self.prompts) % len(self.responses)]
        self.prompts.append(tuple(prompt_ids))
        encode = getattr(self.codec, "encode_text", None)
        data = list(encode(text)) if encode is not None else list(text.encode())
        stop = list(self.codec.stop_token_ids[:1]) if self.end_turn else []
        # as a model would: the stop id is a sampled token, inside max_tokens like the rest
        if len(data) + len(stop) <= params.max_tokens:
            ids, finish = data + stop, "stop"
        else:
            ids, finish = data[: params.max_tokens], "length"
        return Completion(tuple(ids), tuple(-1.0 for _ in ids), finish)


def run(coro):  # type: ignore[no-untyped-def]
    """Run a coroutine from a synchronous test."""
    return asyncio.run(coro)


class EnvConformance:
    """Contract of :class:`focus.env.Env`."""

    def make_env(self) -> Env:
        raise NotImplementedError

    def make_task(self) -> Task:
        raise NotImplementedError

    def make_action(self) -> Action:
        raise NotImplementedError

    def test_reset_returns_messages_and_picklable_state(self) -> None:
        env, task = self.make_env(), self.make_task()
        try:  # the agent's own check, opening messages' text and ids too
            reset = check_reset(run(env.reset(task, env.make_workspace(task))), f"{type(env).__name__}.reset")
        except EnvError as e:
            raise AssertionError(str(e)) from None
        assert pickle.loads(pickle.dumps(reset.state)) == reset.state, (
            "reset's state is not equal after a pickle round trip"
        )

    def test_step_returns_step_result(self) -> None:
        env, task = self.make_env(), self.make_task()
        ws = env.make_workspace(task)
        reset = run(env.reset(task, ws))
        result = run(env.step(reset.state, self.make_action(), ws))
        # the agent's own check: what it refuses fails here, what it accepts (a numpy
        # bool for done, a numpy reward) passes
        try:
            result = check_step_result(result, f"{type(env).__name__}.step")
        except EnvError as e:
            raise AssertionError(str(e)) from None
        pickle.dumps(result.state)

    def test_step_does_not_mutate_the_old_state(self) -> None:
        env, task = self.make_env(), self.make_task()
        ws = env.make_workspace(task)
        reset = run(env.reset(task, ws))
        before = pickle.dumps(reset.state)
        run(env.step(reset.state, self.make_action(), ws))
        assert pickle.dumps(reset.state) == before, (
            "step changed the state it was given: return a new state (sibling branches hold the old one)"
        )

    def test_step_with_a_seed_is_reproducible(self) -> None:
        """An env whose ``step`` takes a ``seed`` (:class:`focus.env.Env`, "Randomness")
        draws from it alone: the same state, action and seed give the same result."""
        env, task = self.make_env(), self.make_task()
        if not accepts_seed(env):
            return
        results = []
        for _ in range(2):
            ws = env.make_workspace(task)
            reset = run(env.reset(task, ws))
            step = env.step  # the keyword is an optional extension of the signature
            r = run(step(reset.state, self.make_action(), ws, seed=1234))  # type: ignore[call-arg]
            results.append((pickle.dumps(r.state), r.observation, float(r.reward), r.done))
        assert results[0] == results[1], "the same state, action and seed gave two results: draw from the seed alone"

    def test_env_pickles(self) -> None:
        """Envs travel to workers with cloudpickle (lambdas and closures allowed)."""
        import cloudpickle

        cloudpickle.loads(cloudpickle.dumps(self.make_env()))


class WorkspaceConformance:
    """Contract of :class:`focus.workspace.Workspace`."""

    def make_workspace(self) -> Workspace:
        raise NotImplementedError

    def test_write_read_list_delete(self) -> None:
        ws = self.make_workspace()
        ws.write("a/b.txt", b"one")
        ws.write_text("c.txt", "two")
        assert ws.read("a/b.txt") == b"one" and ws.read_text("c.txt") == "two"
        assert ws.list() == ["a/b.txt", "c.txt"]
        ws.delete("c.txt")
        assert ws.list() == ["a/b.txt"] and not ws.exists("c.txt")

    def test_missing_file_raises_file_not_found(self) -> None:
        ws = self.make_workspace()
        try:
            ws.read("nope")
        except FileNotFoundError:
            return
        raise AssertionError("reading a missing file must raise FileNotFoundError")

    def test_path_escape_is_rejected(self) -> None:
        from focus.workspace import WorkspaceError

        ws = self.make_workspace()
        try:
            ws.write("../x", b"1")
        except WorkspaceError:
            return
        raise AssertionError("a path leaving the workspace must be rejected")

    def test_fork_is_independent(self) -> None:
        ws = self.make_workspace()
        ws.write("f", b"base")
        a, b = ws.fork(), ws.fork()
        a.write("f", b"a")
        b.write("g", b"b")
        shared = "fork() must copy the files, not share them"
        assert ws.read("f") == b"base" and ws.list() == ["f"], f"writes to a fork showed in its parent: {shared}"
        assert a.read("f") == b"a" and a.list() == ["f"], f"a fork sees another fork's writes: {shared}"
        assert b.read("f") == b"base" and b.list() == ["f", "g"], f"a fork sees another fork's writes: {shared}"
        # the other way: the agent forks a checkpoint's copy and keeps writing to the
        # live branch's workspace, which the copy must not see
        ws.write("f", b"later")
        ws.write("h", b"later")
        assert b.read("f") == b"base" and b.list() == ["f", "g"], "a fork sees its parent's later writes"

    def test_pickle_round_trip_keeps_contents_and_independence(self) -> None:
        ws = self.make_workspace()
        ws.write("d/x.bin", bytes(range(256)))
        restored = pickle.loads(pickle.dumps(ws))
        assert restored.snapshot() == ws.snapshot()
        restored.write("d/x.bin", b"changed")
        assert ws.read("d/x.bin") == bytes(range(256))


class PolicyConformance:
    """Contract of :class:`focus.policy.Policy`: ids and log-probs aligned, seeds honoured."""

    def make_policy(self) -> Policy:
        raise NotImplementedError

    def make_prompt(self) -> list[int]:
        return ByteCodec().render([])

    def test_sample_returns_aligned_finite_logprobs(self) -> None:
        async def go() -> Completion:
            p = self.make_policy()
            try:
                return await p.sample(self.make_prompt(), SamplingParams(max_tokens=8, seed=1))
            finally:
                await p.aclose()

        c = run(go())
        assert isinstance(c, Completion), f"sample returned {type(c).__name__}, expected a Completion"
        assert 0 < len(c.token_ids) <= 8, f"{len(c.token_ids)} tokens sampled where max_tokens = 8 was asked"
        assert len(c.logprobs) == len(c.token_ids), f"{len(c.token_ids)} tokens but {len(c.logprobs)} log-probs"
        assert all(math.isfinite(x) and x <= LOGPROB_SLACK for x in c.logprobs), (
            f"log-probs not all finite and <= 0: {c.logprobs}"
        )
        assert c.finish_reason in ("stop", "length"), f"finish reason {c.finish_reason!r}, expected stop or length"

    def test_max_tokens_is_respected(self) -> None:
        async def go() -> Completion:
            p = self.make_policy()
            try:
                return await p.sample(self.make_prompt(), SamplingParams(max_tokens=3, seed=2))
            finally:
                await p.aclose()

        n = len(run(go()).token_ids)
        assert n <= 3, f"{n} tokens sampled where max_tokens = 3 was asked"

    def test_siblings_are_the_samples_of_their_seeds(self) -> None:
        """``sample_siblings`` gives sample ``i`` as ``sample`` with ``seed + i`` gives it
        (vLLM's rule for a request with ``n`` samples), however the policy sends them."""

        async def go() -> tuple[list[Completion], list[Completion]]:
            p = self.make_policy()
            params = SamplingParams(max_tokens=4, seed=30)
            try:
                together = await p.sample_siblings(self.make_prompt(), params, [("t", 0), ("t", 1), ("t", 2)])
                alone = [await p.sample(self.make_prompt(), params.with_seed(30 + i)) for i in range(3)]
                return together, alone
            finally:
                await p.aclose()

        together, alone = run(go())
        assert [(c.token_ids, c.finish_reason) for c in together] == [(c.token_ids, c.finish_reason) for c in alone], (
            "sample_siblings' sample i differs from sample with seed + i"
        )
