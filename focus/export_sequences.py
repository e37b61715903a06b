"""The training sequences every exporter (``focus.exporters``) and the local trainer build
from: the actor rows of one segment joined into one token sequence, token for token.

The actor rows of one segment (edge) are joined into one token sequence when each turn's
prompt extends the previous prompt plus its completion (the ``Segments`` and
``AppendOnly`` contexts guarantee this), so a multi-turn segment becomes one training
sequence in which the tool observations between turns carry mask 0. Turns are never
joined across segments: sibling branches share their parent's tokens, and joining would
train on those tokens once per branch. Nothing is re-tokenised: every id comes from the
rows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from focus.batch import ActorRow, Batch
from focus.sums import left_sum

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


def nothing_to_learn(raw: Sequence[TokenSequence]) -> bool:
    """Whether a batch's advantages say nothing (pure; ``raw``: its :func:`actor_sequences`):
    at every trained position of every distinct token sequence, the advantages of its
    copies sum to 0 - every advantage 0 (each tree's rollouts alike in return), or
    advantages that cancel over identical sequences (four identical truncated leaves of a
    collected toy batch, whose critic predictions differed in float32 rounding, gave
    +-2.3e-10). At the sampling policy the gradient is then exactly 0, and a trainer's
    step (Adam's, from the state of earlier steps) would move the weights by its momentum
    alone."""
    sums: dict[tuple[int, ...], list[float]] = {}
    for s in raw:
        acc = sums.setdefault(s.tokens, [0.0] * len(s.tokens))
        for j, (a, m) in enumerate(zip(s.advantages, s.mask, strict=True)):
            if m:
                acc[j] += a
    return not any(any(acc) for acc in sums.values())


class NothingToTrain(ValueError):
    """A batch without one trained token (no actor rows, or only rows with loss mask 0):
    no trainer step can be made from it."""


def trainable_sequences(batch: Batch, *, merge_turns: bool, skip_unmasked: bool) -> list[TokenSequence]:
    """:func:`actor_sequences`, or :class:`NothingToTrain` naming why there are none.

    Every exporter builds one trainer step, and a step of nothing is an error the
    trainer meets later and less clearly (verl's padding of zero rows, Tinker's
    ``forward_backward`` of no datums, slime's empty rollout): the Tinker and slime
    exporters returned ``[]`` where verl's raised, so one trainer saw a batch of every
    rollout failed as nothing to do and another as an error. ``skip_unmasked=False``
    keeps untrained sequences beside trained ones, not in place of them: sequences none
    of which has a trained token are refused too (verl's token-mean loss divides by the
    trained tokens, 0 there, and trains on NaN)."""
    seqs = actor_sequences(batch, merge_turns=merge_turns, skip_unmasked=skip_unmasked)
    if not any(any(s.mask) for s in seqs):
        n = len(batch.actor)
        why = "no actor rows" if not n else f"{n} actor row(s), none with a trained token (loss mask all 0)"
        raise NothingToTrain(
            f"batch {batch.collection_id!r} iteration {batch.iteration} has {why}: nothing to train on "
            "(its statistics say why: failed_rollouts, failure_causes)"
        )
    return seqs
