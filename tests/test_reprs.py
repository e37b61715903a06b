"""What a notebook shows when a cell ends with one of the library's records: short and
useful, never every token id. With a real model a prompt is thousands of ids, and the
dataclasses' own reprs printed them all, in every turn of every edge of every tree."""

from __future__ import annotations

from focus.agent import BranchState, Piece, Rollout
from focus.batch_schema import ActorRow, CriticRow
from focus.context import Context
from focus.env import Message, Task
from focus.policy import Completion
from focus.tree import Tree, Turn

PROMPT = tuple(range(4000))  # a long prompt, as a real model's chat template makes


def _turn() -> Turn:
    return Turn(PROMPT, (5, 6, 7), (-0.5, -1.0, -0.25), 1, "stop", observation="x" * 5000)


def test_a_tree_prints_as_a_summary_of_its_nodes() -> None:
    tree = Tree.new("task-1", None, PROMPT)
    mid = tree.add_node(0, (_turn(),) * 3, "checkpoint", steps=3, context_ids=PROMPT)
    tree.add_node(mid.id, (_turn(),), "terminal", steps=4)
    tree.add_node(0, (_turn(),), "failed", steps=1, cause="model service: connection refused")
    tree.rollouts = 2
    assert repr(tree) == (
        "Tree('task-1', nodes=4 (checkpoint=2, terminal=1, truncated=0, failed=1), edges=3, rollouts=2)"
    )


def test_records_that_carry_token_ids_show_the_first_ids_and_how_many_more() -> None:
    turn = _turn()
    text = repr(turn)
    assert text.startswith("Turn(prompt_ids=(0, 1, 2, 3, 4, 5, 6, 7, ...+3992 more), completion_ids=(5, 6, 7), ")
    assert "loss_mask=1, finish_reason='stop'" in text and len(text) < 600
    context = Context((Message("user", "y" * 5000),), (), PROMPT)
    state = BranchState(Task("t", {"prompt": "z" * 5000}), None, None, context)
    rollout = Rollout("t", tuple(Piece((turn,) * 20, "checkpoint", 20, PROMPT, state) for _ in range(20)))
    rows = [
        ActorRow("c", 0, "t", "t#0", 0, 0, 0, "v1", PROMPT, (5,), (-0.5,), (1,), 0.25, 1.0, "stop"),
        CriticRow("c", 0, "t", "t#0", 0, PROMPT, 0.5, 1.0, None),
        Completion(tuple(range(1000)), (-0.5,) * 1000),
    ]
    for record in (state, rollout, *rows):
        assert "...+" in repr(record) and len(repr(record)) < 20_000, type(record).__name__
    # a short record prints as the dataclass did
    assert repr(Task("t", {"target": 11})) == "Task(id='t', data={'target': 11})"
    assert repr(Message("user", "hi")) == "Message(role='user', content='hi', token_ids=None)"
