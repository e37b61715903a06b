"""What differs between the Python versions pyproject.toml allows (3.11, 3.12, 3.13) and
reached FOCUS: the rounding of ``sum()`` of floats, and the permanent generation of the
garbage collector. docs/operations.md ("Python versions") has what was run where."""

from __future__ import annotations

import builtins
import math
import subprocess
import sys

import pytest

from focus.sums import left_sum

_SUM = builtins.sum


def exactly_rounded_sum(values, start=0):  # type: ignore[no-untyped-def]
    """``sum()`` with the rounding of another interpreter: exactly rounded for floats
    (CPython 3.12+ compensates; ``math.fsum`` is the limit of that), as is for the rest."""
    items = list(values)
    if any(type(v) is float for v in items) and all(type(v) in (int, float) for v in (start, *items)):
        return math.fsum([start, *items])
    return _SUM(items, start)


def test_left_sum_adds_left_to_right_on_every_version():
    # 3.11's sum() gives 0.0 here, 3.12's 1.0 (its compensation keeps the lost 1.0)
    assert left_sum([1e16, 1.0, -1e16]) == 0.0
    assert exactly_rounded_sum([1e16, 1.0, -1e16]) == 1.0
    assert left_sum([0.1] * 10) == 0.9999999999999999 and math.fsum([0.1] * 10) == 1.0
    # integers stay integers and exact; an empty sum is the start
    assert left_sum([2**60, 1, -(2**60)]) == 1 and type(left_sum([1, 2])) is int and left_sum([]) == 0


@pytest.mark.parametrize(("kind", "seed"), [("selective", 0), ("grpo", 0)])
def test_the_pinned_batches_do_not_depend_on_how_sum_rounds(monkeypatch, kind, seed):
    """Under Python 3.12 and 3.13 every pinned batch of tests/test_search_planning.py
    came out with other advantages, critic targets and log-probs (1 to 4 units in the
    last place): the built-in ``sum()`` of floats rounds otherwise there. With another
    rounding of ``sum()`` the batch is the one pinned (on 3.11)."""
    from test_search_planning import PINNED, collection, digest

    from focus.testing import run

    monkeypatch.setattr(builtins, "sum", exactly_rounded_sum)
    col, tasks = collection(kind, seed)  # the synthetic MDPs' tables are sums too
    batch = run(col.collect(tasks))
    monkeypatch.undo()
    assert (digest(batch), len(batch.actor), len(batch.critic)) == PINNED[(kind, seed)]


def test_a_fresh_interpreter_freezes_the_heap():
    """CPython 3.12's collector keeps immortal objects in the permanent generation (375
    in a fresh 3.12.1), so ``gc.get_freeze_count()`` is never 0 there and
    ``Execution(freeze_gc=True)``, the default, took them for someone else's freeze and
    never froze (the young-collection threshold stayed at 700)."""
    code = (
        "import gc\n"
        "gc.collect()\n"
        "from focus.execution import GC_THRESHOLD_FROZEN, frozen_by_others, frozen_heap\n"
        "with frozen_heap() as froze:\n"
        "    held = (froze, frozen_by_others(), gc.get_threshold()[0] == GC_THRESHOLD_FROZEN)\n"
        "gc.collect()\n"
        "print(held, frozen_by_others())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "(True, True, True) False"


def test_someone_elses_freeze_is_left_alone():
    code = (
        "import gc\n"
        "from focus.execution import frozen_by_others, frozen_heap\n"
        "keep = [[i] for i in range(100)]\n"
        "gc.freeze()\n"
        "n = gc.get_freeze_count()\n"
        "with frozen_heap() as froze:\n"
        "    pass\n"
        "print(froze, frozen_by_others(), gc.get_freeze_count() >= n)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False True True"
