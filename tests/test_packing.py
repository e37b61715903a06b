"""focus.packing: a batch's token trie trains exactly what its sequences train.

The pure checks read each trained node's context back through its parents; the model
checks compare the log-probs and the clipped loss's gradient of the trie layout with
the plain one on a small random TinyLM (float32: the two layouts sum in different
orders, so they agree to about 1e-6 relative, not bit for bit).
"""

from __future__ import annotations

import random

import pytest

try:
    import torch
except ModuleNotFoundError:  # pip install focus-rl without [train]
    pytest.skip("torch is not installed (the [train] extra)", allow_module_level=True)

from focus.packing import TreePacked, build_trie, pack_trees
from focus.tinylm.model import TinyConfig, TinyLM
from focus.train_local import (
    Packed,
    UpdateConfig,
    clipped_loss,
    pack_prefixes,
    pad_sequences,
    padded_logprobs,
)


def _seq(tokens, mask, lp=None, adv=1.0):
    lps = tuple(lp if lp is not None else -0.01 * (i + 1) for i in range(len(tokens)))
    return Packed(tuple(tokens), lps, tuple(adv if m else 0.0 for m in mask), tuple(mask))


def _random_tree_batch(seed: int, n: int = 40) -> list[Packed]:
    """Sequences that share prefixes as a tree batch's do: a prompt, then branches
    that copy a random earlier sequence's prefix and continue; some exact repeats."""
    rng = random.Random(seed)
    prompt = [1, 2, 3, 4]
    seqs: list[tuple[list[int], list[int]]] = []
    for _ in range(n):
        if seqs and rng.random() < 0.7:
            base_t, base_m = rng.choice(seqs)
            cut = rng.randint(len(prompt), len(base_t))
            toks, mask = list(base_t[:cut]), [0] * cut
        else:
            toks, mask = list(prompt), [0] * len(prompt)
        for _ in range(rng.randint(1, 30)):
            toks.append(rng.randint(5, 8))
            mask.append(rng.random() < 0.6)
        seqs.append((toks, [int(m) for m in mask]))
    seqs += seqs[:3]  # identical sequences: their trained tokens must stay apart
    return [_seq(t, m, adv=rng.uniform(-1, 1)) for t, m in seqs]


def _trained(pieces_or_seqs) -> list[tuple]:
    """(context, token, logprob, advantage) of every trained token, sorted."""
    out = []
    for p in pieces_or_seqs:
        for j, m in enumerate(p.mask):
            if not m:
                continue
            if isinstance(p, TreePacked):
                ctx, q = [], p.parents[j]
                while q >= 0:
                    ctx.append(p.tokens[q])
                    assert p.positions[q] == p.positions[j] - len(ctx)
                    q = p.parents[q]
                ctx.reverse()
                assert p.positions[j] == len(ctx)  # a piece carries its whole ancestor chain
            else:
                ctx = list(p.tokens[:j])
            out.append((tuple(ctx), p.tokens[j], p.logprobs[j], p.advantages[j]))
    return sorted(out)


@pytest.mark.parametrize("max_nodes", [2, 7, 64, 256, 100_000])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_trained_token_once_with_its_context(seed, max_nodes):
    seqs = _random_tree_batch(seed)
    pieces = pack_trees(seqs, max_nodes)
    assert _trained(pieces) == _trained(seqs)
    for p in pieces:
        assert all(q < j for j, q in enumerate(p.parents))  # parents first
        assert p.parents[0] == -1 and not p.mask[0]


def test_the_trie_holds_each_shared_token_once():
    parent = _seq([1, 2, 3, 4], [0, 0, 1, 1])
    a = _seq([1, 2, 3, 4, 5, 6], [0, 0, 0, 0, 1, 1])
    b = _seq([1, 2, 3, 4, 7], [0, 0, 0, 0, 1])
    trie, roots = build_trie([parent, a, b])
    assert len(roots) == 1 and len(trie.token) == 7  # 1 2 3 4 shared, then 5 6 | 7
    (piece,) = pack_trees([parent, a, b])
    assert len(piece.tokens) == 7 and sum(piece.mask) == 5
    # prefix packing keeps b apart and repeats the prompt
    assert sum(len(p.tokens) for p in pack_prefixes([parent, a, b])) == 11


def test_a_trained_token_is_never_shared():
    s = _seq([1, 2, 3, 5], [0, 0, 1, 1], adv=0.5)
    t = _seq([1, 2, 3, 5], [0, 0, 1, 1], adv=-0.5)
    (piece,) = pack_trees([s, t])
    assert sum(piece.mask) == 4 and len(piece.tokens) == 6  # 1 2 shared, 3 5 twice
    assert sorted(piece.advantages[j] for j, m in enumerate(piece.mask) if m) == [-0.5, -0.5, 0.5, 0.5]


def test_a_chain_longer_than_a_piece_is_kept_whole():
    s = _seq(list(range(1, 41)), [0] * 5 + [1] * 35)
    pieces = pack_trees([s], max_nodes=8)
    assert _trained(pieces) == _trained([s])


def _model() -> TinyLM:
    torch.manual_seed(0)
    model = TinyLM(TinyConfig(d_model=32, n_layers=2, n_heads=4, max_len=256))
    model.eval()
    return model


@pytest.mark.parametrize("max_nodes", [16, 256])
def test_the_trie_gives_the_sequences_log_probs_loss_and_gradient(max_nodes):
    model = _model()
    seqs = _random_tree_batch(3, n=24)
    plain = pad_sequences(seqs, 0)
    tree = pad_sequences(pack_trees(seqs, max_nodes), 0)
    lp_plain = padded_logprobs(model, plain, 1.0)
    lp_tree = padded_logprobs(model, tree, 1.0)
    # the same multiset of trained log-probs
    want = sorted(lp_plain[plain.mask.bool()].tolist())
    got = sorted(lp_tree[tree.mask.bool()].tolist())
    assert got == pytest.approx(want, rel=1e-5, abs=1e-6)

    def grad(p):
        model.zero_grad()
        loss, _ = clipped_loss(padded_logprobs(model, p, 1.0), p, 0.2)
        loss.backward()
        return float(loss.detach()), torch.cat([q.grad.flatten() for q in model.parameters()])

    (l_plain, g_plain), (l_tree, g_tree) = grad(plain), grad(tree)
    assert l_tree == pytest.approx(l_plain, rel=1e-5, abs=1e-7)
    assert float((g_tree - g_plain).norm() / g_plain.norm()) < 1e-4


def test_the_tree_layout_computes_fewer_tokens_than_prefix_packing():
    seqs = _random_tree_batch(4)
    trie, _ = build_trie(seqs)
    (whole,) = pack_trees(seqs, 100_000)
    assert len(whole.tokens) == len(trie.token)
    tree = sum(len(p.tokens) for p in pack_trees(seqs))
    prefixes = sum(len(p.tokens) for p in pack_prefixes(seqs))
    assert len(trie.token) <= tree < prefixes


def test_pack_modes_and_the_units_an_update_iterates_over():
    from focus.train_local import training_units

    seqs = _random_tree_batch(5, n=6)
    assert UpdateConfig().pack == "tree" and UpdateConfig(pack=True).pack == "tree"
    assert UpdateConfig(pack=False).pack == "none"
    with pytest.raises(ValueError):
        UpdateConfig(pack="trie")
    assert UpdateConfig().rule == "sgd" and UpdateConfig().target_kl == 0.1  # the defaults
    assert all(isinstance(p, TreePacked) for p in training_units(seqs, UpdateConfig()))
    # adam's minibatches are prefix-packed sequences whatever the layout of a forward pass
    adam = UpdateConfig(rule="adam")
    assert training_units(seqs, adam) == training_units(seqs, UpdateConfig(rule="adam", pack="prefixes"))
    assert training_units(seqs, UpdateConfig(pack="prefixes")) == pack_prefixes(seqs)
    assert training_units(seqs, UpdateConfig(pack="none")) == seqs


def test_an_adam_update_is_the_same_laid_out_as_a_trie():
    """Under ``adam`` each minibatch of prefix-packed sequences is laid out as its own
    trie: the same steps as prefix packing, to float rounding."""
    from focus.train_local import PolicyTrainer

    units = pack_prefixes(_random_tree_batch(7, n=30))
    chunks = [list(range(i, min(i + 4, len(units)))) for i in range(0, len(units), 4)]
    weights = {}
    for pack in ("prefixes", "tree"):
        trainer = PolicyTrainer(config=UpdateConfig(rule="adam", pack=pack, minibatch=4, lr=1e-3))
        trainer.model = _model()
        trainer.optimizer = torch.optim.AdamW(trainer.model.parameters(), lr=1e-3)
        trainer._epoch(units, chunks, 1.0, 0, 0, len(chunks), None)  # one epoch, 8 steps
        weights[pack] = torch.cat([q.detach().flatten() for q in trainer.model.parameters()])
    assert float((weights["tree"] - weights["prefixes"]).abs().max()) < 1e-5


def test_bad_layouts_are_refused():
    seqs = _random_tree_batch(6, n=4)
    with pytest.raises(ValueError, match="together"):
        pad_sequences([*pack_trees(seqs), seqs[0]], 0)
    with pytest.raises(ValueError, match="max_nodes"):
        pack_trees(seqs, 1)
    model = _model()
    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match="together"):
        model(ids, positions=torch.tensor([[0, 1, 2]]))
    with pytest.raises(ValueError, match="max_len"):
        model(ids, positions=torch.tensor([[0, 1, 300]]), attn_mask=torch.ones(1, 3, 3, dtype=torch.bool))
