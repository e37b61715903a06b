"""A collection's batch is prepared and written after its last wave, with no step to
report: 2 s at 100k transitions with nothing on the console after the last wave's line.
An export that lasts over a second now says so in one line; a short one says nothing.
Time is a fake clock here: the timer the progress makes is the test's."""

from __future__ import annotations

import logging
from io import StringIO
from typing import Any

from fixtures.journal import run_collect
from rich.console import Console
from test_pipeline import small_config

from flows.logs import CONSOLE_FLAG
from flows.progress import EXPORT_LINE_AFTER_S, CollectionProgress
from tasks.journal import CheckpointJournal

LINE = "the search is done: preparing and writing the batch"


class Clock:
    """Timers that go off when the test says (``late``: as they start, the export
    having lasted past the timer's delay)."""

    def __init__(self, late: bool = False) -> None:
        self.late, self.timers = late, []

    def __call__(self, after: float, fire: Any) -> Any:
        clock = self

        class Timer:
            daemon = False
            cancelled = False

            def start(self) -> None:
                if clock.late:
                    fire()

            def cancel(self) -> None:
                self.cancelled = True

        timer = Timer()
        self.timers.append((after, fire, timer))
        return timer


class Seen(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[tuple[bool, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((bool(getattr(record, CONSOLE_FLAG, False)), record.getMessage()))


def collect(tmp_path, clock: Clock) -> tuple[Seen, CollectionProgress, CheckpointJournal]:
    cfg = small_config(str(tmp_path / "store"), "exp", progress=True)
    log = logging.getLogger(f"test.export_line.{id(clock)}")
    log.propagate, log.handlers[:] = False, [seen := Seen()]
    log.setLevel(logging.INFO)
    with CollectionProgress(cfg, log=log, console=Console(file=StringIO()), timer=clock) as progress:
        journal = CheckpointJournal(cfg, on_step=progress.step)
        run_collect(cfg, journal)
    return seen, progress, journal


def test_a_long_export_says_so_in_one_line(tmp_path):
    seen, progress, journal = collect(tmp_path, Clock(late=True))
    assert (True, LINE) in seen.lines and progress.lines.count(LINE) == 1
    # said during the export: after the last wave's line
    assert seen.lines.index((True, LINE)) > max(i for i, (_, m) in enumerate(seen.lines) if " wave " in m)


def test_a_short_export_says_nothing(tmp_path):
    clock = Clock()
    seen, progress, _ = collect(tmp_path, clock)
    [(after, fire, timer)] = clock.timers  # one timer, started as the last phase ended
    assert after == EXPORT_LINE_AFTER_S and timer.cancelled  # the export's record stopped it
    fire()  # a timer that goes off all the same (cancelled too late) says nothing
    assert LINE not in progress.lines and all(m != LINE for _, m in seen.lines)
