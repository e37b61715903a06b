"""The exploration draw of a continuation slot (:func:`explore_draw`), a fixed hash.

Split from :mod:`focus.priority`, which compares it with the exploration rate
(:func:`focus.priority.explores`), so that the noise fit (:mod:`focus.noise_probe`), which
reads which slots were drawn, does not import the priorities. Pure.
"""

from __future__ import annotations

import hashlib


def explore_draw(tree_index: int, node_id: int, branch: int) -> float:
    """The uniform draw in [0, 1) that :func:`focus.priority.explores` compares with the rate."""
    if type(tree_index) is int and type(node_id) is int and type(branch) is int:
        # the tuple's repr written out (the same text for ints, without building and
        # walking a tuple: a ranking rebuild draws for about 100,000 slots)
        text = f"('explore', {tree_index}, {node_id}, {branch})"
    else:
        text = repr(("explore", tree_index, node_id, branch))
    digest = _blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2.0**64


_blake2b = hashlib.blake2b
