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
  actor and its metric helpers read (scores, rewards, returns, ``global_token_num``,
  ``__num_turns__``); :func:`to_verl_batches` gives it in pieces padded by their own
  lengths, so one long sequence does not widen every row;
  it lives in :mod:`focus.export_verl`, the sequences in :mod:`focus.export_sequences`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, Literal

from focus.batch import Batch
from focus.export_sequences import FLOAT32_MAX as FLOAT32_MAX  # re-exported: the exporters' common part
from focus.export_sequences import NothingToTrain as NothingToTrain
from focus.export_sequences import TokenSequence as TokenSequence
from focus.export_sequences import actor_sequences as actor_sequences
from focus.export_sequences import nothing_to_learn as nothing_to_learn
from focus.export_sequences import trainable_sequences
from focus.export_verl import to_verl_batch as to_verl_batch
from focus.export_verl import to_verl_batches as to_verl_batches

if TYPE_CHECKING:
    import tinker


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
    metrics are rewards even when it trains on the advantage. ``metadata["episode_truncated"]``
    is the segment's ``truncated`` (it ends where ``max_steps`` or the context cut the
    episode): slime's ``status`` ``TRUNCATED`` means the last turn's sampling hit its token
    limit (``finish_reason`` ``length``), as slime sets it. The samples of one segment share its ``rollout_id``,
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
                    # FOCUS's truncated (the segment ends where max_steps or the context cut the
                    # episode; its advantage bootstraps): not slime's status TRUNCATED, nor the
                    # "truncated" its agent trajectories put here, both a turn cut at max tokens
                    "episode_truncated": last.truncated,
                },
            )
        )
    return out
