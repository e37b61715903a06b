"""Tinker and slime exporters: real SDK types (tinker), real field names (slime), token alignment."""

from __future__ import annotations

import dataclasses
import functools
import itertools

import numpy as np
import pytest
from fixtures.slime_ids import slime_rollout_ids
from test_storage import CALL, VaryingLogprobPolicy, _note, batch_from_trees, graft

from focus.agent import Agent
from focus.batch import ActorRow, Batch
from focus.branching import SparseCheckpoints
from focus.env import Task
from focus.exporters import (
    NothingToTrain,
    SlimeSample,
    TokenSequence,
    actor_sequences,
    slime_sample_class,
    to_slime_samples,
    to_tinker_datums,
    to_verl_batch,
    to_verl_batches,
)
from focus.format import ByteCodec, PolicyFormat, XmlToolCallParser
from focus.testing import run
from focus.tools import Tool, ToolEnv
from focus.tree import Tree
from focus.workspace import MemoryWorkspace

#: Fields of slime's ``Sample`` dataclass, in order, as found in THUDM/slime
#: slime/utils/types.py (commit 624b824a898ab0ec1fcb4d373004c7f3852bf515, 2026-08-21).
SLIME_SAMPLE_FIELDS = [
    "group_index", "index", "rollout_id", "prompt", "tokens", "multimodal_inputs", "multimodal_train_inputs",
    "multimodal_train_input_id", "apply_chat_template_kwargs", "response", "response_length", "label", "reward",
    "loss_mask", "weight_versions", "rollout_log_probs", "rollout_top_p_token_ids", "rollout_top_p_token_offsets",
    "rollout_routed_experts", "remove_sample", "teacher_log_probs", "status", "metadata", "generate_function_path",
    "custom_rm_path", "train_metadata", "session_id", "non_generation_time", "spec_info", "prefix_cache_info",
]  # fmt: skip
SLIME_STATUS = ["PENDING", "COMPLETED", "TRUNCATED", "ABORTED", "FAILED"]


def multi_turn_tree(task_id: str) -> Tree:
    """Checkpoints every 2 steps, so segments hold 2 turns (one a parse error shown back)."""
    note = Tool("note", "save a note", {"type": "object", "properties": {"text": {"type": "string"}}}, _note)
    env = ToolEnv(
        [note], judge=lambda t, a: float(a == t.data["answer"]), workspace_factory=lambda t: MemoryWorkspace()
    )
    codec = ByteCodec()
    policy = VaryingLogprobPolicy([CALL, "no tags here", CALL, CALL, "<answer>42</answer>"], codec)
    agent = Agent(
        policy, env, PolicyFormat(codec, XmlToolCallParser()), branch_points=SparseCheckpoints(2), max_steps=8
    )
    root = run(agent.start(Task(task_id, {"prompt": "say 42", "answer": "42"})))
    tree = Tree.new(task_id, root, root.context.prompt_ids)
    graft(tree, 0, run(agent.rollout(root, seed=0)))
    cp = next(n.id for n in tree.checkpoints() if n.id != 0)
    graft(tree, cp, run(agent.rollout(tree.states[cp], seed=1)))
    return tree


@pytest.fixture(scope="module")
def batch() -> Batch:
    b = batch_from_trees([multi_turn_tree("a"), multi_turn_tree("b")], "cx", 1)
    assert any(r.turn_index == 1 for r in b.actor), "the test needs multi-turn segments"
    return b


def _positions(seq: TokenSequence) -> list[tuple[ActorRow, int, int]]:
    """(row, index in completion, position in seq.tokens) of every completion token, found
    independently of the exporter: each row's prompt must be a prefix of the sequence."""
    out = []
    for r in seq.rows:
        assert seq.tokens[: len(r.prompt_ids)] == r.prompt_ids  # the exact prompt this turn was sampled from
        for i in range(len(r.completion_ids)):
            out.append((r, i, len(r.prompt_ids) + i))
    return out


def test_turns_of_a_segment_merge_and_segments_never_merge(batch):
    seqs = actor_sequences(batch)
    segments = {(r.task_id, r.tree_id, r.edge_id) for r in batch.actor}
    assert len(seqs) == len(segments) < len(batch.actor)
    # every trained token of the batch appears exactly once
    assert sum(sum(s.mask) for s in seqs) == sum(sum(r.loss_mask) for r in batch.actor)
    assert len(actor_sequences(batch, merge_turns=False)) == len(batch.actor)


@pytest.mark.needs("tinker")
def test_tinker_datums_align_token_for_token(batch):
    import tinker

    seqs = actor_sequences(batch)
    datums = to_tinker_datums(batch, include_mask=True)
    assert len(datums) == len(seqs)
    for seq, d in zip(seqs, datums, strict=True):
        assert isinstance(d, tinker.Datum)
        inputs = d.model_input.to_ints()
        f = {k: v.to_numpy() for k, v in d.loss_fn_inputs.items()}
        assert set(f) == {"target_tokens", "logprobs", "advantages", "mask"}
        assert inputs == list(seq.tokens[:-1]) and f["target_tokens"].tolist() == list(seq.tokens[1:])
        assert f["target_tokens"].dtype == np.int64 and d.model_input.length == len(f["target_tokens"])
        trained = np.zeros(len(seq.tokens) - 1, dtype=bool)
        for row, i, pos in _positions(seq):
            j = pos - 1  # target index that predicts token ``pos`` from inputs[:pos]
            assert f["target_tokens"][j] == row.completion_ids[i]
            assert f["logprobs"][j] == np.float32(row.logprobs[i])
            assert f["mask"][j] == row.loss_mask[i]
            assert f["advantages"][j] == np.float32(row.advantage * row.loss_mask[i])
            trained[j] = True
        # prompt and observation tokens: no loss, no advantage, no log-prob
        assert (
            not f["mask"][~trained].any() and not f["advantages"][~trained].any() and not f["logprobs"][~trained].any()
        )


#: ``loss_fn_inputs`` of Tinker's built-in RL losses, as tabled in thinking-machines-lab/
#: tinker-cookbook tutorials/202_loss_functions.py (commit 9dfcc3a2cf44432d621a01005073dc6d76a1e87a).
#: The service rejects any other key with 400 "Could not convert loss function inputs to array
#: record" (thinking-machines-lab/tinker-feedback#53); the cookbook strips ``mask`` before
#: sending (tinker_cookbook/rl/train.py ``_remove_mask``).
TINKER_RL_LOSS_INPUTS = {
    "importance_sampling": {"target_tokens", "logprobs", "advantages"},
    "ppo": {"target_tokens", "logprobs", "advantages"},
    "cispo": {"target_tokens", "logprobs", "advantages"},
}


@pytest.mark.needs("tinker")
def test_default_tinker_datums_go_straight_into_the_rl_losses(batch):
    """``forward_backward(to_tinker_datums(batch), loss_fn)`` must not carry ``mask``."""
    import tinker

    datums = to_tinker_datums(batch)
    assert datums
    with_mask = to_tinker_datums(batch, include_mask=True)
    for loss_fn, keys in TINKER_RL_LOSS_INPUTS.items():
        tinker.types.ForwardBackwardInput(data=datums, loss_fn=loss_fn)  # type: ignore[arg-type]
        assert all(set(d.loss_fn_inputs) == keys for d in datums), loss_fn
    for d, m in zip(datums, with_mask, strict=True):
        assert d.model_input == m.model_input and set(m.loss_fn_inputs) - set(d.loss_fn_inputs) == {"mask"}
        shapes = {k: v.shape for k, v in d.loss_fn_inputs.items()}
        assert shapes == {k: [d.model_input.length] for k in keys}  # one entry per input token, 1-D
        dtypes = {k: v.dtype for k, v in m.loss_fn_inputs.items()}
        assert dtypes == {"target_tokens": "int64", "logprobs": "float32", "advantages": "float32", "mask": "float32"}
        assert all(isinstance(c, tinker.EncodedTextChunk) for c in d.model_input.chunks)


@pytest.mark.needs("tinker")
def test_untrained_turns_and_broken_prefixes(batch):
    r = batch.actor[0]
    compaction = dataclasses.replace(r, edge_id=99, kind="compaction", loss_mask=(0,) * len(r.completion_ids))
    with pytest.raises(NothingToTrain):  # no trained token, no datum: nothing to train on
        to_tinker_datums(Batch("cx", 1, [compaction]))
    kept = to_tinker_datums(Batch("cx", 1, [r, compaction]), skip_unmasked=False)
    assert len(kept) == 2 and not kept[1].loss_fn_inputs["advantages"].to_numpy().any()
    # a turn whose prompt does not extend the previous turn starts a new sequence
    second = dataclasses.replace(r, turn_index=1, prompt_ids=(7, 7, 7))
    assert len(actor_sequences(Batch("cx", 1, [r, second]))) == 2
    follow = dataclasses.replace(r, turn_index=1, prompt_ids=r.prompt_ids + r.completion_ids + (5,))
    assert len(actor_sequences(Batch("cx", 1, [follow, r]))) == 1  # order by turn index, not row order
    with pytest.raises(ValueError, match="log-probs"):
        actor_sequences(Batch("cx", 1, [dataclasses.replace(r, logprobs=())]))
    with pytest.raises(ValueError, match="no prompt ids"):  # tinker's shift would drop its first trained token
        actor_sequences(Batch("cx", 1, [dataclasses.replace(r, prompt_ids=())]))


@pytest.mark.needs("tinker")
@pytest.mark.needs("torch")
def test_an_advantage_beyond_float32_is_refused_naming_its_row(batch):
    """Rewards up to 1e60 are collected (``focus.env.VALUE_LIMIT``), but Tinker's and
    verl's arrays, slime's tensors and the local trainer are float32: an advantage of
    1e39 became ``inf`` in every token's advantage with a RuntimeWarning at most (the
    local trainer stopped with "lower the learning rate", or, with rule sgd or natural,
    took no step and said nothing). Up to float32's largest it is exported as it is."""
    import torch

    big = [dataclasses.replace(r, advantage=1e39 if i == 3 else r.advantage) for i, r in enumerate(batch.actor)]
    r = batch.actor[3]
    said = rf"^actor row \(task {r.task_id!r}, edge {r.edge_id}, turn {r.turn_index}\) has the advantage 1e\+39, beyond"
    for export in (actor_sequences, to_tinker_datums, to_slime_samples, lambda b: to_verl_batch(b, pad_token_id=0)):
        with pytest.raises(ValueError, match=said):
            export(Batch("cx", 1, big))
    with pytest.raises(ValueError, match=r"has the advantage nan, not a number$"):
        actor_sequences(Batch("cx", 1, [dataclasses.replace(r, advantage=float("nan"))]))
    most = float(np.finfo(np.float32).max)
    edge = Batch("cx", 1, [dataclasses.replace(r, advantage=-most) for r in batch.actor])
    assert np.isfinite(to_verl_batch(edge, pad_token_id=0)["tensors"]["advantages"]).all()
    assert all(np.isfinite(d.loss_fn_inputs["advantages"].to_numpy()).all() for d in to_tinker_datums(edge))
    assert torch.isfinite(torch.tensor([s.reward for s in to_slime_samples(edge)], dtype=torch.float32)).all()


@pytest.mark.parametrize("temperature", [0.0, -1.0, float("nan"), float("inf")])
def test_a_verl_temperature_its_actor_cannot_divide_by_is_refused(batch, temperature):
    """verl's actor divides its logits by ``meta_info["temperature"]``: 0 (a greedy
    collection's) made every logit inf and the update NaN, far from here."""
    with pytest.raises(
        ValueError,
        match=rf"^temperature must be a finite number > 0 \(verl's actor divides its logits by it\), got {temperature!r}",
    ):
        to_verl_batch(batch, pad_token_id=0, temperature=temperature)


def test_slime_mirror_has_slime_field_names():
    assert [f.name for f in dataclasses.fields(SlimeSample)] == SLIME_SAMPLE_FIELDS
    assert [s.name for s in SlimeSample.Status] == SLIME_STATUS
    cls = slime_sample_class()
    assert [f.name for f in dataclasses.fields(cls)][: len(SLIME_SAMPLE_FIELDS)] == SLIME_SAMPLE_FIELDS


def test_slime_samples_align_and_group_by_tree(batch):
    seqs = actor_sequences(batch)
    samples = to_slime_samples(batch)
    assert len(samples) == len(seqs)
    tree_of_group: dict[int, str] = {}
    for seq, s in zip(seqs, samples, strict=True):
        p = seq.prompt_length
        assert s.tokens == list(seq.tokens) and s.tokens[:p] == list(seq.rows[0].prompt_ids)
        assert s.response_length == len(s.tokens) - p == len(s.loss_mask) == len(s.rollout_log_probs)
        for row, i, pos in _positions(seq):
            assert s.tokens[pos] == row.completion_ids[i]
            assert s.rollout_log_probs[pos - p] == row.logprobs[i]  # exact float64, not re-rounded
            assert s.loss_mask[pos - p] == row.loss_mask[i]
            assert s.metadata["advantages"][pos - p] == row.advantage * row.loss_mask[i]
        assert s.reward == seq.rows[0].advantage and s.metadata["reward"] == sum(r.reward for r in seq.rows)
        assert s.status.name == {"stop": "COMPLETED", "length": "TRUNCATED"}[seq.rows[-1].finish_reason]
        assert tree_of_group.setdefault(s.group_index, s.metadata["tree_id"]) == s.metadata["tree_id"]
        assert s.effective_response_length == sum(s.loss_mask)
    assert len(tree_of_group) == len({r.tree_id for r in batch.actor}) == 2
    assert [s.index for s in samples] == list(range(len(samples)))
    by_reward = to_slime_samples(batch, reward="reward")
    assert [s.reward for s in by_reward] == [sum(r.reward for r in q.rows) for q in seqs]
    with pytest.raises(ValueError, match="reward must be"):
        to_slime_samples(batch, reward="value")  # type: ignore[arg-type]


@pytest.mark.needs("tinker")
def test_exports_from_a_batch_read_back_from_storage(tmp_path, batch):
    from storage import BatchStore

    store = BatchStore(tmp_path)
    back = store.read(store.write(batch))
    a, b = to_tinker_datums(batch), to_tinker_datums(back)
    assert [d.model_input.to_ints() for d in a] == [d.model_input.to_ints() for d in b]
    assert all(
        np.array_equal(x.loss_fn_inputs[k].to_numpy(), y.loss_fn_inputs[k].to_numpy())
        for x, y in zip(a, b, strict=True)
        for k in x.loss_fn_inputs
    )
    assert [s.rollout_log_probs for s in to_slime_samples(back)] == [
        s.rollout_log_probs for s in to_slime_samples(batch)
    ]


def cookbook_datum_arrays(rows: list[ActorRow]) -> list[dict[str, list]]:
    """tinker-cookbook's ``rl/data_processing.py::trajectory_to_data`` (commit 9dfcc3a2), restated
    for one segment's turns (observation = prompt ids, action = completion ids + log-probs): an
    observation that extends everything so far adds only its new tokens (mask 0, log-prob 0,
    advantage 0); one that does not starts a new datum; action tokens get the advantage and mask 1,
    or 0 and 0 when masked (the cookbook's masked parse-error turns; FOCUS's loss-mask-0 turns).
    Each datum: inputs = full[:-1], and targets, log-probs, advantages, mask = (...)[1:]."""
    out, full, lps, advs, mask = [], [], [], [], []

    def flush():
        out.append(
            {
                "inputs": full[:-1],
                "target_tokens": full[1:],
                "logprobs": lps[1:],
                "advantages": advs[1:],
                "mask": mask[1:],
            }
        )

    for r in rows:
        ob = list(r.prompt_ids)
        if full and ob[: len(full)] != full:
            flush()
            full, lps, advs, mask = [], [], [], []
        delta = ob[len(full) :]
        full = full + delta + list(r.completion_ids)
        lps = lps + [0.0] * len(delta) + list(r.logprobs)
        advs = advs + [0.0] * len(delta) + [r.advantage if m else 0.0 for m in r.loss_mask]
        mask = mask + [0.0] * len(delta) + [float(m) for m in r.loss_mask]
    if full:
        flush()
    return out


@pytest.mark.needs("tinker")
def test_tinker_datums_equal_the_cookbooks_for_each_segment(batch):
    segments: dict[tuple, list[ActorRow]] = {}
    for r in batch.actor:
        segments.setdefault((r.task_id, r.tree_id, r.edge_id), []).append(r)
    expected = [
        d for rows in segments.values() for d in cookbook_datum_arrays(sorted(rows, key=lambda r: r.turn_index))
    ]
    got = to_tinker_datums(batch, include_mask=True)
    assert len(got) == len(expected) and any(len(rows) > 1 for rows in segments.values())
    for d, e in zip(got, expected, strict=True):
        assert d.model_input.to_ints() == e["inputs"]
        for k in ("target_tokens", "logprobs", "advantages", "mask"):
            want = np.asarray(e[k], dtype=np.int64 if k == "target_tokens" else np.float32)
            assert np.array_equal(d.loss_fn_inputs[k].to_numpy(), want), k


def test_verl_batch_has_verl_s_names_layout_and_alignment(batch):
    """verl's PPO actor reads ``responses``, ``response_mask``, ``input_ids``,
    ``attention_mask``, ``position_ids``, ``old_log_probs`` and ``advantages`` from a
    ``DataProto``: prompts left-padded, responses right-padded, per-token arrays of
    shape (n, R) aligned with ``responses``. There was no verl export at all."""
    pad = 262
    out = to_verl_batch(batch, pad_token_id=pad, temperature=1.0)
    t, nt = out["tensors"], out["non_tensors"]
    seqs = actor_sequences(batch)
    n, p_len, r_len = len(seqs), max(s.prompt_length for s in seqs), max(len(s.tokens) - s.prompt_length for s in seqs)
    for key in ("prompts", "responses", "input_ids", "attention_mask", "position_ids", "response_mask"):
        assert t[key].dtype == np.int64, key
    for key in ("advantages", "old_log_probs", "rollout_log_probs"):
        assert t[key].dtype == np.float32 and t[key].shape == (n, r_len), key
    assert t["prompts"].shape == (n, p_len) and t["input_ids"].shape == t["attention_mask"].shape == (n, p_len + r_len)
    assert out["meta_info"]["temperature"] == 1.0 and len(nt["uid"]) == n
    assert out["meta_info"]["global_token_num"] == [len(s.tokens) for s in seqs]
    assert (
        len({u for u, s in zip(nt["uid"], seqs, strict=True) if s.rows[0].task_id == "a"}) == 1
    )  # one GRPO group per tree
    for i, seq in enumerate(seqs):
        real = t["attention_mask"][i] == 1
        assert tuple(t["input_ids"][i][real]) == seq.tokens
        assert not real[: p_len - seq.prompt_length].any()  # left padding, then prompt, response, right padding
        assert (t["input_ids"][i][~real] == pad).all()
        assert list(t["position_ids"][i][real]) == list(range(len(seq.tokens)))
        assert (t["input_ids"][i, p_len:] == t["responses"][i]).all()
        trained = 0
        for row, k, pos in _positions(seq):
            j = pos - seq.prompt_length  # the token's column in responses
            assert t["responses"][i, j] == row.completion_ids[k]
            assert t["response_mask"][i, j] == row.loss_mask[k]
            assert t["old_log_probs"][i, j] == np.float32(row.logprobs[k]) == t["rollout_log_probs"][i, j]
            assert t["advantages"][i, j] == np.float32(row.advantage * row.loss_mask[k])
            trained += row.loss_mask[k]
        assert t["response_mask"][i].sum() == trained  # observation tokens and padding are never trained
    assert any(t["response_mask"][i].sum() < t["attention_mask"][i, p_len:].sum() for i in range(n))  # obs inside
    with pytest.raises(ValueError, match="max_response_length 1"):
        to_verl_batch(batch, pad_token_id=pad, max_response_length=1)


@pytest.mark.needs("tinker")
def test_every_exporter_refuses_a_batch_with_nothing_to_train_on_naming_why(batch):
    """The Tinker and slime exporters returned [] for a batch without a trained token
    (every rollout failed; only compaction turns) where verl's raised: one trainer took
    it for nothing to do, another for an error. All three refuse it, naming why. With
    ``skip_unmasked=False`` the untrained sequences were exported alone: Tinker got datums
    of zero advantages, verl a ``response_mask`` of zeros, which its token-mean loss
    divides by (0 / 0: NaN in every weight)."""
    r = batch.actor[0]
    untrained = Batch("cx", 1, [dataclasses.replace(r, kind="compaction", loss_mask=(0,) * len(r.completion_ids))])
    for empty, why in (
        (Batch("cx", 1, []), "no actor rows"),
        (untrained, "1 actor row(s), none with a trained token (loss mask all 0)"),
    ):
        exports = (
            to_tinker_datums,
            to_slime_samples,
            functools.partial(to_verl_batch, pad_token_id=0),
            functools.partial(to_verl_batches, pad_token_id=0, max_padded_tokens=1000),
        )
        for export, skip_unmasked in itertools.product(exports, (True, False)):
            with pytest.raises(NothingToTrain) as e:
                export(empty, skip_unmasked=skip_unmasked)
            assert str(e.value) == (
                f"batch 'cx' iteration 1 has {why}: nothing to train on "
                "(its statistics say why: failed_rollouts, failure_causes)"
            )
            assert isinstance(e.value, ValueError)  # what verl's export raised, and callers catch


def _slime_rollout_mask_sums(samples: list) -> list[int]:
    """slime's per-rollout loss denominator, as ``RolloutManager._convert_samples_to_train_data``
    computes it (THUDM/slime slime/ray/rollout.py, commit 624b824a898ab0ec1fcb4d373004c7f3852bf515):
    a sample without ``rollout_id`` gets a fresh id of its own, and each sample's denominator
    is the loss-mask total of every sample sharing its id (slime/backends/megatron_utils/loss.py
    ``get_sum_of_sample_mean``: each rollout is one token-mean)."""
    rollout_ids = slime_rollout_ids(samples)
    total: dict[int, int] = {}
    for rid, s in zip(rollout_ids, samples, strict=True):
        total[rid] = total.get(rid, 0) + sum(s.loss_mask)
    return [total[rid] for rid in rollout_ids]


def test_slime_samples_split_from_one_segment_share_its_rollout_id(batch):
    """slime's convention (``Sample.rollout_id``, slime/utils/types.py at 624b824a): samples
    that split one rollout execution share one ``rollout_id``, so the loss reducer takes one
    token-mean over them instead of one per piece. A FOCUS segment is that execution: a
    prompt that does not extend the previous turn (a compaction) splits it into samples,
    which left without a ``rollout_id`` counted twice, each piece weighing as much as a
    whole segment."""
    r = batch.actor[0]
    # turn 1's prompt does not extend turn 0 (a compaction rewrote the context): two samples
    split = dataclasses.replace(r, turn_index=1, prompt_ids=(7, 7, 7))
    other = dataclasses.replace(r, edge_id=r.edge_id + 1000)  # another segment of the same tree
    samples = to_slime_samples(Batch("cx", 1, [r, split, other]))
    assert len(samples) == 3
    assert samples[0].rollout_id is not None and samples[0].rollout_id == samples[1].rollout_id
    assert samples[2].rollout_id is not None and samples[2].rollout_id != samples[0].rollout_id
    both = sum(r.loss_mask) * 2
    assert _slime_rollout_mask_sums(samples) == [both, both, sum(r.loss_mask)]
    # one turn per sample (merge_turns=False) splits every multi-turn segment the same way
    by_turn = to_slime_samples(batch, merge_turns=False)
    seg_of_rid: dict[int, tuple] = {}
    for s in by_turn:
        seg = (s.metadata["task_id"], s.metadata["tree_id"], s.metadata["edge_id"])
        assert seg_of_rid.setdefault(s.rollout_id, seg) == seg
    assert len(seg_of_rid) == len({(q.task_id, q.tree_id, q.edge_id) for q in batch.actor if any(q.loss_mask)})


def test_slime_logs_the_env_reward_as_raw_reward_while_training_on_the_advantage(batch):
    """slime trains on ``Sample.reward`` (here the FOCUS advantage) but logs ``raw_reward``
    (``rollout/raw_reward``, pass rates, the "correct" response metrics that test
    ``raw_reward == 1``), which ``_convert_samples_to_train_data`` takes from
    ``metadata["raw_reward"]`` when a sample has it, else from ``reward`` (THUDM/slime
    slime/ray/rollout.py, commit 624b824a898ab0ec1fcb4d373004c7f3852bf515). Without it slime
    logged the advantages (centred near 0) as the rewards."""
    samples = to_slime_samples(batch)
    seqs = actor_sequences(batch)
    raw = (
        [s.metadata["raw_reward"] if s.metadata and "raw_reward" in s.metadata else s.reward for s in samples]
        if any(s.metadata and "raw_reward" in s.metadata for s in samples)
        else [s.reward for s in samples]
    )
    assert raw == [sum(r.reward for r in q.rows) for q in seqs]
    assert [s.reward for s in samples] == [q.rows[0].advantage for q in seqs]
    assert raw != [s.reward for s in samples]  # the fixture's advantages are not its rewards


def test_slime_and_verl_mark_the_segments_that_end_in_a_truncated_episode(batch):
    """The batch's ``truncated`` column (the segment ends where ``max_steps`` or the context
    cut the episode: its advantage bootstraps from the critic) reached no export: slime's
    samples said ``COMPLETED`` (their last turn ended with ``stop``) and verl's rows nothing,
    so a trainer could not tell a cut episode from an ended one. It is ``episode_truncated``
    in slime's ``metadata`` and verl's ``non_tensors``: slime's own ``status`` ``TRUNCATED``
    and its trajectories' ``metadata["truncated"]`` mean a turn cut at its token limit."""
    cut = {(batch.actor[0].tree_id, batch.actor[0].edge_id)}  # one segment
    marked = Batch(
        batch.collection_id,
        batch.iteration,
        [dataclasses.replace(r, truncated=(r.tree_id, r.edge_id) in cut) for r in batch.actor],
    )
    seqs = actor_sequences(marked)
    expected = [(s.rows[0].tree_id, s.rows[0].edge_id) in cut for s in seqs]
    assert any(expected) and not all(expected)
    samples = to_slime_samples(marked)
    assert [s.metadata["episode_truncated"] for s in samples] == expected
    assert all(s.status.name == "COMPLETED" for s, e in zip(samples, expected, strict=True) if e)  # not a length cut
    verl = to_verl_batch(marked, pad_token_id=0)["non_tensors"]["episode_truncated"]
    assert verl.dtype == np.bool_ and verl.tolist() == expected
    pieces = to_verl_batches(marked, pad_token_id=0, max_padded_tokens=1)
    assert sorted(t for p in pieces for t in p["non_tensors"]["episode_truncated"].tolist()) == sorted(expected)
