"""Helpers the example runs share: which model server to talk to, and a solve rate."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from focus.format import ByteCodec, ChatCodec
from focus.tree import Tree


@contextlib.contextmanager
def model_server(url: str | None) -> Iterator[str]:
    """``url`` when given; otherwise the embedded tiny model, started for the block."""
    if url:
        yield url
        return
    from focus.backends import LocalModelServer

    with LocalModelServer() as server:
        yield server.url


def make_codec(tokenizer: str | None) -> ChatCodec:
    """ChatML over a local ``tokenizer.json`` when given, else the tiny model's byte codec."""
    if tokenizer:
        from focus.hf_codec import HFChatCodec

        return HFChatCodec(tokenizer)
    return ByteCodec()


def solve_rate(trees: list[Tree]) -> float:
    """Share of finished rollouts (non-failed leaves) whose path earned a reward."""
    leaves = [(t, n) for t in trees for n in t.leaves() if n.kind != "failed"]
    if not leaves:
        return 0.0
    solved = sum(1 for t, n in leaves if any(r > 0 for e in t.path_to(n.id) for r in e.rewards))
    return solved / len(leaves)
