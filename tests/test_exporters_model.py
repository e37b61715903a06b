"""Exports read the way each trainer reads them give the sampling model's own log-probs.

A collection on the embedded model (multi-turn segments, compactions that split a
segment), then every trained token's log-prob recomputed with the same weights by
teacher forcing, at the position each trainer takes it from:

- Tinker: position j of ``model_input`` predicts ``target_tokens[j]``;
- slime (``get_responses``): ``logits[-response_length - 1 : -1]`` over ``tokens``;
- verl (``dp_actor``): ``input_ids`` with left-padded prompts, ``attention_mask`` and
  ``position_ids``, then ``logits[:, -R - 1 : -1]`` against ``responses``; and verl's
  trainer without its legacy workers, which unpads each row and slices its response back
  (``to_verl_batches``' pieces).

At temperature 1 without truncation the sampler's distribution is the model's softmax,
so each must equal the recorded behaviour log-prob; a shift by one token, an observation
token counted as sampled or a padding offset reads another token's log-prob instead.
"""

from __future__ import annotations

import numpy as np
import pytest

from focus.agent import Agent
from focus.batch import Batch
from focus.branching import SparseCheckpoints
from focus.collector import Collector
from focus.context import Summarize
from focus.critic import ConstantCritic
from focus.exporters import actor_sequences, to_slime_samples, to_tinker_datums, to_verl_batch
from focus.policy import SamplingParams
from focus.priority import Phase, Selective
from focus.testing import run
from focus.toy import ReachTarget, reach_target_tasks, toy_format

#: The server samples with numpy in float32, the check runs torch in float32: they agree to
#: ~2e-6 (measured); a token read at a wrong position is off by 1e-1 or more.
TOL = 1e-4


async def _collect(url: str) -> Batch:
    from focus.backends import OpenAICompatPolicy

    policy = OpenAICompatPolicy(url)
    agent = Agent(
        policy,
        ReachTarget(),
        toy_format(),
        context=Summarize(40, train_on_summary=True),
        branch_points=SparseCheckpoints(3),
        max_steps=10,
        sampling=SamplingParams(max_tokens=6, temperature=1.0),
    )
    search = Selective(phases=[Phase("evidence", rollouts_per_task=2), Phase("continue", transitions=16)])
    collector = Collector(agent, search=search, critic=ConstantCritic(0.5), collection_id="oracle", seed=0)
    try:
        return await collector.collect(reach_target_tasks(3, seed=0))
    finally:
        await policy.aclose()


@pytest.fixture(scope="module")
def batch(local_model_server) -> Batch:
    b = run(_collect(local_model_server.url))
    seqs = actor_sequences(b)
    assert any(len(s.rows) > 1 for s in seqs), "the test needs multi-turn sequences"
    assert any(r.kind == "compaction" and r.loss_mask[0] for r in b.actor), "and trained compactions"
    assert len(seqs) > len({(r.tree_id, r.edge_id) for r in b.actor}), "and a segment split in two"
    return b


def _logprobs(model, ids, positions=None, attn=None) -> np.ndarray:
    """log_softmax of the model's logits at every position, (time, vocab)."""
    import torch

    with torch.no_grad():
        if positions is None:
            logits, _ = model(torch.tensor([list(ids)]))
        else:
            logits, _ = model(torch.tensor([list(ids)]), positions=positions[None], attn_mask=attn[None])
    return torch.log_softmax(logits[0].double(), dim=-1).numpy()


@pytest.fixture(scope="module")
def model():
    from focus.tinylm.model import load

    return load()  # the committed weights the embedded server samples from


@pytest.mark.needs("torch")
@pytest.mark.needs("tinker")
def test_tinker_datums_carry_the_models_logprob_of_each_target(batch, model):
    checked = 0
    for d in to_tinker_datums(batch):
        ids = d.model_input.to_ints()
        f = {k: v.to_numpy() for k, v in d.loss_fn_inputs.items()}
        want = _logprobs(model, ids)[np.arange(len(ids)), f["target_tokens"]]
        trained = f["advantages"] != 0
        np.testing.assert_allclose(f["logprobs"][trained], want[trained], atol=TOL, rtol=0)
        checked += int(trained.sum())
    assert checked == sum(sum(r.loss_mask) for r in batch.actor if r.advantage != 0)


@pytest.mark.needs("torch")
def test_slime_samples_carry_the_models_logprob_of_each_response_token(batch, model):
    checked = 0
    for s in to_slime_samples(batch):
        n, r = len(s.tokens), s.response_length
        lp = _logprobs(model, s.tokens)[n - r - 1 : n - 1]  # slime's get_responses
        want = lp[np.arange(r), s.tokens[n - r :]]
        trained = np.array(s.loss_mask) == 1
        np.testing.assert_allclose(np.array(s.rollout_log_probs)[trained], want[trained], atol=TOL, rtol=0)
        checked += int(trained.sum())
    assert checked == sum(sum(r.loss_mask) for r in batch.actor)


@pytest.mark.needs("torch")
def test_verl_batch_read_with_its_padding_gives_the_models_logprobs(batch, model):
    import torch

    t = to_verl_batch(batch, pad_token_id=0, temperature=1.0)["tensors"]
    n, width = t["input_ids"].shape
    r_len = t["responses"].shape[1]
    causal = torch.tril(torch.ones(width, width, dtype=torch.bool))
    checked = 0
    for i in range(n):
        real = torch.from_numpy(t["attention_mask"][i]).bool()
        attn = (causal & real[None, :]) | torch.eye(width, dtype=torch.bool)  # a padding query sees itself only
        lp = _logprobs(model, t["input_ids"][i], torch.from_numpy(t["position_ids"][i]), attn)
        want = lp[width - r_len - 1 : width - 1][np.arange(r_len), t["responses"][i]]  # dp_actor's slice
        trained = t["response_mask"][i] == 1
        np.testing.assert_allclose(t["old_log_probs"][i][trained], want[trained], atol=TOL, rtol=0)
        checked += int(trained.sum())
    assert checked == sum(sum(r.loss_mask) for r in batch.actor)


@pytest.mark.needs("torch")
def test_verl_pieces_read_without_padding_give_the_models_logprobs(batch, model):
    """verl's trainer without its legacy workers hands the actor no padding
    (``left_right_2_no_padding``: each row's tokens where ``attention_mask`` is 1, with their
    ``position_ids``, packed one after another) and takes each row's response back with
    ``_slice_response_from_unpad_output`` (verl/workers/utils/losses.py, commit
    b178a3cd56f58b2d502255daba591e92833930a7): lengths from ``attention_mask`` split at
    ``prompts``' width, then ``values[end - response_length - 1 : end - 1]``, right-padded to
    R. Read so, every piece of ``to_verl_batches`` gives the recorded log-probs."""
    import torch

    from focus.exporters import to_verl_batches

    checked = 0
    pieces = to_verl_batches(batch, pad_token_id=0, max_padded_tokens=2000, temperature=1.0)
    assert len(pieces) > 1
    for piece in pieces:
        t = piece["tensors"]
        p_width, r_len = t["prompts"].shape[1], t["responses"].shape[1]
        attention = torch.from_numpy(t["attention_mask"])
        flat = []  # the engine's packed output: each row's next-token log-probs over its real tokens
        for i in range(len(attention)):
            real = attention[i].bool()
            ids = torch.from_numpy(t["input_ids"][i])[real]
            causal = torch.tril(torch.ones(len(ids), len(ids), dtype=torch.bool))
            lp = _logprobs(model, ids.tolist(), torch.from_numpy(t["position_ids"][i])[real], causal)
            flat.append(np.append(lp[np.arange(len(ids) - 1), ids[1:].numpy()], 0.0))  # entry k predicts k + 1
        values = np.concatenate(flat)
        prompt_lens = attention[:, :p_width].sum(dim=1)
        response_lens = attention[:, p_width:].sum(dim=1)
        ends = (prompt_lens + response_lens).cumsum(dim=0)
        assert int(ends[-1]) == len(values)
        for i, (resp, end) in enumerate(zip(response_lens.tolist(), ends.tolist(), strict=True)):
            got = np.pad(values[end - resp - 1 : end - 1], (0, r_len - resp))
            trained = t["response_mask"][i] == 1
            np.testing.assert_allclose(t["old_log_probs"][i][trained], got[trained], atol=TOL, rtol=0)
            checked += int(trained.sum())
    assert checked == sum(sum(r.loss_mask) for r in batch.actor)
