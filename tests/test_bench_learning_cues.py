"""benchmarks/learning_cues.py and learning_ceiling.py (issue 32): which turn decides on a
cued task and whether its digit is right, the batch counts and masses, the oracle
credit, and the oracle policy's digits and log-probs."""

from __future__ import annotations

import asyncio

import pytest

from benchmarks.learning_cues import cue_stats, decisive, judged
from focus.batch import ActorRow, Batch
from focus.env import Message
from focus.format import ByteCodec

CODEC = ByteCodec()


def _row(task_id, messages, digit, adv, edge):
    prompt, done = tuple(CODEC.render(messages)), (ord(digit), ByteCodec.EOT)
    return ActorRow("c", 0, task_id, f"{task_id}#0", 0, edge, 0, "v0", prompt, done, (-1.0, -0.1), (1, 1), adv, 0.0,
                    "stop")  # fmt: skip


def test_decisive_steps_and_right_digits_of_each_cued_task():
    early = "Corridor of 3. Step 1: 4-6."
    late = "Corridor of 3. Step 1: 1-3.2Step 2: 1-3.5Step 3: 4-6."
    assert decisive("cued-corridor-early", early) == (1, 4, 6)
    assert decisive("cued-corridor-early", late) is None  # step 3 is not its gate
    assert decisive("cued-corridor-late", late) == (3, 4, 6)
    assert decisive("cued-corridor-late", early) is None
    assert decisive("cued-bridge", "Bridge of 4. Plank 1: not 3.5Plank 2: not 7.") == (2, 7, 7)
    assert judged("cued-corridor-early", (1, 4, 6), 5) == (True, False)
    assert judged("cued-corridor-early", (1, 4, 6), 2) == (False, False)  # the other block: the cue decides
    assert judged("cued-corridor-early", (1, 4, 6), 8) == (False, True)  # wrong whatever the cue
    assert judged("cued-bridge", (2, 7, 7), 7) == (False, False)
    assert judged("cued-bridge", (2, 7, 7), 9) == (False, True)
    assert judged("cued-bridge", (2, 7, 7), 1) == (True, False)


def test_cue_stats_counts_contrasts_per_task_and_signs_the_masses():
    gate_a = [Message("user", "Corridor of 2. Step 1: 1-3.")]
    gate_b = [Message("user", "Corridor of 2. Step 1: 4-6.")]
    after = [*gate_a, Message("assistant", "2"), Message("user", "Step 2: 4-6.")]
    rows = [
        _row("a", gate_a, "2", 1.0, 1),  # right: +1 x 2 tokens to the cue mass
        _row("a", gate_a, "5", -1.0, 2),  # wrong by the cue: +2 to the cue mass, and to the cue-wrong mass
        _row("a", gate_a, "8", -0.5, 3),  # wrong whatever the cue: +1 to the constant mass
        _row("a", after, "9", 0.5, 4),  # not decisive: only in the total
        _row("b", gate_b, "4", 1.0, 5),  # task b: right only, no contrast
    ]
    s = cue_stats("cued-corridor-early", Batch("c", 0, rows, stats={"transitions": 5}))
    total = 2 * (1 + 1 + 0.5 + 0.5 + 1)
    assert s["decisive_states"] == 2 and s["contrast_states"] == 1 and s["contrast_contexts"] == 1
    assert s["per_100"] == 20.0
    assert s["cue_mass"] == pytest.approx((2 + 2 + 2) / total, abs=1e-4)
    assert s["cue_wrong_mass"] == pytest.approx(2 / total, abs=1e-4)
    assert s["constant_mass"] == pytest.approx(1 / total, abs=1e-4)
    assert s["right_share"] == pytest.approx(2 / 3, abs=1e-4)


def test_decisive_credit_puts_plus_and_minus_one_on_the_gate_only():
    from benchmarks.learning_ceiling import decisive_credit

    gate = [Message("user", "Corridor of 2. Step 1: 1-3.")]
    after = [*gate, Message("assistant", "2"), Message("user", "Step 2: 4-6.")]
    rows = [_row("a", gate, "3", 0.7, 1), _row("a", gate, "6", 0.7, 2), _row("a", after, "1", 0.7, 3)]
    got = decisive_credit("cued-corridor-early", Batch("c", 0, rows))
    assert [r.advantage for r in got.actor] == [1.0, -1.0, 0.0]


def test_the_oracle_says_right_or_wrong_digits_with_the_model_s_log_probs():
    pytest.importorskip("torch")
    from benchmarks.learning_ceiling import OraclePolicy
    from focus.policy import SamplingParams
    from focus.tinylm.model import load

    model = load()
    prompt = CODEC.render([Message("user", "Corridor of 3. Step 1: 4-6.")])
    right = OraclePolicy(model, "cued-corridor-early", wrong=0.0)
    wrong = OraclePolicy(model, "cued-corridor-early", wrong=1.0)
    for seed in range(6):
        params = SamplingParams(max_tokens=4).with_seed(seed)
        a = asyncio.run(right.sample(prompt, params))
        b = asyncio.run(wrong.sample(prompt, params))
        assert chr(a.token_ids[0]) in "456" and chr(b.token_ids[0]) in "123789"
        assert a.token_ids[1] == ByteCodec.EOT
        assert a.logprobs == tuple(right.logprobs(prompt, list(a.token_ids)))
        assert all(lp < 0 for lp in a.logprobs)


def test_supervised_steps_on_the_gate_move_the_held_out_probabilities():
    """``--supervised``: a few Adam steps toward the range named at the gate already
    take mass off 7-9 at held-out gates (the constant part, learned first), and the
    record keeps the probabilities every ``every`` steps; the ceiling's table skips it."""
    pytest.importorskip("torch")
    from benchmarks.learning_ceiling import supervised_gate, table

    run = supervised_gate("cued-corridor-early", 0, steps=6, lr=3e-3, n_train=8, eval_tasks=6, scratch=False, every=3)
    points = run["points"]
    assert [p["step"] for p in points] == [0, 3, 6]
    assert points[-1]["p_789"] < points[0]["p_789"] - 0.05
    assert all(0.99 <= p["p_right"] + p["p_other"] + p["p_789"] <= 1.0 + 1e-6 for p in points[:1])
    assert all(p["loss"] > 0 for p in points[1:])
    assert table([run], 0.8) == ""


def test_supervised_gate_refuses_a_task_whose_gate_is_not_the_opening():
    from benchmarks.learning_ceiling import supervised_gate

    with pytest.raises(SystemExit, match="only cued-corridor-early"):
        supervised_gate("cued-corridor-late", 0, steps=1, lr=1e-3, n_train=2, eval_tasks=2, scratch=False, every=1)
