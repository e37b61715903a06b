"""A slime rollout function that collects with FOCUS and returns grouped Samples.

slime loads it with ``--rollout-function-path examples.train_slime.rollout.generate_rollout``
and calls ``generate_rollout(args, rollout_id, data_source, evaluation=False)``. For
training it returns ``RolloutFnTrainOutput(samples=list[list[Sample]])``: one group per
task tree, built token for token by ``focus.exporters.to_slime_samples`` (tokens,
response_length, loss_mask, rollout_log_probs, and the segment's FOCUS advantage as
``reward``). For evaluation it returns ``RolloutFnEvalOutput(data={...})`` with one
plain rollout per task.

The model is slime's SGLang router (``http://{sglang_router_ip}:{sglang_router_port}``,
native ``/generate``) unless ``args.focus_model_url`` names another server. Tasks come
from ``data_source.get_samples(args.rollout_batch_size)`` (each group's first Sample:
``prompt`` is the target, ``label`` unused), or from the toy task generator when
``data_source`` is None. Search budgets: ``args.n_samples_per_prompt`` evidence
rollouts per task, ``args.focus_transitions`` continuation transitions. A batch with
nothing to learn (every advantage 0) is collected again on the next tasks
(:func:`learnable_batch`).

Groups have as many samples as their tree has segments, not ``n_samples_per_prompt``:
run slime with ``--advantage-estimator grpo`` (or gspo, cispo) and
``--disable-rewards-normalization``, without ``--normalize-advantages``, so the reward
(already an advantage) is used as is; :func:`check_args` refuses other settings. Evaluation samples come from
:func:`eval_sample`. When slime is not installed (here) the output classes are
field-for-field stand-ins.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from focus.env import Task


@dataclass
class _TrainOutput:
    """Mirror of ``slime.rollout.base_types.RolloutFnTrainOutput``."""

    samples: list[list[Any]]
    metrics: dict[str, Any] | None = None


@dataclass
class _EvalOutput:
    """Mirror of ``slime.rollout.base_types.RolloutFnEvalOutput``."""

    data: dict[str, dict[str, Any]]
    metrics: dict[str, Any] | None = None


def output_classes() -> tuple[type, type]:
    try:
        from slime.rollout.base_types import RolloutFnEvalOutput, RolloutFnTrainOutput
    except ImportError:
        return _TrainOutput, _EvalOutput
    return RolloutFnTrainOutput, RolloutFnEvalOutput


def _run(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coro`` whether or not the caller already runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def model_url(args: Any) -> str:
    url = getattr(args, "focus_model_url", None)
    if url:
        return str(url)
    ip, port = getattr(args, "sglang_router_ip", None), getattr(args, "sglang_router_port", None)
    if not ip or not port:
        raise ValueError("no model server: set args.focus_model_url or slime's sglang_router_ip/sglang_router_port")
    return f"http://{ip}:{port}"


def draw_seed(args: Any, rollout_id: int, draw: int = 0) -> int:
    """The seed of a rollout's ``draw``-th collection (0: the first; later ones redraw a
    batch with nothing to learn, :func:`learnable_batch`)."""
    from focus.agent import derive_seed

    base = int(getattr(args, "seed", 0)) * 100_003 + rollout_id
    return base if draw == 0 else derive_seed("slime-redraw", base, draw)


def tasks_from(args: Any, rollout_id: int, data_source: Any, draw: int = 0) -> list[Task]:
    from focus.toy import reach_target_tasks

    n = int(args.rollout_batch_size)
    if data_source is None:
        return reach_target_tasks(n, seed=draw_seed(args, rollout_id, draw))
    tasks = []
    for i, group in enumerate(data_source.get_samples(n)):
        first = group[0]
        try:
            target = int(str(first.prompt).strip())
        except ValueError:
            raise ValueError(f"sample group {i}: prompt {first.prompt!r} is not a target number") from None
        tasks.append(Task(f"slime-{rollout_id}-{i}" + (f"-{draw}" if draw else ""), {"target": target}))
    return tasks


def make_agent(args: Any) -> Any:
    from focus.agent import Agent
    from focus.backends import SGLangPolicy
    from focus.format import ByteCodec
    from focus.policy import SamplingParams
    from focus.toy import ReachTarget, toy_format

    policy = SGLangPolicy(model_url(args), vocab_size=ByteCodec.vocab_size)
    sampling = SamplingParams(max_tokens=4, temperature=float(getattr(args, "rollout_temperature", 1.0)))
    return Agent(policy, ReachTarget(), toy_format(), max_steps=12, sampling=sampling)


async def _collect(args: Any, rollout_id: int, tasks: list[Task], draw: int = 0) -> Any:
    from focus.collector import Collector
    from focus.critic import ConstantCritic
    from focus.priority import Phase, Selective

    agent = make_agent(args)
    search = Selective(
        phases=(
            Phase("evidence", rollouts_per_task=int(getattr(args, "n_samples_per_prompt", 4))),
            Phase("continue", transitions=int(getattr(args, "focus_transitions", 32)), wave_size=16),
        )
    )
    collector = Collector(
        agent,
        search=search,
        critic=ConstantCritic(0.3),
        collection_id="slime",
        iteration=rollout_id,
        seed=draw_seed(args, rollout_id, draw),
    )
    try:
        return await collector.collect(tasks)
    finally:
        await agent.policy.aclose()


async def _evaluate(args: Any, tasks: list[Task]) -> list[Any]:
    from focus.agent import derive_seed

    agent = make_agent(args)
    try:
        starts = [await agent.start(t) for t in tasks]
        return list(
            await asyncio.gather(*(agent.rollout(s, derive_seed("slime-eval", i)) for i, s in enumerate(starts)))
        )
    finally:
        await agent.policy.aclose()


def eval_sample(cls: Any, index: int, rollout: Any) -> Any:
    """One slime ``Sample`` for an evaluation rollout, token for token.

    slime's eval logging computes response-length statistics over ``data[name]["samples"]``
    (an empty list makes them fail) and ``--save-debug-rollout-data`` reads that key. The
    sample is the rollout's last run of turns whose prompts extend each other (all of it
    unless a compaction rewrote the context), joined as ``to_slime_samples`` joins a segment.
    """
    from focus.exporters import slime_status

    turns = rollout.turns
    start = 0
    for k in range(1, len(turns)):
        head = turns[k - 1].prompt_ids + turns[k - 1].completion_ids
        if turns[k].prompt_ids[: len(head)] != head:
            start = k
    run = turns[start:]
    tokens, mask, logprobs = list(run[0].prompt_ids), [], []
    prompt_length = len(tokens)
    for t in run:
        obs = t.prompt_ids[len(tokens) :]
        tokens += [*obs, *t.completion_ids]
        mask += [0] * len(obs) + [t.loss_mask] * len(t.completion_ids)
        logprobs += [0.0] * len(obs) + list(t.logprobs)
    return cls(
        index=index,
        tokens=tokens,
        response_length=len(tokens) - prompt_length,
        reward=sum(t.reward for t in turns),
        loss_mask=mask,
        rollout_log_probs=logprobs,
        status=slime_status(cls, turns[-1].finish_reason),
        metadata={"task_id": rollout.task_id, "turns": len(turns)},
    )


#: slime advantage estimators that broadcast ``Sample.reward`` over the response as is.
REWARD_AS_ADVANTAGE = ("grpo", "gspo", "cispo")


def check_args(args: Any) -> None:
    """Refuse slime settings that would misread the rewards, which are FOCUS advantages."""
    if getattr(args, "rewards_normalization", False):
        raise ValueError(
            "slime would re-normalise the FOCUS advantages (by position, n_samples_per_prompt at a time, or over "
            "the whole batch): run slime with --disable-rewards-normalization"
        )
    if getattr(args, "normalize_advantages", False):
        raise ValueError(
            "slime's --normalize-advantages would whiten the FOCUS advantages over every response token of the "
            "batch (re-centred on the token-weighted mean: a segment's advantage can change sign): run slime "
            "without it"
        )
    estimator = getattr(args, "advantage_estimator", "grpo")
    if getattr(args, "custom_advantage_function_path", None) is None and estimator not in REWARD_AS_ADVANTAGE:
        raise ValueError(
            f"--advantage-estimator {estimator} does not use Sample.reward as the per-token advantage; "
            f"use one of {', '.join(REWARD_AS_ADVANTAGE)}"
        )


def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    """slime's custom rollout entry point (see the module docstring)."""
    from focus.exporters import slime_sample_class, to_slime_samples

    train_cls, eval_cls = output_classes()
    tasks = tasks_from(args, rollout_id, data_source)
    if evaluation:
        cls = slime_sample_class()
        samples = [eval_sample(cls, i, r) for i, r in enumerate(_run(_evaluate(args, tasks)))]
        rewards = [s.reward for s in samples]
        truncated = [s.status == cls.Status.TRUNCATED for s in samples]
        data = {"focus_toy": {"rewards": rewards, "truncated": truncated, "samples": samples}}
        return eval_cls(data=data, metrics={"focus_toy/success": sum(r > 0 for r in rewards) / len(rewards)})
    check_args(args)
    batch = learnable_batch(args, rollout_id, data_source, tasks)
    groups: dict[int, list[Any]] = {}
    for s in to_slime_samples(batch, reward="advantage"):
        groups.setdefault(s.group_index, []).append(s)
    metrics = {f"focus/{k}": v for k, v in batch.summary().items() if isinstance(v, int | float)}
    out = [groups[g] for g in sorted(groups)]
    metrics.update(step_metrics([s for g in out for s in g], getattr(args, "global_batch_size", None)))
    return train_cls(samples=out, metrics=metrics)


#: Further batches collected, each on the next tasks, after one with nothing to learn
#: (``args.focus_redraws`` where set).
REDRAWS = 4


def learnable_batch(args: Any, rollout_id: int, data_source: Any, tasks: list[Task]) -> Any:
    """The first batch, of ``tasks`` and then of newly drawn ones, that has something to
    learn (:func:`focus.exporters.nothing_to_learn`: not every advantage 0, each tree's
    rollouts alike in return). slime trains on whatever the function returns (it has no
    way to skip a step; an empty list fails it), and its Adam step on such a batch moves
    the weights by momentum alone; the local trainer takes no step on it. The next draw
    is what slime's dynamic sampling does (more prompts from the data source). After
    ``1 + REDRAWS`` such batches in a row the policy returns alike on every task drawn:
    :class:`~focus.exporters.NothingToTrain` says so."""
    from focus.exporters import NothingToTrain, actor_sequences, nothing_to_learn

    given = getattr(args, "focus_redraws", None)
    redraws = REDRAWS if given is None else int(given)
    for draw in range(1 + redraws):
        if draw:
            tasks = tasks_from(args, rollout_id, data_source, draw)
        batch = _run(_collect(args, rollout_id, tasks, draw))
        if not nothing_to_learn(actor_sequences(batch)):
            return batch
    raise NothingToTrain(
        f"rollout {rollout_id}: every advantage 0 in {1 + redraws} batches collected in a row (each tree's "
        "rollouts alike in return; nothing to learn): the policy returns alike on every task drawn; give it "
        "harder or easier tasks, or more rollouts per task (--n-samples-per-prompt, args.focus_transitions)"
    )


def step_metrics(samples: list[Any], global_batch_size: int | None) -> dict[str, int]:
    """How slime's trainer steps will cut these (flattened) samples.

    slime splits steps by ``rollout_id`` (``slime/utils/dp_schedule.py::build_dp_schedule``):
    ``global_batch_size`` rollouts a step, in order of first occurrence, and the rollouts
    after the last full step are dropped with all their samples. The samples of one FOCUS
    segment share a ``rollout_id``, so a step holds that many segments, not samples."""
    rollouts = list(dict.fromkeys(s.rollout_id for s in samples))
    out = {"focus/slime_samples": len(samples), "focus/slime_rollouts": len(rollouts)}
    if global_batch_size:
        dropped = set(rollouts[len(rollouts) - len(rollouts) % int(global_batch_size) :])
        out["focus/slime_samples_past_last_step"] = sum(s.rollout_id in dropped for s in samples)
    return out
