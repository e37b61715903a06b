"""A nonsense count on an example's command line is one line and exit 2, before anything runs.

``python -m examples.browse.run --questions 0`` built the corpus and stopped with
``ValueError: Collector needs at least one task``; ``--questions -3`` sliced the
questions from the end and collected on 37 of them; ``--max-tool-calls -1`` failed in
the env's constructor; ``examples.train_tinker.run --collect-toy --lr -1`` collected its
toy batch before the trainer's configuration refused the rate; argparse's own errors
(``--questions 1.5``, an unknown flag) printed its usage, three to six lines, above the
error. Every example's parser is now ``examples.common.ArgumentParser`` and its counts
``examples.common.count``.
"""

from __future__ import annotations

import importlib

import pytest

CASES = [
    (
        "examples.browse.run",
        ["--questions", "0"],
        "argument --questions: expected a whole number of at least 1, got '0'",
    ),
    ("examples.browse.run", ["--questions", "-3"], "argument --questions: expected a whole number of at least 1"),
    ("examples.browse.run", ["--questions", "1.5"], "argument --questions: expected a whole number of at least 1"),
    ("examples.browse.run", ["--rollouts-per-task", "0"], "argument --rollouts-per-task: expected a whole number"),
    ("examples.browse.run", ["--transitions", "-1"], "argument --transitions: expected a whole number of at least 0"),
    ("examples.browse.run", ["--max-tool-calls", "-1"], "argument --max-tool-calls: expected a whole number of at"),
    ("examples.browse.run", ["--max-tokens", "0"], "argument --max-tokens: expected a whole number of at least 1"),
    ("examples.browse.run", ["--bogus"], "unrecognized arguments: --bogus"),
    ("examples.math.run", ["--problems", "0", "--max-tokens", "0"], "--problems: Input should be greater than or"),
    ("examples.math.run", ["--rollouts-per-task", "x"], "argument --rollouts-per-task: invalid int value: 'x'"),
    ("examples.math.problems", ["--n", "-2"], "argument --n: expected a whole number of at least 0, got '-2'"),
    ("examples.train_tinker.run", ["--collect-toy", "--lr", "-1"], "argument --lr: expected a finite number above 0"),
    ("examples.train_tinker.run", ["--lr", "nan"], "argument --lr: expected a finite number above 0, got 'nan'"),
    ("examples.train_tinker.run", [], "give --store and --batch-url, or --collect-toy"),
    ("examples.train_local.run", ["--seeds"], "argument --seeds: expected at least one argument"),
]


@pytest.mark.parametrize(("module", "argv", "said"), CASES, ids=[f"{m.split('.')[1]}{a}" for m, a, _ in CASES])
def test_a_bad_flag_is_one_line_naming_it_and_the_help(module, argv, said, capsys):
    main = importlib.import_module(module).main
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and out.out == "", out
    assert lines[0].startswith(f"error: {said}"), lines
    assert lines[0].endswith(f"; python -m {module} -h lists the options"), lines


def test_good_counts_pass_through():
    from examples.browse.run import parser
    from examples.common import count, positive

    args = parser().parse_args(["--questions", "3", "--transitions", "0", "--max-tool-calls", "0"])
    assert (args.questions, args.transitions, args.max_tool_calls) == (3, 0, 0)
    assert count(1)("7") == 7 and positive("2e-5") == 2e-5
