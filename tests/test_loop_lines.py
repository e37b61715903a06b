"""What a rerun of a train loop says about the steps it reuses from its records.

A rerun of a finished loop said, by default, four lines per iteration for work it did
not do (``iteration 0: collect ...``, ``trained ... (recorded)``, ``publish version
...``, ``held-out success ... (recorded)``). It now says one line; the held lines go to
the log file (the console with ``-v``). A loop resumed or extended says one line for
the iterations it reuses, then the lines of the work it does."""

from __future__ import annotations

import asyncio
import logging
from io import StringIO

import pytest
from rich.console import Console
from test_train_watch import small

from flows.logs import CONSOLE_FLAG
from flows.loop_progress import LoopProgress


class Lines(logging.Handler):
    """The log records of a loop's progress: (shown on a quiet console, message)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[bool, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append((bool(getattr(record, CONSOLE_FLAG, False)), record.getMessage()))

    def shown(self) -> list[str]:
        return [m for shown, m in self.seen if shown]


def progress(tmp_path, name: str, **extra: object) -> tuple[LoopProgress, Lines]:
    log = logging.getLogger(f"test.loop_lines.{name}")
    log.propagate = False
    lines = Lines()
    log.handlers[:] = [lines]
    log.setLevel(logging.INFO)
    show = LoopProgress(small(tmp_path, **extra), enabled=True, console=Console(file=StringIO()), log=log)
    return show, lines


def reused_iteration(show: LoopProgress, i: int) -> None:
    """The calls :func:`flows.loop._run_loop` makes for an iteration whose steps are all recorded."""
    show.evaluated(i, {"success_rate": 0.25, "reused": True})
    show.stage(i, "collect", f"w-it{i}", recorded=True)
    with show.training(i, fresh=False):
        pass
    show.trained(i, {"metrics": {"train_steps": 1.0, "train_loss": 0.5}, "reused": True})
    show.published(i, {"policy_version": f"p{i + 1}"}, loaded=False)


def test_a_finished_loop_says_so_in_one_line(tmp_path):
    show, lines = progress(tmp_path, "finished")
    for i in (0, 1):
        reused_iteration(show, i)
    show.evaluated(2, {"success_rate": 0.5, "reused": True})
    show.release()
    assert lines.shown() == [
        "train loop w: finished, nothing to do: iterations 0-1 and the evaluations of versions 0-2 recorded"
    ]
    # each step's line is in the log file still (and on the console with -v)
    held = [m for shown, m in lines.seen if not shown]
    assert len(held) == 9 and "iteration 1: trained 1 step, loss 0.5 (recorded)" in held, held


def test_a_resumed_loop_says_what_it_reused_in_one_line_then_its_work(tmp_path):
    show, lines = progress(tmp_path, "resumed")
    reused_iteration(show, 0)
    show.evaluated(1, {"success_rate": 0.5, "reused": True})
    show.stage(1, "collect", "w-it1", recorded=True)  # its collection finished, its training not
    with show.training(1, fresh=True):
        pass
    show.trained(1, {"metrics": {"train_steps": 1.0}, "wall_s": 2.0})
    show.published(1, {"policy_version": "p2"}, loaded=True)
    show.evaluated(2, {"success_rate": 0.75})
    show.release()
    assert lines.shown() == [
        "iteration 0 and the evaluation of version 0: recorded, reused",
        "version 1: held-out success 0.500 (recorded)",  # the step before the one that runs: said as it is
        "iteration 1: collect w-it1",
        "iteration 1: train with the local trainer",
        "iteration 1: trained 1 step (2.0 s)",
        "iteration 1: publish version 2 (p2), loaded by the model server",
        "version 2: held-out success 0.750",
    ]


def test_the_reused_steps_in_a_few_words():
    from flows.loop_progress import recorded_span

    assert recorded_span([(2, "collection", "")]) == "iteration 2's collection"
    held = [(0, "collection", ""), (0, "training", ""), (2, "collection", ""), (2, "training", "")]
    assert recorded_span([*held, (3, "evaluation", "")]) == "iterations 0, 2 and the evaluation of version 3"


@pytest.mark.integration  # the embedded model server
@pytest.mark.timeout(300)
def test_a_rerun_of_a_real_finished_loop_says_one_line(tmp_path):
    """The loop itself marks a finished collection as recorded (`stage(..., recorded=)`)."""
    from flows.loop import LoopSteps, run_loop

    cfg = small(tmp_path, **{"train.iterations": 1})
    asyncio.run(run_loop(cfg, LoopSteps(), LoopProgress(cfg, enabled=False)))
    show, lines = progress(tmp_path, "real", **{"train.iterations": 1})
    asyncio.run(run_loop(show.config, LoopSteps(), show))
    assert lines.shown() == [
        "train loop w: finished, nothing to do: iteration 0 and the evaluations of versions 0-1 recorded"
    ], lines.seen


def test_an_update_that_took_no_step_says_so_and_why_where_it_is_known(tmp_path):
    """A batch whose every advantage is 0 trains no step (``focus.train_local``): the line
    said ``iteration 1: trained, loss 0, kl 0 (2.0 s)``, as if a step had been taken."""
    show, lines = progress(tmp_path, "no_step")
    flat = {"train_steps": 0.0, "train_tokens": 12.0, "train_advantage_mean": 0.0, "train_advantage_std": 0.0}
    show.trained(1, {"metrics": {**flat, "train_loss": 0.0}, "wall_s": 2.0})
    show.trained(2, {"metrics": {**flat, "train_advantage_std": 1.6e-10, "train_loss": 0.0}, "wall_s": 2.0})
    show.trained(3, {"metrics": {**flat, "train_advantage_std": 0.5, "train_loss": 0.0}, "wall_s": 2.0})
    show.release()
    why = "no step (every advantage 0, to rounding: nothing to learn)"
    assert lines.shown() == [
        f"iteration 1: trained {why}, loss 0 (2.0 s)",
        f"iteration 2: trained {why}, loss 0 (2.0 s)",  # a collected batch's: critic predictions' float32 rounding
        "iteration 3: trained no step, loss 0 (2.0 s)",
    ]
