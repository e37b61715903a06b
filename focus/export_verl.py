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
    log-probs; 0 on observation tokens and padding; one array under both names, as verl
    holds them in its bypass mode; editing one in place edits both). For verl's metric helpers
    (``compute_data_metrics``, which its trainer runs on every batch) it also holds
    ``token_level_scores`` = ``token_level_rewards`` (float32, each turn's env reward on
    the turn's last completion token, so a row sums to its sequence's reward; verl puts
    an outcome score on the last response token; equal, as verl has them without a KL
    penalty in the reward; one array, as verl's trainer sets them) and ``returns`` (the
    ``advantages`` array, as verl's critic-free estimators set them: FOCUS's critic values checkpoints, not tokens, so there are no
    ``values`` and the helpers take ``use_critic=False``; verl's critic must not be
    updated on them: its value loss would fit ``returns``, the advantages). The per-token arrays are aligned
    with ``responses``: entry j belongs to ``responses[:, j]``, predicted from what
    precedes it (verl shifts inside the actor). P and R are the longest prompt and
    response unless given; a longer one is refused: every array is n x (P + R), so one long
    sequence widens every row (:func:`to_verl_batches` pads pieces of similar length
    instead). ``non_tensors`` holds ``uid`` (the tree: verl's GRPO grouping key), the ids
    of each row, ``episode_truncated`` (bool, the batch's ``truncated``: the segment ends
    where ``max_steps`` or the context cut the episode, its advantage bootstrapped) and ``__num_turns__`` (int32, verl's count of chat turns that its
    ``compute_data_metrics`` reports as ``num_turns/*``, counted as its agent loop counts
    them: the prompt (whatever earlier turns it holds), each model turn and each
    observation between two of them, so 2 per model turn); ``meta_info`` holds
    ``global_token_num`` (each row's real tokens: verl's throughput metrics and its actor
    worker's MFU read it after ``update_policy``), ``pad_token_id`` (verl's actor reads it,
    0 when absent, where its prefix grouper finds a prompt's padding) and the sampling ``temperature`` if
    given (verl's actor divides its logits by it, and its ``update_policy`` raises
    ``KeyError`` without it). A reward beyond float32 is refused naming its sequence.
    :class:`NothingToTrain` for a batch without a trained token.
    """
    _check_temperature(temperature)
    seqs = trainable_sequences(batch, merge_turns=merge_turns, skip_unmasked=skip_unmasked)
    p_len = max(s.prompt_length for s in seqs) if max_prompt_length is None else max_prompt_length
    r_len = max(len(s.tokens) - s.prompt_length for s in seqs) if max_response_length is None else max_response_length
    return _verl_dict(seqs, list(range(len(seqs))), pad_token_id, temperature, p_len, r_len)


def to_verl_batches(
    batch: Batch,
    *,
    pad_token_id: int,
    max_padded_tokens: int,
    temperature: float | None = None,
    merge_turns: bool = True,
    skip_unmasked: bool = True,
) -> list[dict[str, dict[str, Any]]]:
    """:func:`to_verl_batch` in pieces, each padded to its own longest prompt and response
    and holding at most ``max_padded_tokens`` cells (rows x (P + R)), so the export's size
    follows the tokens it holds rather than rows x the longest row.

    A verl ``DataProto`` is one rectangle: its trainer, its ``union``/``concat`` and its
    actor's mini-batch split read ``(n, P + R)`` arrays (its worker unpads inside, for
    compute only), so one sequence of 8k tokens among 2,000 of 200 makes every row 8k
    wide. verl takes one ``DataProto`` per ``update_actor`` call, so the pieces are what it
    allows: sequences are grouped by length (shortest first; within a piece in the batch's
    order), a piece closes when the next sequence would take it past
    ``max_padded_tokens``, and a sequence longer than that is a piece of its own. Each
    piece is a complete ``DataProto`` (``global_token_num`` its own rows'); every sequence
    is in exactly one. Pieces differ in width, so verl's ``DataProto.concat`` refuses to
    join them; train them one ``update_actor`` after another (each its own optimizer
    steps, by verl's ``ppo_mini_batch_size``), or pass a larger ``max_padded_tokens``.
    """
    if not (isinstance(max_padded_tokens, int) and max_padded_tokens > 0):
        raise ValueError(f"max_padded_tokens must be a positive int, got {max_padded_tokens!r}")
    _check_temperature(temperature)
    seqs = trainable_sequences(batch, merge_turns=merge_turns, skip_unmasked=skip_unmasked)
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i].tokens))
    pieces: list[list[int]] = []
    p_len = r_len = 0
    for i in order:
        p, r = seqs[i].prompt_length, len(seqs[i].tokens) - seqs[i].prompt_length
        if pieces and (len(pieces[-1]) + 1) * (max(p_len, p) + max(r_len, r)) <= max_padded_tokens:
            pieces[-1].append(i)
            p_len, r_len = max(p_len, p), max(r_len, r)
        else:
            pieces.append([i])
            p_len, r_len = p, r
    out = []
    for piece in pieces:
        piece.sort()
        group = [seqs[i] for i in piece]
        p_len = max(s.prompt_length for s in group)
        r_len = max(len(s.tokens) - s.prompt_length for s in group)
        out.append(_verl_dict(group, piece, pad_token_id, temperature, p_len, r_len))
    return out


def _check_temperature(temperature: float | None) -> None:
    if temperature is not None and not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(
            f"temperature must be a finite number > 0 (verl's actor divides its logits by it), got {temperature!r}"
        )


def _verl_dict(
    seqs: list[TokenSequence], index: list[int], pad_token_id: int, temperature: float | None, p_len: int, r_len: int
) -> dict[str, dict[str, Any]]:
    """One ``DataProto.from_dict``'s arguments for ``seqs`` (``index``: their numbers
    among the batch's sequences, for errors)."""
    import numpy as np

    tensors = _verl_tensors(seqs, index, pad_token_id, p_len, r_len)
    rows = [s.rows[0] for s in seqs]
    non_tensors = {
        "uid": np.array([f"{r.collection_id}/{r.tree_id}" for r in rows], dtype=object),
        "task_id": np.array([r.task_id for r in rows], dtype=object),
        "edge_id": np.array([r.edge_id for r in rows], dtype=object),
        # verl's chat turns (AgentLoopOutput.num_turns: the prompt, each assistant turn, each
        # tool answer between them), which its compute_data_metrics reports as num_turns/*
        "__num_turns__": np.array([2 * len(s.rows) for s in seqs], dtype=np.int32),
        # the batch's truncated column: the segment ends where max_steps or the context cut the episode
        "episode_truncated": np.array([s.rows[-1].truncated for s in seqs], dtype=bool),
    }
    meta_info: dict[str, Any] = {
        "global_token_num": tensors["attention_mask"].sum(axis=1).tolist(),
        "pad_token_id": pad_token_id,  # verl's actor reads it (default 0) to find padding in shared prefixes
    }
    if temperature is not None:
        meta_info["temperature"] = temperature
    return {"tensors": tensors, "non_tensors": non_tensors, "meta_info": meta_info}


def _verl_tensors(
    seqs: list[TokenSequence], index: list[int], pad_token_id: int, p_len: int, r_len: int
) -> dict[str, Any]:
    """:func:`to_verl_batch`'s ``tensors``: prompts left-, responses right-padded to
    ``p_len`` and ``r_len``; a longer sequence is a ``ValueError`` naming it."""
    import numpy as np

    n = len(seqs)
    input_ids = np.full((n, p_len + r_len), pad_token_id, dtype=np.int64)
    attention = np.zeros((n, p_len + r_len), dtype=np.int64)
    mask = np.zeros((n, r_len), dtype=np.int64)
    logprobs = np.zeros((n, r_len), dtype=np.float32)
    advantages = np.zeros((n, r_len), dtype=np.float32)
    for i, s in enumerate(seqs):
        p, r = s.prompt_length, len(s.tokens) - s.prompt_length
        if p > p_len or r > r_len:
            first = s.rows[0]
            raise ValueError(
                f"sequence {index[i]} (task {first.task_id!r}, edge {first.edge_id}) has a prompt of {p} and a response "
                f"of {r} tokens; max_prompt_length {p_len}, max_response_length {r_len}"
            )
        input_ids[i, p_len - p : p_len + r] = s.tokens
        attention[i, p_len - p : p_len + r] = 1
        mask[i, :r] = s.mask[p:]
        logprobs[i, :r] = s.logprobs[p:]
        advantages[i, :r] = s.advantages[p:]
    scores = _verl_scores(seqs, index, r_len)
    positions = np.cumsum(attention, axis=1)  # verl's compute_position_id_with_mask, in place
    positions -= 1
    np.maximum(positions, 0, out=positions)
    # the pairs verl itself holds as one tensor (its trainer sets token_level_rewards =
    # token_level_scores without a KL penalty, old_log_probs = rollout_log_probs in bypass
    # mode, and its critic-free estimators return advantages as the returns): one array each
    return {
        "prompts": np.ascontiguousarray(input_ids[:, :p_len]),
        "responses": np.ascontiguousarray(input_ids[:, p_len:]),
        "input_ids": input_ids,
        "attention_mask": attention,
        "position_ids": positions,
        "response_mask": mask,
        "advantages": advantages,
        "old_log_probs": logprobs,
        "rollout_log_probs": logprobs,
        "token_level_scores": scores,
        "token_level_rewards": scores,
        "returns": advantages,
    }


def _verl_scores(seqs: list[TokenSequence], index: list[int], r_len: int) -> Any:
    """verl's ``token_level_scores`` (n, R), float32: each turn's env reward on its last
    completion token (a turn without completion tokens: on the token before it, column 0
    at the response's start), so each row sums to its turns' rewards."""
    import numpy as np

    scores = np.zeros((len(seqs), r_len), dtype=np.float32)
    for i, s in enumerate(seqs):
        for row in s.rows:
            if not abs(row.reward) <= FLOAT32_MAX:
                first = s.rows[0]
                raise ValueError(
                    f"sequence {index[i]} (task {first.task_id!r}, edge {first.edge_id}) has the reward {row.reward!r}, "
                    f"beyond float32 (±{FLOAT32_MAX:.4g}), which verl's scores are in; scale the rewards down"
                )
            j = len(row.prompt_ids) + len(row.completion_ids) - 1 - s.prompt_length
            if r_len:
                scores[i, max(j, 0)] += row.reward
    return scores
