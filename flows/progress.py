"""Progress of a long collection: transitions/s, tokens/s and budget left per phase.

On a terminal it is a rich progress bar (one per continuation phase, advanced after
every wave); elsewhere (a deployment's worker, CI, a pipe) it logs one line per wave
instead, since a redrawn bar in a log file helps no one. Whether the output is a
terminal is rich's own decision (a TTY, ``FORCE_COLOR``/``TTY_COMPATIBLE``, not
``TERM=dumb``), so the bar and the colours of the rest of the CLI agree.

Rates are over the phase's wall time as this process saw it. A resumed phase reports
its reused waves without measurements, and their transitions are already in the first
measured wave's running total, so that wave becomes the baseline of the rates instead
of inflating them. The figures are what the waves used; a phase may end slightly over
its budget (rollouts already running finish), and then shows more than its total.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any


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
        return out


def wave_figures(
    record: dict[str, Any], budget: int | None, base: tuple[int, int, float] | None, now: float
) -> WaveFigures:
    """Figures of a measured wave record against the baseline ``(transitions, tokens, time)``.

    ``base`` is ``None`` when the record itself becomes the baseline (after reused waves).
    """
    usage = record["phase_usage"]  # the phase's focus.usage.Usage, as a dict
    used_t, used_k, spent = int(usage["transitions"]), int(usage["tokens"]), int(usage["budget_spent"])
    rate_t = rate_k = None
    if base is not None:
        dt = max(now - base[2], 1e-9)
        rate_t, rate_k = (used_t - base[0]) / dt, (used_k - base[1]) / dt
    return WaveFigures(record.get("wave"), used_t, used_k, budget, spent, rate_t, rate_k)


class CollectionProgress:
    """Reports wave records (the phase's usage so far, ``phase_usage``) against its budget.

    ``console`` is the rich console to draw on (default: rich's console for stdout);
    ``log`` receives one ``info`` line per wave when that console is not a terminal.
    """

    def __init__(self, config: Any, *, enabled: bool = True, log: Any = None, console: Any = None) -> None:
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
        #: Every line shown or logged, in order (what a caller or a test can read back).
        self.lines: list[str] = []

    @property
    def interactive(self) -> bool:
        """Whether the bar is drawn (a live terminal) rather than lines logged."""
        return self._progress is not None

    def __enter__(self) -> CollectionProgress:
        if not self.enabled:
            return self
        from rich.console import Console

        console = self.console if self.console is not None else Console()
        # A dumb terminal cannot redraw a line: rich would print the bar only at the end.
        if console.is_terminal and not console.is_dumb_terminal:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                TextColumn("{task.completed:.0f}/{task.total:.0f} transitions"),
                TextColumn("{task.fields[rates]}"),
                TimeElapsedColumn(),
                console=console,
                transient=False,
            )
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def start_phase(self, index: int, phase: Any) -> None:
        self._phase = phase
        self._label = f"{index}.{phase.name}"
        self._t0 = time.perf_counter()
        self._reused = False
        self._base = None
        if self._progress is not None:
            self._task = self._progress.add_task(self._label, total=phase.transitions or 0, rates="")

    def wave_done(self, record: dict[str, Any]) -> str:
        """Update from a wave record; returns the line it shows or logs ("" for a reused wave)."""
        if "phase_usage" not in record:  # a reused wave: nothing measured
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
            self._progress.update(self._task, completed=fig.transitions, rates=fig.rates())
        elif self.enabled and self.log is not None:
            self.log.info(line)
        return line
