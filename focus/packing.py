"""How a batch's training sequences share forward passes (pure layouts; torch lazily).

:func:`focus.exporters.actor_sequences` gives one sequence per segment. Forwarding each
alone repeats every prefix it shares: a segment is usually a prefix of its children's
prompts, siblings share their checkpoint's whole prefix, and GRPO's rollouts of one
task share its prompt. Two layouts share the work:

* :func:`pack_prefixes` merges a sequence into a longer one that starts with the same
  tokens (a causal model gives the same log-probs at a position whatever follows it);
  each leaf's path still repeats the prefix it shares with its siblings.
* :func:`pack_trees` builds the batch's token trie: one node per distinct context, so
  every token is computed once however many sequences pass through it. On the learning
  benchmark's batches prefix packing forwarded 1.5-10x the tokens the trie holds (a
  FOCUS toy batch: 4,758 packed tokens, 1,254 distinct; GRPO's 3,103 and 1,645). A
  causal model sees the same context at a node whichever sequence it came from, so
  the trie gives the same log-probs as the sequences, provided each node attends to
  its own ancestors only and sits at its position in its sequence: a
  :class:`TreePacked` piece lists nodes parents first, each with its parent (whose
  logits predict the node's token) and position; :func:`pad_trees` adds the attention
  mask.

Trained tokens never merge, in either layout: a sequence whose trained token would land
where another sequence's trained token is gets a place of its own (the loss is a mean
over trained tokens, each with its own advantage and behaviour log-prob). The loss, its
gradient and the KL are then the sequences', up to float rounding. A large trie is cut
into pieces of about ``max_nodes`` nodes; each piece carries the chain of ancestors its
subtrees hang from (computed again in every piece that needs it; trained in the first).

:func:`pad_sequences` lays out either kind as a :class:`Padded` minibatch and
:func:`padded_logprobs` runs the model on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from focus.exporters import TokenSequence

if TYPE_CHECKING:
    import torch

#: Nodes per piece: attention over a piece costs its square, about what the model's
#: other products cost per token at a few hundred tokens (d_model 128).
MAX_NODES = 256


class _Sequence(Protocol):
    @property
    def tokens(self) -> tuple[int, ...]: ...
    @property
    def logprobs(self) -> tuple[float, ...]: ...
    @property
    def advantages(self) -> tuple[float, ...]: ...
    @property
    def mask(self) -> tuple[int, ...]: ...


@dataclass(frozen=True)
class TreePacked:
    """One piece of a token trie, parents before children (pure data).

    ``parents[j]``: the index in this piece of the node whose logits predict
    ``tokens[j]`` (-1 for the piece's first node, which is never trained);
    ``positions[j]``: the node's position in its sequences."""

    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    positions: tuple[int, ...]
    logprobs: tuple[float, ...]
    advantages: tuple[float, ...]
    mask: tuple[int, ...]


@dataclass
class _Trie:
    token: list[int]
    parent: list[int]
    position: list[int]
    logprob: list[float]
    advantage: list[float]
    mask: list[int]
    children: list[list[int]]

    def add(self, token: int, parent: int, position: int) -> int:
        self.token.append(token)
        self.parent.append(parent)
        self.position.append(position)
        self.logprob.append(0.0)
        self.advantage.append(0.0)
        self.mask.append(0)
        self.children.append([])
        return len(self.token) - 1


def build_trie(seqs: Sequence[_Sequence]) -> tuple[_Trie, list[int]]:
    """The trie of ``seqs`` (longest first, so ties are broken the same way every time)
    and its top-level nodes."""
    trie = _Trie([], [], [], [], [], [], [])
    roots: list[int] = []
    for s in sorted(seqs, key=lambda q: len(q.tokens), reverse=True):
        node, fresh = -1, False
        for i, tok in enumerate(s.tokens):
            m = s.mask[i] if i else 0  # nothing predicts a sequence's first token
            if not fresh:
                here = roots if node < 0 else trie.children[node]
                nxt = next((c for c in here if trie.token[c] == tok and not (m and trie.mask[c])), None)
                fresh = nxt is None
            if fresh:
                nxt = trie.add(tok, node, i)
                (roots if node < 0 else trie.children[node]).append(nxt)
            assert nxt is not None
            if m:
                trie.logprob[nxt], trie.advantage[nxt], trie.mask[nxt] = s.logprobs[i], s.advantages[i], 1
            node = nxt
    return trie, roots


def pack_trees(seqs: Sequence[_Sequence], max_nodes: int = MAX_NODES) -> list[TreePacked]:
    """``seqs`` as pieces of their token trie (pure; module docstring)."""
    if max_nodes < 2:
        raise ValueError(f"max_nodes must be at least 2, got {max_nodes}")
    trie, roots = build_trie(seqs)
    size = [1] * len(trie.token)
    for n in range(len(size) - 1, -1, -1):  # children are created after their parent
        if trie.parent[n] >= 0:
            size[trie.parent[n]] += size[n]
    groups: list[tuple[list[int], list[int]]] = []  # (ancestor chain, subtree roots)
    todo: list[tuple[list[int], list[int]]] = [([], roots)]
    while todo:
        path, tops = todo.pop(0)
        if not tops:  # a chain longer than a piece, down to its leaf
            groups.append((path, []))
            continue
        group: list[int] = []
        used = 0
        for r in tops:
            if len(path) + size[r] > max_nodes and trie.children[r]:
                chain = [*path, r]
                while len(trie.children[chain[-1]]) == 1 and len(chain) + size[chain[-1]] - 1 > max_nodes:
                    chain.append(trie.children[chain[-1]][0])
                todo.append((chain, trie.children[chain[-1]]))
                continue
            if group and len(path) + used + size[r] > max_nodes:
                groups.append((path, group))
                group, used = [], 0
            group.append(r)
            used += size[r]
        if group:
            groups.append((path, group))
    trained: set[int] = set()
    return [_piece(trie, path, group, trained) for path, group in groups]


def _piece(trie: _Trie, path: list[int], tops: list[int], trained: set[int]) -> TreePacked:
    nodes = list(path)
    stack = list(reversed(tops))
    while stack:  # pre-order: a parent before its children
        n = stack.pop()
        nodes.append(n)
        stack.extend(reversed(trie.children[n]))
    index = {n: j for j, n in enumerate(nodes)}
    mask = []
    for n in nodes:  # a chain shared by several pieces is trained in the first
        mask.append(trie.mask[n] if n not in trained else 0)
        if trie.mask[n]:
            trained.add(n)
    return TreePacked(
        tokens=tuple(trie.token[n] for n in nodes),
        parents=tuple(index.get(trie.parent[n], -1) for n in nodes),
        positions=tuple(trie.position[n] for n in nodes),
        logprobs=tuple(trie.logprob[n] for n in nodes),
        advantages=tuple(trie.advantage[n] for n in nodes),
        mask=tuple(mask),
    )


def pad_trees(pieces: Sequence[TreePacked], pad_id: int) -> Padded:
    """``pieces`` as one :class:`Padded` (pure; no model): node tokens
    in, each node's token predicted from its parent's logits (``source``), attention
    to ancestors only (``attn``; a padding node attends to itself), positions."""
    import torch

    if not pieces:
        raise ValueError("no pieces to pad")
    b, n = len(pieces), max(len(p.tokens) for p in pieces)
    inputs = torch.full((b, n), pad_id, dtype=torch.long)
    source = torch.zeros((b, n), dtype=torch.long)
    positions = torch.zeros((b, n), dtype=torch.long)
    old = torch.zeros((b, n), dtype=torch.float32)
    adv = torch.zeros((b, n), dtype=torch.float32)
    mask = torch.zeros((b, n), dtype=torch.float32)
    attn = torch.eye(n, dtype=torch.bool).repeat(b, 1, 1)
    for i, p in enumerate(pieces):
        k = len(p.tokens)
        if any(m and q < 0 for m, q in zip(p.mask, p.parents, strict=True)):
            raise ValueError(f"piece {i} trains a node with no parent: nothing predicts it")
        inputs[i, :k] = torch.tensor(p.tokens)
        source[i, :k] = torch.tensor([max(q, 0) for q in p.parents])
        positions[i, :k] = torch.tensor(p.positions)
        old[i, :k] = torch.tensor(p.logprobs, dtype=torch.float32)
        adv[i, :k] = torch.tensor(p.advantages, dtype=torch.float32)
        mask[i, :k] = torch.tensor(p.mask, dtype=torch.float32)
        rows = attn[i]
        for j, q in enumerate(p.parents):
            if q >= 0:
                rows[j] |= rows[q]
    return Padded(inputs, inputs, old, adv, mask, source=source, positions=positions, attn=attn)


def padded_logits(model: Any, p: Padded) -> torch.Tensor:
    """The logits predicting ``p.targets`` (a ``Padded`` of either layout), (B, T, V)."""
    if p.attn is None:
        logits, _ = model(p.inputs)
        return logits  # type: ignore[no-any-return]
    assert p.source is not None, "a trie layout has the source of every node"
    logits, _ = model(p.inputs, positions=p.positions, attn_mask=p.attn)
    return logits.gather(1, p.source.unsqueeze(-1).expand(-1, -1, logits.shape[-1]))  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Padded:
    """Sequences as padded tensors aligned for next-token prediction."""

    inputs: torch.Tensor  # (B, T) ids fed to the model: tokens[:-1]
    targets: torch.Tensor  # (B, T) ids predicted: tokens[1:]
    old_logprobs: torch.Tensor  # (B, T) behaviour log-probs of targets
    advantages: torch.Tensor  # (B, T)
    mask: torch.Tensor  # (B, T) 1.0 on trained tokens
    # a token trie (pad_trees): inputs are the nodes and targets the
    # same ids, each predicted from its parent's logits (source), attending to its
    # ancestors only (attn, (B, T, T)), at its position in its sequences
    source: torch.Tensor | None = None
    positions: torch.Tensor | None = None
    attn: torch.Tensor | None = None


@dataclass(frozen=True)
class Packed:
    """Per-token arrays like :class:`TokenSequence`'s, possibly from several sequences."""

    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    advantages: tuple[float, ...]
    mask: tuple[int, ...]


#: Anything :func:`pad_sequences` lays out.
Trainable = TokenSequence | Packed | TreePacked


def pack_prefixes(seqs: Sequence[TokenSequence | Packed]) -> list[Packed]:
    """Merge each sequence into a longer one that starts with the same tokens (pure).

    In a tree, a segment's sequence is usually a prefix of its child segments' prompts.
    A causal model gives the same log-probs at a position whatever follows it, so one
    forward pass over the longer sequence serves both: the shorter one's trained
    tokens are marked in the longer one's (untrained) prompt part. Sequences whose
    trained positions would collide stay apart. Cuts the training compute by about the
    number of segments per rollout.
    """
    carriers: list[dict[str, list[Any]]] = []
    for s in sorted(seqs, key=lambda q: len(q.tokens), reverse=True):
        trained = [i for i, m in enumerate(s.mask) if m]
        n = len(s.tokens)
        home = None
        for c in carriers:
            if len(c["tokens"]) >= n and tuple(c["tokens"][:n]) == s.tokens and not any(c["mask"][i] for i in trained):
                home = c
                break
        if home is None:
            carriers.append(
                {
                    "tokens": list(s.tokens),
                    "logprobs": list(s.logprobs),
                    "advantages": list(s.advantages),
                    "mask": list(s.mask),
                }
            )
            continue
        for i in trained:
            home["logprobs"][i], home["advantages"][i], home["mask"][i] = s.logprobs[i], s.advantages[i], s.mask[i]
    return [
        Packed(tuple(c["tokens"]), tuple(c["logprobs"]), tuple(c["advantages"]), tuple(c["mask"])) for c in carriers
    ]


def pack_sequences(raw: Sequence[TokenSequence], packing: Literal["tree", "prefixes", "none"]) -> list[Trainable]:
    """``raw`` laid out for training as ``UpdateConfig.packing`` says (pure)."""
    if packing == "tree":
        return list(pack_trees(raw))
    return list(pack_prefixes(raw)) if packing == "prefixes" else list(raw)


def pad_sequences(seqs: Sequence[Trainable], pad_id: int) -> Padded:
    """Shift and pad ``seqs`` (pure; no model), or pieces of a token trie
    (:func:`pad_trees`). Sequences shorter than 2 tokens are refused."""
    import torch

    if not seqs:
        raise ValueError("no sequences to pad")
    trees = sum(isinstance(s, TreePacked) for s in seqs)
    if trees:
        if trees != len(seqs):
            raise ValueError("cannot pad trie pieces and plain sequences together")
        return pad_trees(seqs, pad_id)  # type: ignore[arg-type]
    short = [i for i, s in enumerate(seqs) if len(s.tokens) < 2]
    if short:
        raise ValueError(f"sequences {short[:5]} have fewer than 2 tokens: nothing to predict")
    n = max(len(s.tokens) for s in seqs) - 1
    b = len(seqs)
    inputs = torch.full((b, n), pad_id, dtype=torch.long)
    targets = torch.full((b, n), pad_id, dtype=torch.long)
    old = torch.zeros((b, n), dtype=torch.float32)
    adv = torch.zeros((b, n), dtype=torch.float32)
    mask = torch.zeros((b, n), dtype=torch.float32)
    for i, s in enumerate(seqs):
        k = len(s.tokens) - 1
        inputs[i, :k] = torch.tensor(s.tokens[:-1])
        targets[i, :k] = torch.tensor(s.tokens[1:])
        old[i, :k] = torch.tensor(s.logprobs[1:], dtype=torch.float32)
        adv[i, :k] = torch.tensor(s.advantages[1:], dtype=torch.float32)
        mask[i, :k] = torch.tensor(s.mask[1:], dtype=torch.float32)
    return Padded(inputs, targets, old, adv, mask)


def padded_logprobs(model: Any, p: Padded, temperature: float) -> torch.Tensor:
    """Log-probs of ``p.targets`` under ``model`` at ``temperature``, either layout."""
    import torch

    logp = torch.log_softmax(padded_logits(model, p).float() / temperature, dim=-1)
    return logp.gather(-1, p.targets.unsqueeze(-1)).squeeze(-1)


def token_logprobs(model: Any, inputs: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """Log-probs of ``targets`` under ``model`` at ``temperature`` (teacher forcing)."""
    import torch

    logits, _ = model(inputs)
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
