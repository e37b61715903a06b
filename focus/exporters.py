"""Training records for external trainers, built token for token from a batch.

Both exporters start from the same pure step, :func:`actor_sequences`: the actor rows
of one segment (edge) are joined into one token sequence when each turn's prompt
extends the previous prompt plus its completion (the ``Segments`` and ``AppendOnly``
contexts guarantee this), so a multi-turn segment becomes one training sequence in
which the tool observations between turns carry mask 0. Turns are never joined across
segments: sibling branches share their parent's tokens, and joining would train on
those tokens once per branch. Nothing is re-tokenised: every id comes from the rows.

- :func:`to_tinker_datums` builds ``tinker.Datum`` with the tinker-cookbook RL
  convention (``tinker_cookbook/rl/data_processing.py``): ``model_input = tokens[:-1]``,
  and ``target_tokens``, ``logprobs`` and ``advantages`` aligned with ``tokens[1:]``:
  exactly the inputs of Tinker's built-in RL losses (``importance_sampling``, ``ppo``,
  ``cispo``; ``loss_fn="gspo"`` adds ``sequence_ratio_mask``, the trained tokens), so the
  datums go straight into ``forward_backward``. Losses a batch cannot feed
  (``stable_reinforce``, which needs sampling-time ``sequence_id``s) are refused, naming why. The service answers
  400 "Could not convert loss function inputs to array record" to a datum that also
  carries ``mask`` (the cookbook strips it, ``rl/train.py::_remove_mask``, before every
  ``forward_backward``); ``include_mask=True`` adds it, aligned the same way, for the
  cookbook's helpers that read it (``rl/metrics.py``), which must drop it before sending.
- :func:`to_slime_samples` builds slime ``Sample`` objects (``tokens`` = prompt +
  response, ``response_length``, ``loss_mask`` and ``rollout_log_probs`` over the
  response; slime's own multi-turn convention, ``Sample.append_response_tokens``: tool
  tokens in the response get mask 0 and log-prob 0.0). ``reward`` is already an
  advantage, and slime broadcasts it over the response (``grpo``/``gspo``/``cispo``), so
  slime must not re-normalise it (``--disable-rewards-normalization``): its normalisation
  groups rewards by position, ``n_samples_per_prompt`` at a time, or the whole batch
  when the count differs, never by ``group_index``. Every sample of one tree gets the
  same ``group_index`` (slime reads it for per-group metrics only). The samples of one
  segment share a ``rollout_id`` (the segment's number in the batch): slime's loss takes
  one token-mean per ``rollout_id``, and a segment split into several samples (a
  compaction, or ``merge_turns=False``) is one rollout, not one per piece. slime is not
  installable here; when it is not importable a field-for-field mirror,
  :class:`SlimeSample`, is used.
- :func:`to_verl_batch` builds the padded arrays of a verl ``DataProto`` (prompts left-,
  responses right-padded; per-token arrays aligned with ``responses``), with what verl's
  actor and its metric helpers read (scores, rewards, returns, ``global_token_num``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, Literal

from focus.batch import ActorRow, Batch
from focus.sums import left_sum

if TYPE_CHECKING:
    import tinker


#: The largest float32 (``numpy.finfo(numpy.float32).max``). Rewards and advantages are
#: float64 up to ``focus.env.VALUE_LIMIT`` (1e60), but every trainer's arrays are float32
#: (or narrower): an advantage beyond this becomes ``inf`` there.
FLOAT32_MAX = 3.4028234663852886e38


@dataclass(frozen=True)
class TokenSequence:
    """One training sequence: consecutive turns of one segment, aligned per token.

    ``tokens`` is the first turn's prompt followed by every completion and the
    observation ids between them. ``logprobs``, ``advantages`` and ``mask`` have one
    entry per token: the behaviour log-prob, the row's advantage and the loss mask for
    completion tokens; 0 for prompt and observation tokens. ``prompt_length`` is the
    length of the first turn's prompt (everything after it is the "response").
    """

    rows: tuple[ActorRow, ...]
    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    advantages: tuple[float, ...]
    mask: tuple[int, ...]
    prompt_length: int

    @property
    def advantage(self) -> float:
        return self.rows[0].advantage

    @property
    def reward(self) -> float:
        return left_sum(r.reward for r in self.rows)


def _extends(prev: ActorRow, nxt: ActorRow) -> bool:
    head = prev.prompt_ids + prev.completion_ids
    return len(nxt.prompt_ids) >= len(head) and nxt.prompt_ids[: len(head)] == head


def _sequence(rows: list[ActorRow]) -> TokenSequence:
    first = rows[0]
    tokens: list[int] = list(first.prompt_ids)
    lps: list[float] = [0.0] * len(tokens)
    advs: list[float] = [0.0] * len(tokens)
    mask: list[int] = [0] * len(tokens)
    for r in rows:
        obs = r.prompt_ids[len(tokens) :]  # the observation ids appended since the last turn
        tokens += obs
        lps += [0.0] * len(obs)
        advs += [0.0] * len(obs)
        mask += [0] * len(obs)
        tokens += r.completion_ids
        lps += r.logprobs
        advs += [r.advantage if m else 0.0 for m in r.loss_mask]
        mask += r.loss_mask
    return TokenSequence(tuple(rows), tuple(tokens), tuple(lps), tuple(advs), tuple(mask), len(first.prompt_ids))


def actor_sequences(batch: Batch, *, merge_turns: bool = True, skip_unmasked: bool = True) -> list[TokenSequence]:
    """The batch's actor rows as training sequences, in the batch's order of segments.

    With ``merge_turns`` the turns of one segment are joined while each prompt extends
    the previous turn and the advantage stays the same; otherwise each turn is its own
    sequence. With ``skip_unmasked`` sequences without a single trained token (e.g. a
    lone compaction turn) are left out, since they carry no gradient. A row without
    prompt ids, with log-probs or a mask of another length than its completion, or with
    an advantage that is NaN or beyond float32 (:data:`FLOAT32_MAX`, where every
    trainer computes) is a ``ValueError`` naming it.
    """
    segments: dict[tuple[str, str, int], list[ActorRow]] = {}
    for r in batch.actor:
        if not r.prompt_ids:  # the first completion token would have no input to be predicted from
            raise ValueError(f"actor row (task {r.task_id!r}, edge {r.edge_id}, turn {r.turn_index}) has no prompt ids")
        if len(r.logprobs) != len(r.completion_ids) or len(r.loss_mask) != len(r.completion_ids):
            raise ValueError(
                f"actor row (task {r.task_id!r}, edge {r.edge_id}, turn {r.turn_index}) has "
                f"{len(r.completion_ids)} ids, {len(r.logprobs)} log-probs and {len(r.loss_mask)} mask entries"
            )
        if not abs(r.advantage) <= FLOAT32_MAX:  # NaN too
            why = (
                "not a number"
                if math.isnan(r.advantage)
                else f"beyond float32 (±{FLOAT32_MAX:.4g}), which trainers compute in: it would train as inf; "
                "scale the rewards down"
            )
            raise ValueError(
                f"actor row (task {r.task_id!r}, edge {r.edge_id}, turn {r.turn_index}) has the advantage "
                f"{r.advantage!r}, {why}"
            )
        segments.setdefault((r.task_id, r.tree_id, r.edge_id), []).append(r)
    out: list[TokenSequence] = []
    for rows in segments.values():
        rows = sorted(rows, key=lambda r: r.turn_index)
        run: list[ActorRow] = []
        for r in rows:
            if run and not (merge_turns and _extends(run[-1], r) and r.advantage == run[-1].advantage):
                out.append(_sequence(run))
                run = []
            run.append(r)
        if run:
            out.append(_sequence(run))
    return [s for s in out if any(s.mask)] if skip_unmasked else out


class NothingToTrain(ValueError):
    """A batch without one trained token (no actor rows, or only rows with loss mask 0):
    no trainer step can be made from it."""


def trainable_sequences(batch: Batch, *, merge_turns: bool, skip_unmasked: bool) -> list[TokenSequence]:
    """:func:`actor_sequences`, or :class:`NothingToTrain` naming why there are none.

    Every exporter builds one trainer step, and a step of nothing is an error the
    trainer meets later and less clearly (verl's padding of zero rows, Tinker's
    ``forward_backward`` of no datums, slime's empty rollout): the Tinker and slime
    exporters returned ``[]`` where verl's raised, so one trainer saw a batch of every
    rollout failed as nothing to do and another as an error."""
    seqs = actor_sequences(batch, merge_turns=merge_turns, skip_unmasked=skip_unmasked)
    if not seqs:
        n = len(batch.actor)
        why = "no actor rows" if not n else f"{n} actor row(s), none with a trained token (loss mask all 0)"
        raise NothingToTrain(
            f"batch {batch.collection_id!r} iteration {batch.iteration} has {why}: nothing to train on "
            "(its statistics say why: failed_rollouts, failure_causes)"
        )
    return seqs


# --- Tinker ----------------------------------------------------------------------------------


#: The ``loss_fn_inputs`` of each built-in Tinker loss a FOCUS batch feeds (Tinker's docs,
#: tinker-docs.thinkingmachines.ai ``losses/`` and ``losses/gspo/``). GSPO's sequence ratio is
#: the mean log-ratio over the positions ``sequence_ratio_mask`` marks: the trained tokens,
#: since prompt and observation tokens carry log-prob 0 (they were never sampled).
TINKER_LOSS_INPUTS: dict[str, tuple[str, ...]] = {
    "importance_sampling": ("target_tokens", "logprobs", "advantages"),
    "ppo": ("target_tokens", "logprobs", "advantages"),
    "cispo": ("target_tokens", "logprobs", "advantages"),
    "gspo": ("target_tokens", "logprobs", "advantages", "sequence_ratio_mask"),
}

#: Tinker's other losses (``tinker.types.LossFnType``), and why a batch cannot feed them.
TINKER_REFUSED: dict[str, str] = {
    "stable_reinforce": "it needs each token's sampling sequence_id (datum provenance, recorded by a sampling "
    "client made with record_stability_info=True and kept by the service for a day), which a FOCUS batch "
    "does not hold",
    "cross_entropy": "it is the supervised loss (target_tokens and weights), not an RL loss of advantages",
    "dro": "its inputs have not been checked against a FOCUS batch (Tinker's loss pages do not give them): "
    "refused rather than guessed",
    "custom": "it is the loss of forward_backward_custom: pass your function there with the datums of any other loss",
}


def tinker_datum(
    seq: TokenSequence, *, include_mask: bool = False, loss_fn: str = "importance_sampling"
) -> tinker.Datum:
    """A ``tinker.Datum`` for one sequence, shifted as the tinker cookbook does.

    Without ``include_mask`` it carries exactly the inputs of ``loss_fn``
    (:data:`TINKER_LOSS_INPUTS`); the service rejects a datum with an extra ``mask``
    (see the module docstring).
    """
    import numpy as np
    import tinker

    if len(seq.tokens) < 2:
        raise ValueError(f"a sequence of {len(seq.tokens)} token(s) has nothing to predict")
    mask = np.asarray(seq.mask[1:], dtype=np.float32)  # 1 on trained tokens, never on unsampled ones
    arrays: dict[str, np.ndarray] = {
        "target_tokens": np.asarray(seq.tokens[1:], dtype=np.int64),
        "logprobs": np.asarray(seq.logprobs[1:], dtype=np.float32),
        "advantages": np.asarray(seq.advantages[1:], dtype=np.float32),
        "sequence_ratio_mask": mask,
        "mask": mask,
    }
    keys = [*tinker_loss_inputs(loss_fn), *(["mask"] if include_mask else [])]
    inputs = {k: tinker.TensorData.from_numpy(arrays[k]) for k in keys}
    return tinker.Datum(model_input=tinker.ModelInput.from_ints(list(seq.tokens[:-1])), loss_fn_inputs=inputs)


def tinker_loss_inputs(loss_fn: str) -> tuple[str, ...]:
    """The ``loss_fn_inputs`` keys a datum for Tinker's ``loss_fn`` carries, or a
    ``ValueError`` naming why a FOCUS batch cannot feed that loss."""
    if loss_fn in TINKER_LOSS_INPUTS:
        return TINKER_LOSS_INPUTS[loss_fn]
    if loss_fn in TINKER_REFUSED:
        raise ValueError(f"Tinker loss {loss_fn!r} cannot be fed from a FOCUS batch: {TINKER_REFUSED[loss_fn]}")
    raise ValueError(f"unknown Tinker loss {loss_fn!r}; the datums are built for {', '.join(TINKER_LOSS_INPUTS)}")


def to_tinker_datums(
    batch: Batch,
    *,
    loss_fn: str = "importance_sampling",
    merge_turns: bool = True,
    include_mask: bool = False,
    skip_unmasked: bool = True,
) -> list[tinker.Datum]:
    """One ``tinker.Datum`` per sequence of :func:`actor_sequences` (same order), with
    the inputs of ``loss_fn`` (:func:`tinker_loss_inputs`); :class:`NothingToTrain` for
    a batch without a trained token."""
    tinker_loss_inputs(loss_fn)  # a loss the batch cannot feed is refused before any work
    seqs = trainable_sequences(batch, merge_turns=merge_turns, skip_unmasked=skip_unmasked)
    return [tinker_datum(s, include_mask=include_mask, loss_fn=loss_fn) for s in seqs]


# --- slime -----------------------------------------------------------------------------------


@dataclass
class SlimeSample:
    """Field-for-field mirror of ``slime.utils.types.Sample`` (THUDM/slime, commit
    624b824a898ab0ec1fcb4d373004c7f3852bf515), used only when slime is not importable.
    Field names, order and defaults follow slime's dataclass (its torch tensor variants
    are left out of the annotations); its helper methods that need slime's runtime are
    left out.
    """

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    @dataclass
    class SpecInfo:
        spec_accept_token_num: int = 0
        spec_draft_token_num: int = 0
        spec_verify_ct: int = 0
        completion_token_num: int = 0

    @dataclass
    class PrefixCacheInfo:
        cached_tokens: int = 0
        total_prompt_tokens: int = 0

    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
    prompt: str | list[dict[str, str]] = ""
    tokens: list[int] = field(default_factory=list)
    multimodal_inputs: dict[str, Any] | None = None
    multimodal_train_inputs: dict[str, Any] | None = None
    multimodal_train_input_id: str | None = None
    apply_chat_template_kwargs: dict = field(default_factory=dict)
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    rollout_top_p_token_ids: list[int] | None = None
    rollout_top_p_token_offsets: list[int] | None = None
    rollout_routed_experts: list[list[int]] | None = None
    remove_sample: bool = False
    teacher_log_probs: list[float] | None = None
    status: SlimeSample.Status = Status.PENDING
    metadata: dict = field(default_factory=dict)
    generate_function_path: str | None = None
    custom_rm_path: str | None = None
    train_metadata: dict | None = None
    session_id: str | None = None
    non_generation_time: float = 0.0
    spec_info: SlimeSample.SpecInfo = field(default_factory=SpecInfo)
    prefix_cache_info: SlimeSample.PrefixCacheInfo = field(default_factory=PrefixCacheInfo)

    @property
    def effective_response_length(self) -> int:
        return sum(self.loss_mask) if self.loss_mask is not None else self.response_length


def slime_sample_class() -> type:
    """slime's own ``Sample`` when slime is installed, else :class:`SlimeSample`."""
    try:
        from slime.utils.types import Sample
    except ImportError:
        return SlimeSample
    return Sample  # type: ignore[no-any-return]


_STATUS = {"stop": "COMPLETED", "length": "TRUNCATED", "abort": "ABORTED", "error": "FAILED"}


def slime_status(cls: Any, finish_reason: str) -> Any:
    """slime's ``Sample.Status`` for a FOCUS finish reason (``length`` is ``TRUNCATED``)."""
    return cls.Status[_STATUS.get(finish_reason, "COMPLETED")]


def to_slime_samples(
    batch: Batch,
    *,
    reward: Literal["advantage", "reward"] = "advantage",
    merge_turns: bool = True,
    skip_unmasked: bool = True,
) -> list[Any]:
    """One slime ``Sample`` per sequence of :func:`actor_sequences` (same order).

    ``reward="advantage"`` (default) puts the segment's FOCUS advantage in
    ``Sample.reward``, so slime's stock per-sample advantage path trains on it;
    ``"reward"`` puts the env reward of the sample's turns there instead (the segment's,
    unless a prompt that does not extend the previous turn, e.g. after a compaction, split
    it into several samples). Both values, the per-token advantages and the ids are in
    ``Sample.metadata`` either way; ``metadata["raw_reward"]`` is the env reward, which
    slime logs in place of ``reward`` (``rollout/raw_reward``, pass rates), so its reward
    metrics are rewards even when it trains on the advantage. The samples of one segment share its ``rollout_id``,
    so slime's loss counts the segment once (slime/utils/types.py, ``Sample.rollout_id``).
    :class:`NothingToTrain` for a batch without a trained token.
    """
    if reward not in ("advantage", "reward"):
        raise ValueError(f"reward must be 'advantage' or 'reward', got {reward!r}")
    cls: Any = slime_sample_class()
    groups: dict[tuple[str, str], int] = {}
    segments: dict[tuple[str, str, int], int] = {}
    out = []
    for i, seq in enumerate(trainable_sequences(batch, merge_turns=merge_turns, skip_unmasked=skip_unmasked)):
        first, last = seq.rows[0], seq.rows[-1]
        group = groups.setdefault((first.task_id, first.tree_id), len(groups))
        segment = segments.setdefault((first.task_id, first.tree_id, first.edge_id), len(segments))
        p = seq.prompt_length
        out.append(
            cls(
                group_index=group,
                index=i,
                rollout_id=segment,
                tokens=list(seq.tokens),
                response_length=len(seq.tokens) - p,
                reward=seq.advantage if reward == "advantage" else seq.reward,
                loss_mask=list(seq.mask[p:]),
                rollout_log_probs=list(seq.logprobs[p:]),
                weight_versions=[r.policy_version for r in seq.rows],
                status=slime_status(cls, last.finish_reason),
                metadata={
                    "collection_id": first.collection_id,
                    "iteration": first.iteration,
                    "task_id": first.task_id,
                    "tree_id": first.tree_id,
                    "node_id": first.node_id,
                    "edge_id": first.edge_id,
                    "turns": [r.turn_index for r in seq.rows],
                    "advantage": seq.advantage,
                    "reward": seq.reward,
                    "raw_reward": seq.reward,  # what slime logs as the reward (rollout/raw_reward, pass rates)
                    "advantages": list(seq.advantages[p:]),
                },
            )
        )
    return out


# --- verl ------------------------------------------------------------------------------------


def to_verl_batch(
    batch: Batch,
    *,
    pad_token_id: int,
    temperature: float | None = None,
    max_prompt_length: int | None = None,
    max_response_length: int | None = None,
    merge_turns: bool = True,
    skip_unmasked: bool = True,
) -> dict[str, dict[str, Any]]:
    """The arguments of verl's ``DataProto.from_dict(tensors, non_tensors, meta_info)``
    for one PPO update, one row per sequence of :func:`actor_sequences` (same order).

    ``tensors`` holds numpy arrays (``torch.from_numpy`` each) with verl's names and
    layout (``verl/trainer/ppo/ray_trainer.py``, ``workers/actor/dp_actor.py``):
    ``prompts`` (n, P) left-padded with ``pad_token_id``, ``responses`` (n, R)
    right-padded, ``input_ids`` = the two side by side, ``attention_mask`` (1 on real
    tokens), ``position_ids`` (``cumsum(attention_mask) - 1``, 0 on left padding), all
    int64; ``response_mask`` (int64, 1 on trained tokens: observation tokens inside
    the response and padding are 0), ``advantages`` (float32, the segment advantage on
    trained tokens), ``old_log_probs`` and ``rollout_log_probs`` (float32, the behaviour
    log-probs; 0 on observation tokens and padding). For verl's metric helpers
    (``compute_data_metrics``, which its trainer runs on every batch) it also holds
    ``token_level_scores`` = ``token_level_rewards`` (float32, each turn's env reward on
    the turn's last completion token, so a row sums to its sequence's reward; verl puts
    an outcome score on the last response token; equal, as verl has them without a KL
    penalty in the reward) and ``returns`` (= ``advantages``, as verl's critic-free
    estimators set them: FOCUS's critic values checkpoints, not tokens, so there are no
    ``values`` and the helpers take ``use_critic=False``). The per-token arrays are aligned
    with ``responses``: entry j belongs to ``responses[:, j]``, predicted from what
    precedes it (verl shifts inside the actor). P and R are the longest prompt and
    response unless given; a longer one is refused. ``non_tensors`` holds ``uid`` (the
    tree: verl's GRPO grouping key) and the ids of each row; ``meta_info`` holds
    ``global_token_num`` (each row's real tokens: verl's throughput metrics and its actor
    worker's MFU read it after ``update_policy``) and the sampling ``temperature`` if
    given (verl's actor divides its logits by it, and its ``update_policy`` raises
    ``KeyError`` without it). A reward beyond float32 is refused naming its sequence.
    :class:`NothingToTrain` for a batch without a trained token.
    """
    import numpy as np

    if temperature is not None and not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(
            f"temperature must be a finite number > 0 (verl's actor divides its logits by it), got {temperature!r}"
        )
    seqs = trainable_sequences(batch, merge_turns=merge_turns, skip_unmasked=skip_unmasked)
    p_len = max(s.prompt_length for s in seqs) if max_prompt_length is None else max_prompt_length
    r_len = max(len(s.tokens) - s.prompt_length for s in seqs) if max_response_length is None else max_response_length
    tensors = _verl_tensors(seqs, pad_token_id, p_len, r_len)
    rows = [s.rows[0] for s in seqs]
    non_tensors = {
        "uid": np.array([f"{r.collection_id}/{r.tree_id}" for r in rows], dtype=object),
        "task_id": np.array([r.task_id for r in rows], dtype=object),
        "edge_id": np.array([r.edge_id for r in rows], dtype=object),
    }
    meta_info: dict[str, Any] = {"global_token_num": tensors["attention_mask"].sum(axis=1).tolist()}
    if temperature is not None:
        meta_info["temperature"] = temperature
    return {"tensors": tensors, "non_tensors": non_tensors, "meta_info": meta_info}


def _verl_tensors(seqs: list[TokenSequence], pad_token_id: int, p_len: int, r_len: int) -> dict[str, Any]:
    """:func:`to_verl_batch`'s ``tensors``: prompts left-, responses right-padded to
    ``p_len`` and ``r_len``; a longer sequence is a ``ValueError`` naming it."""
    import numpy as np

    n = len(seqs)
    prompts = np.full((n, p_len), pad_token_id, dtype=np.int64)
    responses = np.full((n, r_len), pad_token_id, dtype=np.int64)
    attention = np.zeros((n, p_len + r_len), dtype=np.int64)
    mask = np.zeros((n, r_len), dtype=np.int64)
    logprobs = np.zeros((n, r_len), dtype=np.float32)
    advantages = np.zeros((n, r_len), dtype=np.float32)
    for i, s in enumerate(seqs):
        p, r = s.prompt_length, len(s.tokens) - s.prompt_length
        if p > p_len or r > r_len:
            first = s.rows[0]
            raise ValueError(
                f"sequence {i} (task {first.task_id!r}, edge {first.edge_id}) has a prompt of {p} and a response "
                f"of {r} tokens; max_prompt_length {p_len}, max_response_length {r_len}"
            )
        prompts[i, p_len - p :] = s.tokens[:p]
        responses[i, :r] = s.tokens[p:]
        attention[i, p_len - p : p_len + r] = 1
        mask[i, :r] = s.mask[p:]
        logprobs[i, :r] = s.logprobs[p:]
        advantages[i, :r] = s.advantages[p:]
    scores = _verl_scores(seqs, r_len)
    return {
        "prompts": prompts,
        "responses": responses,
        "input_ids": np.concatenate([prompts, responses], axis=1),
        "attention_mask": attention,
        "position_ids": np.clip(np.cumsum(attention, axis=1) - 1, 0, None),
        "response_mask": mask,
        "advantages": advantages,
        "old_log_probs": logprobs,
        "rollout_log_probs": logprobs.copy(),
        "token_level_scores": scores,
        "token_level_rewards": scores.copy(),
        "returns": advantages.copy(),
    }


def _verl_scores(seqs: list[TokenSequence], r_len: int) -> Any:
    """verl's ``token_level_scores`` (n, R), float32: each turn's env reward on its last
    completion token (column 0 for a turn without a completion token in the response)."""
    import numpy as np

    scores = np.zeros((len(seqs), r_len), dtype=np.float32)
    for i, s in enumerate(seqs):
        for row in s.rows:
            if not abs(row.reward) <= FLOAT32_MAX:
                first = s.rows[0]
                raise ValueError(
                    f"sequence {i} (task {first.task_id!r}, edge {first.edge_id}) has the reward {row.reward!r}, "
                    f"beyond float32 (±{FLOAT32_MAX:.4g}), which verl's scores are in; scale the rewards down"
                )
            j = len(row.prompt_ids) + len(row.completion_ids) - 1 - s.prompt_length
            if r_len:
                scores[i, max(j, 0)] += row.reward
    return scores
