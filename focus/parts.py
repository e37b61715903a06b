"""The parts a :class:`~focus.collector.Collector` is given, checked where they are given.

A part passed as its class (``search=Selective``) or of another role failed later with
a message about something else (``Priority.resolved() missing 1 required positional
argument``, ``AttributeError: gamma``); a custom part's value the batch cannot hold
(an estimator's NaN advantage) would reach every weight a trainer updates. Both are
said here, naming the part.
"""

from __future__ import annotations

import inspect
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

from focus.agent import Agent
from focus.batch_schema import BatchError
from focus.critic import Critic
from focus.estimation import Estimator
from focus.execution import Execution
from focus.priority import Priority
from focus.tree import Tree


def check_parts(agent: Any, search: Any, critic: Any, estimator: Any, execution: Any) -> None:
    """Each part is an instance of its interface (``search`` may be ``None``: the
    default), or a :class:`TypeError` says what it is and what was expected."""
    parts = {"agent": (agent, Agent), "critic": (critic, Critic), "estimator": (estimator, Estimator)}
    parts |= {"execution": (execution, Execution), "search": (search, Priority)}
    for name, (value, interface) in parts.items():
        if isinstance(value, interface) or (name == "search" and value is None):
            continue
        what = f"the class {value.__name__}" if isinstance(value, type) else f"a {type(value).__name__}"
        hint = " (call it: an instance is a part)" if isinstance(value, type) and issubclass(value, interface) else ""
        raise TypeError(f"Collector's {name} must be an instance of {interface.__name__}, got {what}{hint}")


def bad_advantage(estimator: object, edge_id: int, tree_id: str, advantage: float) -> BatchError:
    """The error for an estimator's non-finite ``advantage`` of one segment."""
    return BatchError(
        f"{type(estimator).__name__} gave segment {edge_id} of tree {tree_id} the advantage {advantage!r}: "
        "an advantage must be a finite number (leave a segment out to give it none)"
    )


def advantages_of(estimator: Estimator, tree: Tree, values: Any, tree_id: str) -> Mapping[int, float]:
    """``estimator.advantages`` of ``tree``'s segments, or a :class:`BatchError` naming the
    estimator when it returns no mapping (a list failed with "'list' object has no attribute
    'get'"), a key that is no segment id of the tree (keys as text left every segment out
    as failed: an empty batch and no error) or a value that is no number. ``None`` is no
    number either: a segment gets no advantage by being left out (the interface's
    contract), and a ``None`` (a lookup that found nothing) dropped every segment it
    was given without a word."""
    adv = estimator.advantages(list(tree.edges.values()), values)
    name = f"{type(estimator).__name__}.advantages"
    if not isinstance(adv, Mapping):
        raise BatchError(
            f"{name} returned a {type(adv).__name__} for tree {tree_id}: it must return a dict "
            "{edge_id: advantage} (a segment left out gets no learning signal)"
        )
    if not adv.keys() <= tree.edges.keys():
        key = next(k for k in adv if k not in tree.edges)
        raise BatchError(f"{name} gave tree {tree_id} the key {key!r}, not one of its segment ids (Edge.id)")
    for key, value in adv.items():  # text was read as a number where it spelled one, else failed unnamed
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise BatchError(
                f"{type(estimator).__name__} gave segment {key} of tree {tree_id} the advantage {value!r} "
                f"({type(value).__name__}): an advantage must be a number (leave a segment out to give it none)"
            )
    return adv


def check_trees(trees: Any) -> Sequence[Tree]:
    """``trees`` if it is a sequence of trees, or a :class:`TypeError` that says what
    :meth:`~focus.collector.Collector.prepare` takes. Its commonest wrong argument is the
    search not awaited (a notebook cell without ``await``), which failed with
    "'coroutine' object is not iterable" and a warning that it was never awaited."""
    if inspect.iscoroutine(trees):
        trees.close()  # never run: no "never awaited" warning on top of the error
        raise TypeError(
            "Collector.prepare got a coroutine: `await collector.search(tasks)` first, then prepare its state"
        )
    if not isinstance(trees, Sequence) or not all(isinstance(t, Tree) for t in trees):
        kinds = sorted({type(t).__name__ for t in trees}) if isinstance(trees, (list, tuple)) else []
        what = f"a {type(trees).__name__}" + (f" of {', '.join(kinds)}" if kinds else "")
        raise TypeError(f"Collector.prepare takes the SearchState or the trees that search returns, got {what}")
    return trees
