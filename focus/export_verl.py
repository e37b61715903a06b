"""verl's ``DataProto`` from a batch: the padded arrays its PPO actor and metric helpers read.

See :func:`to_verl_batch`; ``focus.exporters`` re-exports it with the other exporters.
"""

from __future__ import annotations

import math
from typing import Any

from focus.batch import Batch
from focus.export_sequences import FLOAT32_MAX, TokenSequence, trainable_sequences


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
