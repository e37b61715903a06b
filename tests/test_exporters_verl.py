"""The verl export's size and its multi-turn count: pieces padded by their own lengths
(``to_verl_batches``), the arrays verl holds once held once, and ``__num_turns__`` read by
verl's ``compute_data_metrics`` (its logic mirrored in tests/fixtures/_verl_metrics.py)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from fixtures._verl_metrics import DataProto, compute_data_metrics
from test_exporters import batch  # noqa: F401 - the multi-turn two-tree batch fixture

from focus.batch import ActorRow, Batch
from focus.export_verl import to_verl_batches
from focus.exporters import actor_sequences, to_verl_batch


def _row(edge: int, prompt: int, completion: int, rng: random.Random) -> ActorRow:
    return ActorRow(
        "c", 0, f"t{edge % 7}", f"tree{edge % 7}", 0, edge, 0, "v0",
        tuple(rng.randrange(1, 1000) for _ in range(prompt)), tuple(rng.randrange(1, 1000) for _ in range(completion)),
        tuple(-rng.random() for _ in range(completion)), tuple(rng.choice((0, 1, 1)) for _ in range(completion)),
        rng.uniform(-1, 1), float(edge % 2), "stop",
    )  # fmt: skip


@pytest.fixture(scope="module")
def skewed() -> Batch:
    """200 short sequences and one of 2,000 tokens in the middle: the shape of a batch with
    one long trajectory."""
    rng = random.Random(0)
    return Batch("c", 0, [_row(i, 12 + i % 5, 2000 if i == 100 else 8 + i % 9, rng) for i in range(201)])


def _unique_bytes(arrays) -> int:
    seen: dict[int, int] = {}
    for a in arrays:
        base = a if a.base is None else a.base
        seen[id(base)] = base.nbytes
    return sum(seen.values())


def _real_rows(out: dict) -> list[dict]:
    """Each row's real content, read through its masks as verl's actor reads it."""
    t = out["tensors"]
    r_len = t["responses"].shape[1]
    rows = []
    for i in range(len(t["input_ids"])):
        real = t["attention_mask"][i] == 1
        n_resp = int(real[-r_len:].sum()) if r_len else 0
        rows.append(
            {
                "tokens": tuple(t["input_ids"][i][real].tolist()),
                "positions": t["position_ids"][i][real].tolist(),
                "response_mask": t["response_mask"][i, :n_resp].tolist(),
                "old_log_probs": t["old_log_probs"][i, :n_resp].tolist(),
                "advantages": t["advantages"][i, :n_resp].tolist(),
                "scores": t["token_level_scores"][i, :n_resp].tolist(),
                "padding": (t["response_mask"][i, n_resp:].sum(), t["advantages"][i, n_resp:].sum()),
                "uid": out["non_tensors"]["uid"][i],
                "turns": int(out["non_tensors"]["__num_turns__"][i]),
            }
        )
    return rows


def test_verl_pieces_hold_every_sequence_once_in_a_size_that_follows_their_tokens(skewed):
    """verl's ``DataProto`` is one rectangle, so ``to_verl_batch`` makes every row as wide
    as the longest: one 2,000-token sequence among 200 of ~22 took 201 x 2,016 cells for
    4,394 real tokens (and 2,000 short rows with one of 8k took 1.03 GB). There was no
    other way to export; ``to_verl_batches`` pads pieces of similar length, each a complete
    ``DataProto`` that verl's metric helpers read, with every row as the whole export has it."""
    whole = to_verl_batch(skewed, pad_token_id=0, temperature=1.0)
    real = sum(whole["meta_info"]["global_token_num"])
    assert whole["tensors"]["input_ids"].size > 50 * real  # the rectangle this is about
    pieces = to_verl_batches(skewed, pad_token_id=0, max_padded_tokens=4096, temperature=1.0)
    cells = sum(p["tensors"]["input_ids"].size for p in pieces)
    assert cells <= 2 * real, (cells, real)
    assert len(pieces) > 1 and all(p["tensors"]["input_ids"].size <= 4096 for p in pieces[:-1])
    want = sorted(_real_rows(whole), key=lambda r: r["tokens"])
    got = sorted((r for p in pieces for r in _real_rows(p)), key=lambda r: r["tokens"])
    assert got == want  # every sequence exactly once, token for token
    assert all(r["padding"] == (0, 0) for r in got)
    for p in pieces:
        data = DataProto.from_dict(p["tensors"], p["non_tensors"], p["meta_info"])
        metrics = compute_data_metrics(data, use_critic=False)
        assert metrics["response_length/max"] == data.batch["response_mask"].shape[1]  # padded to its own longest
        assert p["meta_info"]["temperature"] == 1.0
        assert p["meta_info"]["global_token_num"] == data.batch["attention_mask"].sum(-1).tolist()
    # a sequence longer than the budget is a piece of its own; the rest still fit
    small = to_verl_batches(skewed, pad_token_id=0, max_padded_tokens=100)
    assert sum(len(p["tensors"]["input_ids"]) for p in small) == len(whole["tensors"]["input_ids"])
    assert [len(p["tensors"]["input_ids"]) for p in small if p["tensors"]["input_ids"].size > 100] == [1]
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match="max_padded_tokens must be a positive int"):
            to_verl_batches(skewed, pad_token_id=0, max_padded_tokens=bad)  # type: ignore[arg-type]


def test_the_arrays_verl_holds_once_are_held_once(skewed):
    """verl's trainer sets ``token_level_rewards = token_level_scores`` (no KL penalty in the
    reward), its bypass mode ``old_log_probs = rollout_log_probs``, and its critic-free
    estimators return one tensor as advantages and returns. The export copied each: 12 of
    its 64 bytes per response cell were copies (1.03 GB for the 2,000 + one 8k batch, 0.84
    GB now)."""
    t = to_verl_batch(skewed, pad_token_id=0)["tensors"]
    assert t["token_level_rewards"] is t["token_level_scores"]
    assert t["rollout_log_probs"] is t["old_log_probs"]
    assert t["returns"] is t["advantages"]
    n, p_len = t["prompts"].shape
    r_len = t["responses"].shape[1]
    # int64: prompts + responses, input_ids, attention, positions; response mask; float32: 3
    assert _unique_bytes(t.values()) == n * (8 * 4 * (p_len + r_len) + 8 * r_len + 4 * 3 * r_len)
    for key in ("prompts", "responses", "input_ids", "position_ids"):
        assert t[key].flags.c_contiguous, key  # what torch.from_numpy and verl's views expect


def test_verl_reads_each_sequence_s_chat_turns_as_its_agent_loop_counts_them(batch):  # noqa: F811
    """verl's agent loop gives ``non_tensor_batch["__num_turns__"]`` (int32: the prompt, each
    assistant turn, each tool answer: 2 for one turn, 4 for turn-tool-turn) and its
    ``compute_data_metrics`` reports it as ``num_turns/min|max|mean``; the export had none,
    so a FOCUS batch showed no turn counts beside verl's own runs."""
    out = to_verl_batch(batch, pad_token_id=0)
    seqs = actor_sequences(batch)
    turns = out["non_tensors"]["__num_turns__"]
    assert turns.dtype == np.int32 and turns.tolist() == [2 * len(s.rows) for s in seqs]
    assert {2, 4} <= set(turns.tolist())  # single-turn and multi-turn segments both
    metrics = compute_data_metrics(DataProto.from_dict(out["tensors"], out["non_tensors"], out["meta_info"]), False)
    assert (metrics["num_turns/min"], metrics["num_turns/max"]) == (turns.min(), turns.max())
    assert metrics["num_turns/mean"] == pytest.approx(np.mean([2 * len(s.rows) for s in seqs]))


def test_verl_s_actor_reads_the_export_s_pad_token(batch):  # noqa: F811
    """verl's actor takes ``data.meta_info.get("pad_token_id", 0)`` (workers/actor/dp_actor.py,
    ``compute_log_prob`` and ``update_policy``; its prefix grouper tells a prompt's padding
    from its tokens with it, verl's trainer sets it from the tokenizer). The export did not
    give it, so a batch padded with 262 read as padded with 0, one of the vocabulary's ids."""
    out = to_verl_batch(batch, pad_token_id=262)
    assert out["meta_info"].get("pad_token_id", 0) == 262
    prompts, mask = out["tensors"]["prompts"], out["tensors"]["attention_mask"][:, : out["tensors"]["prompts"].shape[1]]
    assert ((prompts == out["meta_info"].get("pad_token_id", 0)) == (mask == 0)).all()  # padding as verl finds it
    for piece in to_verl_batches(batch, pad_token_id=262, max_padded_tokens=1000):
        assert piece["meta_info"]["pad_token_id"] == 262
