"""Progress of a collection: a bar per phase, transitions/s, tokens/s and budget left.

On a terminal it is a rich progress bar per phase - the evidence phase (advanced as its
rollouts finish, :meth:`CollectionProgress.rollout_done`, and filled from its step
record) and each continuation phase (advanced after every wave); elsewhere (a
deployment's worker, CI, a pipe) it logs lines instead, since a redrawn bar in a log
file helps no one: of the evidence phase its first rollout's, one each time another
tenth of its rollouts is done and one at least every :data:`LOG_EVERY_S` seconds while
rollouts finish, then its step's; of a continuation phase its first wave's, one each
time another tenth of its budget is spent (:data:`LOG_STEPS`), one at least every
:data:`LOG_EVERY_S` seconds while waves land, and every wave's once the budget is spent.
A line per wave was 4,137 lines for 100k transitions over 2,000 tasks at the default
wave size. The batch's preparation and write after the last phase, over a second,
says so in one line (:meth:`CollectionProgress.exporting`). Rollouts reach the evidence bar only from an execution that runs them in
this process (:meth:`focus.execution.Execution.observe_rollouts`); on Dask the bar fills
when the evidence step ends.
Whether the output is a terminal is rich's own decision (a TTY, ``FORCE_COLOR``/
``TTY_COMPATIBLE``, not ``TERM=dumb``), so the bar and the colours of the rest of the CLI
agree. Bars and lines go to standard error, so ``focus collect --json`` keeps standard
output for the result. A step whose rollouts failed adds a WARNING line naming how many
and why, on the console and in the run's Prefect log.

Rates are over the phase's wall time as this process saw it. A resumed phase reports
its reused waves without measurements, and their transitions are already in the first
measured wave's running total, so that wave becomes the baseline of the rates instead
of inflating them. The figures are what the waves used; a phase may end slightly over
its budget (rollouts already running finish), and then shows more than its total.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from flows.logs import console_extra
from focus.usage import Usage
from tasks.records import StepRecord

if TYPE_CHECKING:
    import logging

    from rich.console import Console

    from focus.execution import Execution
    from focus.priority import Phase
    from tasks.config import FocusConfig

_CONSOLE: Any = None
#: A continuation phase logs a wave's line each time another 1/LOG_STEPS of its budget is spent ...
LOG_STEPS = 10
#: ... or this many seconds after its last line, whichever comes first.
LOG_EVERY_S = 60.0
#: A batch's preparation and write that lasts longer than this says so in one line.
EXPORT_LINE_AFTER_S = 1.0


def console() -> Console:
    """The process's rich console on standard error (bars and log lines share it, so
    lines print above a live bar instead of through it)."""
    global _CONSOLE
    if _CONSOLE is None:
        from rich.console import Console

        _CONSOLE = Console(stderr=True)
    return _CONSOLE


def count_text(done: int, total: int | None, unit: str) -> str:
    """``done/total unit``; a phase that ended past its budget (rollouts already running
    finish) says so instead of showing more done than its total (pure)."""
    if not total:
        return f"{done} {unit}"
    if done > total:
        return f"{done} {unit} (budget {total})"
    return f"{done}/{total} {unit}"


def time_left(seconds: float) -> str:
    """``about 40 s left``, ``about 12 min left``, ``about 2.5 h left``: what the rate
    so far gives for the rest (a 50,000-task evidence phase logged its rate alone, and
    the operator divided)."""
    if seconds < 90:
        return f"about {seconds:.0f} s left"
    if seconds < 5400:
        return f"about {seconds / 60:.0f} min left"
    return f"about {seconds / 3600:.1f} h left"


def failure_line(label: str, record: StepRecord) -> str | None:
    """The WARNING line for a step whose rollouts failed (``None`` if none did): how many,
    their causes and, as the library's line (:func:`focus.statistics.warn_failures`), the
    last one's task and step, which no cause names."""
    failed = record.failed_rollouts
    if not failed:
        return None
    total = record.rollouts
    causes = "; ".join(f"{c} (x{n})" for c, n in record.failure_causes.items())
    of = f" of {total}" if total else ""
    last = ""
    if record.last_failure is not None:
        task, step, cause = record.last_failure
        last = f"; last cause (task {task!r}, step {step}): {cause}"
    return f"{label}: {failed}{of} rollouts failed: {causes or 'cause unknown'}{last}"


@dataclass(frozen=True)
class WaveFigures:
    """What one wave record says about its phase so far (a pure function of the record)."""

    wave: Any
    transitions: int
    tokens: int
    budget: int | None
    #: Budget spent as the planner counts it (at least one transition per rollout).
    spent: int
    #: Transitions and tokens per second since the baseline; ``None`` for the baseline itself.
    transitions_per_s: float | None
    tokens_per_s: float | None

    @property
    def budget_left(self) -> int | None:
        return None if self.budget is None else max(self.budget - self.spent, 0)

    def rates(self) -> str:
        """The part of the line the bar shows next to its count."""
        if self.transitions_per_s is None or self.tokens_per_s is None:
            out = "rates from the next wave (resumed)"
        else:
            out = f"{self.transitions_per_s:.1f} transitions/s, {self.tokens_per_s:.0f} tokens/s"
        if self.budget_left is not None:
            out += f", budget left {self.budget_left}"
            if self.budget_left and self.transitions_per_s:
                out += f", {time_left(self.budget_left / self.transitions_per_s)}"
        return out


def wave_figures(
    record: StepRecord, budget: int | None, base: tuple[int, int, float] | None, now: float
) -> WaveFigures:
    """Figures of a measured wave record against the baseline ``(transitions, tokens, time)``.

    ``base`` is ``None`` when the record itself becomes the baseline (after reused waves).
    """
    usage = record.phase_usage or Usage()  # the phase's usage so far
    used_t, used_k, spent = usage.transitions, usage.tokens, usage.budget_spent
    rate_t = rate_k = None
    if base is not None:
        dt = max(now - base[2], 1e-9)
        rate_t, rate_k = (used_t - base[0]) / dt, (used_k - base[1]) / dt
    return WaveFigures(record.wave, used_t, used_k, budget, spent, rate_t, rate_k)


class CollectionProgress:
    """Reports step records: the evidence step's, then each wave's (the phase's usage so
    far, ``phase_usage``) against its budget.

    ``console`` is the rich console to draw on (default: :func:`console`, standard
    error); ``log`` receives one ``info`` line per step when that console is not a
    terminal, and a ``warning`` for every step whose rollouts failed.
    """

    def __init__(
        self,
        config: FocusConfig | None,
        *,
        enabled: bool = True,
        log: logging.Logger | logging.LoggerAdapter[Any] | None = None,
        console: Console | None = None,
        timer: Callable[[float, Callable[[], None]], Any] = threading.Timer,
    ) -> None:
        self.config = config
        self.enabled = enabled
        self.log = log
        self.console = console
        self._progress: Any = None
        self._task: Any = None
        self._phase: Any = None
        self._label = ""
        self._t0 = 0.0
        self._reused = False
        self._base: tuple[int, int, float] | None = None
        #: The phase's last logged wave line: (tenths of the budget spent, time); ``None``: none yet.
        self._logged: tuple[int, float] | None = None
        #: While the evidence phase runs: its rollouts in all and those done so far.
        self._evidence: tuple[int, int] | None = None
        #: Every line computed, in order, whether the bar showed it or the log took it
        #: (what a caller or a test can read back; an evidence rollout's line is returned, not kept).
        self.lines: list[str] = []
        #: Makes the timer of :meth:`exporting` (``threading.Timer``'s signature; a test's fake clock).
        self.timer = timer
        self._export_timer: Any = None

    @property
    def interactive(self) -> bool:
        """Whether the bar is drawn (a live terminal) rather than lines logged."""
        return self._progress is not None

    def __enter__(self) -> CollectionProgress:
        if not self.enabled:
            return self
        console_ = self.console if self.console is not None else console()
        # A dumb terminal cannot redraw a line: rich would print the bar only at the end.
        if console_.is_terminal and not console_.is_dumb_terminal:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
            from rich.table import Column

            # the rates wrap on a narrow terminal rather than push the time off the line
            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(bar_width=12),
                TextColumn("{task.fields[count]}"),
                TextColumn("{task.fields[rates]}", table_column=Column(overflow="fold", ratio=1)),
                TimeElapsedColumn(),
                console=console_,
                transient=False,
            )
            self._progress.start()
        if self.config is not None and (first := self.config.search.phases[0]).is_evidence:
            self.start_evidence(first, self.config.env.n_tasks * (first.rollouts_per_task or 1))
        return self

    def __exit__(self, *exc: object) -> None:
        self._exported()
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def step(self, record: StepRecord) -> None:
        """Show one step of the collection as it ends (a :class:`tasks.journal.CheckpointJournal`'s
        ``on_step``): the evidence bar filled, a wave's figures, the next phase's bar
        started when the one before it ends."""
        phases = self.config.search.phases if self.config is not None else []
        if record.kind == "config":  # the first step, once the lease is held
            self.restart_evidence_clock()
        elif record.kind == "evidence" and phases and phases[0].is_evidence:
            self.evidence_done(record)
        elif record.kind == "wave":
            self.wave_done(record)
        elif record.kind == "export":
            self._exported()
        elif record.kind in ("evidence_scores", "phase_end"):
            nxt = record.phase_index + 1
            if nxt < len(phases):
                self.start_phase(nxt, phases[nxt])
            else:  # the last phase ended: the batch is prepared and written next
                self.exporting()

    def exporting(self) -> None:
        """The search is done (its last phase's end recorded), and the batch is prepared
        and written: nothing showed for those seconds (2 s at 100k transitions, the last
        wave's line the last word); one that lasts over :data:`EXPORT_LINE_AFTER_S` now
        says so in one line, a short one says nothing. It ends with the ``export`` step's
        record (:meth:`step`) or the progress's end."""
        if not self.enabled:
            return
        self._exported()
        timer = self._export_timer = self.timer(EXPORT_LINE_AFTER_S, lambda: self._export_slow(timer))
        timer.daemon = True
        timer.start()

    def _export_slow(self, timer: Any) -> None:
        if self._export_timer is not timer:  # the export ended (or another began) first
            return
        line = "the search is done: preparing and writing the batch"
        self.lines.append(line)
        if self._progress is not None:
            self._progress.console.print(line, markup=False, highlight=False)
        elif self.log is not None:
            self.log.info(line, extra=console_extra())

    def _exported(self) -> None:
        timer, self._export_timer = self._export_timer, None
        if timer is not None:
            timer.cancel()

    def start_phase(self, index: int, phase: Phase) -> None:
        self._evidence = None
        self._phase = phase
        self._label = f"{index}.{phase.name}"
        self._t0 = time.perf_counter()
        self._reused = False
        self._base = None
        self._logged = None
        if self._progress is not None:
            total = phase.transitions or 0
            self._task = self._progress.add_task(
                self._label, total=total, rates="", unit="transitions", count=count_text(0, total, "transitions")
            )

    def start_evidence(self, phase: Phase, rollouts: int) -> None:
        """The evidence phase: ``rollouts`` complete rollouts, advanced by :meth:`rollout_done`
        and filled when its step ends."""
        self._phase = phase
        self._label = f"0.{phase.name}"
        self._t0 = time.perf_counter()
        self._logged = None
        self._evidence = (rollouts, 0)
        if self._progress is not None:
            self._task = self._progress.add_task(
                self._label, total=rollouts, rates="running", unit="rollouts", count=count_text(0, rollouts, "rollouts")
            )

    def restart_evidence_clock(self) -> None:
        """The collection's first step (its configuration checked, once the lease is
        held): the evidence's clock starts here, not when the command began, so its rates
        do not count a wait for another host's lease (30 s and more); a bar's elapsed
        time starts again with it."""
        if self._evidence is None:
            return
        self._t0 = time.perf_counter()
        if self._progress is not None and self._task is not None:
            self._progress.reset(self._task, completed=self._evidence[1])

    def execution(self) -> Execution:
        """The execution service the configuration describes
        (:func:`tasks.collect.make_execution`), this progress observing its rollouts."""
        from tasks.collect import make_execution

        if self.config is None:
            raise ValueError("a progress without a configuration describes no execution")
        execution = make_execution(self.config.execution)
        execution.observe_rollouts(self.rollout_done)
        return execution

    def rollout_done(self, _rollout: object = None) -> str | None:
        """One rollout finished (an execution's observer,
        :meth:`focus.execution.Execution.observe_rollouts`): while the evidence phase
        runs, its bar advances, or the line is logged when due (see the module docs);
        returns the line, ``None`` outside the evidence phase (a wave's record reports
        its rollouts; the evidence's record may come after the next phase's first ones)."""
        if self._evidence is None or self._evidence[1] >= self._evidence[0] or not self.enabled:
            return None  # past the evidence's rollouts: the next phase's, started before its record
        total, done = self._evidence[0], self._evidence[1] + 1
        self._evidence = (total, done)
        now = time.perf_counter()
        per_s = done / max(now - self._t0, 1e-9)
        # no guess from the first rollouts: the rate climbs until the concurrency is full
        # (the first line said "about 7 min left" of an evidence phase that took 3 s)
        sure = done < total and done > 1 and done * 100 >= total
        rate = f"{per_s:.1f} rollouts/s" + (f", {time_left((total - done) / per_s)}" if sure else "")
        line = f"{self._label}: {count_text(done, total, 'rollouts')}, {rate}"
        if self._progress is not None and self._task is not None:
            count = count_text(done, total, "rollouts")
            self._progress.update(self._task, completed=done, count=count, rates=f"running, {rate}")
        elif self.log is not None and done < total:  # the last one's line is the step's
            if self._due(done * LOG_STEPS // max(total, 1), now):
                self.log.info(line, extra=console_extra())
        return line

    def evidence_done(self, record: StepRecord) -> str:
        """Fill the evidence bar from its step record; returns the line it shows or logs."""
        self._evidence = None
        usage = record.usage
        if record.reused or usage is None:  # reused: nothing measured in this process
            line = f"{self._label}: reused from storage"
            rates = "reused from storage"
            done = None
        else:
            dt = max(time.perf_counter() - self._t0, 1e-9)
            n = record.rollouts
            transitions, tokens = usage.transitions, usage.tokens
            rates = f"{transitions} transitions, {transitions / dt:.1f} transitions/s, {tokens / dt:.0f} tokens/s"
            line = f"{self._label}: {n} rollouts, {rates}"
            done = n
        self._show(line, rates, done)
        self.warn_failures(self._label, record)
        return line

    def warn_failures(self, label: str, record: StepRecord) -> str | None:
        """Log a WARNING (console and the run's log) when a step's rollouts failed, and
        one naming the tasks it found over the model's context at their opening prompt
        (left out of the collection; their rollouts are not in the first line)."""
        line = failure_line(label, record)
        for warning in (line, f"{label}: {record.left_out}" if record.left_out else None):
            if warning is not None:
                self.lines.append(warning)
                if self.log is not None:
                    self.log.warning(warning, extra=console_extra())
        return line

    def _show(self, line: str, rates: str, completed: int | None) -> None:
        self.lines.append(line)
        if self._progress is not None and self._task is not None:
            update: dict[str, Any] = {"rates": rates}
            if completed is not None:
                update["completed"] = completed
                update["total"] = max(completed, 1)
            else:
                update["completed"] = next(t.total for t in self._progress.tasks if t.id == self._task)
            update["count"] = count_text(
                int(update["completed"]), int(update.get("total") or update["completed"]), "rollouts"
            )
            self._progress.update(self._task, **update)
        elif self.enabled and self.log is not None:
            self.log.info(line, extra=console_extra())

    def wave_done(self, record: StepRecord) -> str:
        """Update from a wave record; returns the line it shows or logs ("" for a reused wave)."""
        if record.reused:  # nothing measured
            self._reused = self._reused or self._base is None
            return ""
        now = time.perf_counter()
        if self._base is None and not self._reused:
            self._base = (0, 0, self._t0)
        budget = self._phase.transitions if self._phase is not None else None
        fig = wave_figures(record, budget, self._base, now)
        if self._base is None:
            self._base = (fig.transitions, fig.tokens, now)
        line = f"{self._label} wave {fig.wave}: {fig.transitions} transitions, {fig.rates()}"
        self.lines.append(line)
        if self._progress is not None and self._task is not None:
            count = count_text(fig.transitions, budget, "transitions")
            self._progress.update(self._task, completed=fig.transitions, rates=fig.rates(), count=count)
        elif self.enabled and self.log is not None and self._log_due(fig, now):
            self.log.info(line, extra=console_extra())
        self.warn_failures(f"{self._label} wave {fig.wave}", record)
        return line

    def _log_due(self, fig: WaveFigures, now: float) -> bool:
        """Whether a wave's line goes to the log (see the module docs); notes it if so."""
        tenths = fig.spent * LOG_STEPS // fig.budget if fig.budget else 0
        return self._due(tenths, now, force=fig.budget_left == 0)

    def _due(self, tenths: int, now: float, force: bool = False) -> bool:
        """Whether a line is due: the phase's first, another tenth done, a minute since the
        last, or ``force``; notes it if so (waves and evidence rollouts share the rule)."""
        last = self._logged
        due = force or last is None or tenths > last[0] or now - last[1] >= LOG_EVERY_S
        if due:
            self._logged = (tenths, now)
        return due
