"""Progress of a long collection: transitions/s, tokens/s and budget left per phase.

On a terminal it is a rich progress bar (one per continuation phase, advanced after
every wave); elsewhere (a deployment's worker, CI) it logs one line per wave instead,
since a redrawn bar in a log file helps no one. Rates are over the phase's wall time.
"""

from __future__ import annotations

import sys
import time
from typing import Any


class CollectionProgress:
    """Reports wave records (the phase's ``phase_transitions`` and ``phase_tokens``) against its budget."""

    def __init__(self, config: Any, *, enabled: bool = True, log: Any = None, console: Any = None) -> None:
        self.config = config
        self.enabled = enabled
        self.log = log
        self.console = console
        self._progress: Any = None
        self._task: Any = None
        self._phase: Any = None
        self._t0 = 0.0
        self.lines: list[str] = []

    def __enter__(self) -> CollectionProgress:
        interactive = self.console is not None or sys.stdout.isatty()
        if self.enabled and interactive:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                TextColumn("{task.completed:.0f}/{task.total:.0f} transitions"),
                TextColumn("{task.fields[rates]}"),
                TimeElapsedColumn(),
                console=self.console,
                transient=False,
            )
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def start_phase(self, index: int, phase: Any) -> None:
        self._phase = phase
        self._t0 = time.perf_counter()
        if self._progress is not None:
            total = phase.transitions or 0
            self._task = self._progress.add_task(f"{index}.{phase.name}", total=total, rates="")

    def wave_done(self, record: dict[str, Any]) -> str:
        """Update from a wave record; returns the line it shows or logs."""
        if "phase_transitions" not in record:  # a reused wave: nothing measured
            return ""
        used_t, used_k = int(record["phase_transitions"]), int(record.get("phase_tokens", 0))
        dt = max(time.perf_counter() - self._t0, 1e-9)
        budget = self._phase.transitions if self._phase is not None else None
        left = "" if budget is None else f", budget left {max(budget - used_t, 0)}"
        line = f"wave {record.get('wave')}: {used_t / dt:.1f} transitions/s, {used_k / dt:.0f} tokens/s{left}"
        self.lines.append(line)
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=min(used_t, budget or used_t), rates=line.split(": ", 1)[1])
        elif self.enabled and self.log is not None:
            self.log.info(line)
        return line
