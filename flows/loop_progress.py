"""What a train loop shows while it runs, and the picture it leaves.

On a terminal (rich's decision, as for the collection's bars, :mod:`flows.progress`)
each stage of an iteration is a live line on standard error: the collection with its
bars (:class:`flows.progress.CollectionProgress`), training with its steps and loss,
publishing the new version, evaluating it episode by episode - each redrawn with its
elapsed time, so something moves at least once a second. A row of the table of
versions prints as soon as a version is evaluated. Elsewhere (a pipe, a log file, a
deployment's worker) each stage is one line on standard error and in the log file, as
``focus collect`` prints its waves into a pipe (``nohup focus train > out 2>&1``
showed nothing for the hours a loop ran, until its table); with ``progress = false``
nothing. Either way, whenever a version is evaluated the held-out success per version
is drawn into ``weights/<run>/success.png`` beside the weights (its values also in the
PNG's ``focus`` text field, for a reader that checks them).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

    from tasks.config import FocusConfig

#: The table of versions: (header, width); 2 spaces between columns, 77 in all.
COLUMNS = (
    ("version", 7),
    ("policy version", 16),
    ("success", 7),
    ("return", 7),
    ("transitions", 11),
    ("loss", 9),
    ("reused", 6),
)
PICTURE = "success.png"
#: One JSON line per iteration (:func:`metrics_row`), beside the weights.
METRICS = "metrics.jsonl"
#: The collection's figures a metrics row carries (those it has), as the batch's stats
#: hold them: ``parse_errors`` and ``tool_errors`` are the rollouts' usage records summed
#: once there (:class:`focus.usage.Usage`), not counted again here.
STAT_FIELDS = (
    "transitions",
    "rollouts",
    "failed_rollouts",
    "truncated_rollouts",
    "parse_errors",
    "tool_errors",
    "tokens",
    "actor_rows",
)


def row_cells(record: dict[str, Any]) -> list[str]:
    """The table's cells for one iteration record (pure): its version, the policy
    version that sampled it, held-out success, the batch's mean return (its rollouts
    from the root: on-policy), the transitions collected, the training loss on them,
    whether the training was reused."""
    tr = record.get("train") or {}
    ev = record.get("eval")
    loss = (tr.get("metrics") or {}).get("train_loss")
    ret = (record.get("stats") or {}).get("return_mean")
    return [
        str(record["iteration"]),
        str(record.get("policy_version")),
        f"{ev['success_rate']:.3f}" if ev else "-",
        f"{ret:.3f}" if ret is not None else "-",
        str((record.get("stats") or {}).get("transitions", "-")),
        f"{loss:.4g}" if loss is not None else "-",
        "yes" if tr.get("reused") else ("no" if tr else "-"),
    ]


def row_line(cells: list[str]) -> str:
    """One line of the table (a policy version longer than its column is kept whole)."""
    return "  ".join(c.rjust(w) for c, (_, w) in zip(cells, COLUMNS, strict=True))


def header_line() -> str:
    return row_line([h for h, _ in COLUMNS])


def metrics_row(record: dict[str, Any]) -> dict[str, Any]:
    """One iteration's figures as one flat JSON object (pure), a line of
    ``weights/<run>/metrics.jsonl``: the collection's (``return_mean``, ``transitions``,
    ``collect_wall_s``...), every metric the trainer returned (``train_*``,
    ``critic_*``), ``train_wall_s``, and held-out ``eval_*``. Only recorded figures, so
    a resumed loop writes the same lines as one that never stopped."""
    stats, tr, ev = record.get("stats") or {}, record.get("train") or {}, record.get("eval") or {}
    row: dict[str, Any] = {k: record.get(k) for k in ("run_id", "iteration", "policy_version")}
    row |= {k: stats[k] for k in ("return_mean", "evidence_rollouts", *STAT_FIELDS) if k in stats}
    if "wall_s" in stats:
        row["collect_wall_s"] = stats["wall_s"]
    if tr:
        row |= {"trained_policy_version": tr.get("policy_version"), **(tr.get("metrics") or {})}
        row["train_wall_s"] = tr.get("wall_s")
    if ev:
        row |= {f"eval_{k}": ev[k] for k in ("success_rate", "mean_return", "episodes") if k in ev}
    return row


def metrics_lines(records: list[dict[str, Any]]) -> bytes:
    """``metrics.jsonl``'s bytes: one :func:`metrics_row` per record, in order (pure)."""
    return "".join(json.dumps(metrics_row(r), default=str) + "\n" for r in records).encode()


def stage_count(done: int, total: int | None, unit: str) -> str:
    """``done/total unit`` (pure). A stage may end past its estimate: the count never
    shows more than its total."""
    return f"{done}/{max(total, done)} {unit}" if total else f"{done} {unit}"


def log_due(last: float, now: float, every_s: float) -> bool:
    """Whether a stage that last logged at ``last`` logs again at ``now`` (pure)."""
    return now - last >= every_s


def recorded_span(held: list[tuple[int, str, str]]) -> str:
    """What held lines (:meth:`LoopProgress.hold`: unit, what, line) tell of, in a few
    words (pure): ``iterations 0-1 and the evaluations of versions 0-2``; an iteration
    only partly reused is named by its parts (``iteration 2's collection``)."""
    units: dict[int, set[str]] = {}
    for unit, what, _ in held:
        units.setdefault(unit, set()).add(what)
    whole = [u for u, w in units.items() if {"collection", "training"} <= w]
    evaluated = [u for u, w in units.items() if "evaluation" in w]
    parts = [_numbers("iteration", whole)] if whole else []
    if evaluated:
        parts.append(f"the evaluation{'s' if len(evaluated) > 1 else ''} of {_numbers('version', evaluated)}")
    for u, w in units.items():
        parts += [f"iteration {u}'s {what}" for what in ("collection", "training") if what in w and u not in whole]
    parts = parts or [_numbers("iteration", list(units))]
    return ", ".join(parts[:-1]) + (" and " if len(parts) > 1 else "") + parts[-1]


def _numbers(name: str, nums: list[int]) -> str:
    """``iteration 3``, ``iterations 0-2``, ``iterations 0, 2`` (pure)."""
    nums = sorted(nums)
    if len(nums) == 1:
        return f"{name} {nums[0]}"
    run = nums == list(range(nums[0], nums[-1] + 1))
    return f"{name}s {nums[0]}-{nums[-1]}" if run else f"{name}s {', '.join(map(str, nums))}"


def success_points(records: list[dict[str, Any]]) -> list[tuple[int, float]]:
    """(version, held-out success) of every evaluated version (pure)."""
    return [(r["iteration"], float(r["eval"]["success_rate"])) for r in records if r.get("eval")]


def success_png(points: list[tuple[int, float]], title: str) -> bytes:
    """A PNG of held-out success per version; the points also in its ``focus`` text field."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5, 3.2), dpi=100)
    ax = fig.add_subplot()
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    ax.plot(xs, ys, marker="o")
    ax.set_xlabel("policy version (training iterations)")
    ax.set_ylabel("held-out success")
    ax.set_ylim(0, 1)
    ax.set_xticks(xs)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"focus": json.dumps({"version": xs, "success": ys})})
    return buf.getvalue()


class LoopProgress:
    """The train loop's stages, rows and picture (see the module docs). ``console``: the
    rich console to draw on (default: the CLI's, standard error)."""

    def __init__(
        self,
        config: FocusConfig,
        *,
        enabled: bool = True,
        console: Console | None = None,
        log: logging.Logger | logging.LoggerAdapter[Any] | None = None,
        log_every_s: float = 10.0,
    ) -> None:
        from flows.progress import console as default_console

        self.config, self.enabled = config, enabled
        self.console = console if console is not None else default_console()
        self.interactive = enabled and self.console.is_terminal and not self.console.is_dumb_terminal
        self.log = log or logging.getLogger("focus.train")
        self.base = config.collection_id or "train"
        self.records: dict[int, dict[str, Any]] = {}
        self.evaluations: dict[int, dict[str, Any]] = {}
        self._header = False
        self._fresh = False  # an evaluation was made (not reused): the picture changes
        #: Every line shown or logged, in order (what a test can read back).
        self.lines: list[str] = []
        #: Where the picture went (``None`` until one is written).
        self.picture: str | None = None
        #: Where the metrics went (``None`` until an iteration is recorded).
        self.metrics: str | None = None
        #: Off a terminal, a long stage logs how far it is this often (seconds).
        self.log_every_s = log_every_s
        #: The lines of steps reused from the records, held back (:meth:`release`):
        #: (unit, what, line); a unit is an iteration, or the version evaluated at its start.
        self._held: list[tuple[int, str, str]] = []
        self._ran = False  # a step's line was said: the loop did work
        self._reused_training: set[int] = set()

    def say(self, line: str, unit: int | None = None) -> None:
        """Show ``line`` (on the terminal, else as a log line the console shows).
        ``unit``: the iteration whose step it tells of; the lines held back for earlier
        ones are summed up first (:meth:`release`), those of ``unit`` said as they are."""
        if unit is not None:
            self._ran = True
            self.release(before=unit)
        self._show(line)

    def hold(self, unit: int, what: str, line: str) -> None:
        """A step reused from the records (``what``: ``collection``, ``training``,
        ``evaluation``; ``publish``): its line is held back. A rerun of a finished loop
        said four such lines per iteration (collect, trained ... (recorded), publish,
        held-out success ... (recorded)), by default, for work it did not do; they go to
        the log file (the console with ``-v``) and the console shows one line for them."""
        self._held.append((unit, what, line))

    def release(self, before: int | None = None) -> None:
        """Say the held lines: those of units before ``before`` (all when ``None``)
        to the log file only, and one line for them on the console (a loop that did
        nothing else: ``train loop <id>: finished ...``); then those of ``before``
        itself (the reused steps of the iteration now running) as they are."""
        older = [h for h in self._held if before is None or h[0] < before]
        same = [h for h in self._held if h[0] == before]
        self._held = [h for h in self._held if before is not None and h[0] > before]
        for _, _, line in older:
            self.lines.append(line)
            if self.enabled:
                self.log.info(line)  # the log file (and the console with -v), not a quiet console
        if older and before is None and not self._ran:
            self._show(f"train loop {self.base}: finished, nothing to do: {recorded_span(older)} recorded")
        elif older:
            self._show(f"{recorded_span(older)}: recorded, reused")
        for _, _, line in same:
            self._show(line)

    def _show(self, line: str) -> None:
        self.lines.append(line)
        if self.interactive:
            self.console.print(line, markup=False, highlight=False, soft_wrap=True)
        elif self.enabled:  # a line on the console (quiet mode shows lines so marked) and in the log file
            from flows.logs import console_extra

            self.log.info(line, extra=console_extra())

    def stage(self, i: int, what: str, detail: str = "", *, recorded: bool = False) -> None:
        """A stage of iteration ``i`` begins (``recorded``: its result is reused, held back)."""
        line = f"iteration {i}: {what}{' ' + detail if detail else ''}"
        if recorded:
            self.hold(i, "collection", line)
        else:
            self.say(line, i)

    @contextlib.contextmanager
    def live(self, label: str, unit: str) -> Iterator[Callable[..., None]]:
        """A live line for one stage (on a terminal): a bar once its total is known,
        its count, a note (the loss) and the elapsed time; yields ``report(done,
        total, note="")`` (safe from any thread)."""
        if not self.interactive:
            yield lambda *a, **k: None
            return
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        bar = Progress(
            SpinnerColumn(),
            TextColumn("[bold]{task.description}"),
            BarColumn(bar_width=24),
            TextColumn("{task.fields[count]} {task.fields[note]}"),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
        )
        task = bar.add_task(label, total=None, count="", note="")

        def report(done: int, total: int | None = None, note: str = "") -> None:
            shown_total = max(total, done) if total else None
            bar.update(task, completed=done, total=shown_total, count=stage_count(done, total, unit), note=note)

        with bar:
            yield report

    @contextlib.contextmanager
    def training(self, i: int, fresh: bool = True) -> Iterator[Callable[..., None]]:
        """The training stage of iteration ``i``; yields what a trainer reports to
        (``report(step=, total=, loss=)``, :class:`tasks.trainers.TrainContext`): the
        live line's count and latest loss on a terminal; elsewhere a line as it begins
        (``fresh``: it trains, not a step recorded by an earlier run), then one at most
        every :attr:`log_every_s` (none for a training shorter than that). Without the
        first, a pipe or log file saw nothing from the collection's last wave to the
        ``trained`` line: 12 s for the toy loop's first step (torch's import, the model's
        load), as long as the update takes for a real one."""
        if fresh and self.enabled and not self.interactive:
            self.stage(i, "train", f"with the {self.config.train.trainer} trainer")
        last = [time.monotonic()]
        with self.live(f"iteration {i}: train", "steps") as update:

            def report(step: int, total: int | None = None, loss: float | None = None) -> None:
                note = f"loss {loss:.4g}" if loss is not None else ""
                update(step, total, note)
                if self.enabled and not self.interactive and log_due(last[0], time.monotonic(), self.log_every_s):
                    last[0] = time.monotonic()
                    count = stage_count(step, total, "steps")
                    self.say(f"iteration {i}: train {count}{', ' + note if note else ''}", i)

            yield report

    def trained(self, i: int, trained: dict[str, Any]) -> None:
        m = trained.get("metrics") or {}
        steps, loss = m.get("train_steps"), m.get("train_loss")
        what = f" {steps:.0f} step{'' if steps == 1 else 's'}" if steps else ""
        if steps == 0:  # said why where it is known: "trained, loss 0" read as a step taken
            # within 1e-8: the local trainer's own "no spread" (critic predictions of identical
            # leaves differ in float32 rounding: +-2.3e-10 on a collected toy batch)
            mean, std = m.get("train_advantage_mean"), m.get("train_advantage_std")
            flat = bool(m.get("train_tokens")) and mean is not None and std is not None and abs(mean) + std <= 1e-8
            what = " no step (every advantage 0, to rounding: nothing to learn)" if flat else " no step"
        what += f", loss {loss:.4g}" if loss is not None else ""
        # kl: the whole batch's after the update (how far it moved; the per-step figure is 0
        # at a one-step rule's only step)
        for key, name in (("train_final_kl", "kl"), ("train_clip_fraction", "clip"), ("train_grad_norm", "grad norm")):
            shown = m.get(key) is not None and (key != "train_grad_norm" or m[key] > 0)  # 0: a one-step rule
            what += f", {name} {m[key]:.3g}" if shown else ""
        if trained.get("reused"):
            self._reused_training.add(i)
            self.hold(i, "training", f"iteration {i}: trained{what} (recorded)")
        else:
            self.say(f"iteration {i}: trained{what} ({trained.get('wall_s', 0.0):.1f} s)", i)

    def published(self, i: int, latest: dict[str, Any], *, loaded: bool) -> None:
        where = ", loaded by the model server" if loaded else ""
        line = f"iteration {i}: publish version {i + 1} ({latest['policy_version']}){where}"
        # the weights of a recorded training, not loaded anywhere: nothing was done
        if i in self._reused_training and not loaded:
            self.hold(i, "publish", line)
        else:
            self.say(line, i)

    @contextlib.contextmanager
    def evaluating(self, version: int, tasks: int, fresh: bool = True) -> Iterator[Callable[[int, int], None]]:
        """The evaluation of ``version`` on ``tasks`` held-out tasks; yields ``report(done,
        total)``: the live line on a terminal; elsewhere (a pipe, a log file, the run's log
        in the Prefect UI) a line as it begins (``fresh``: not recorded by an earlier run),
        then its episode count at most every :attr:`log_every_s`, as a training's. Without
        them nothing came between ``publish version`` and ``held-out success``, however
        many episodes the evaluation ran (one rollout of the model per task)."""
        quiet = not (fresh and self.enabled and not self.interactive)
        if not quiet:
            self.say(f"version {version}: evaluate on {tasks} held-out task{'' if tasks == 1 else 's'}", version)
        last = [time.monotonic()]
        with self.live(f"version {version}: evaluate", "episodes") as update:

            def report(done: int, total: int) -> None:
                update(done, total)
                if not quiet and log_due(last[0], time.monotonic(), self.log_every_s):
                    last[0] = time.monotonic()
                    self.say(f"version {version}: evaluate {stage_count(done, total, 'episodes')}", version)

            yield report

    def evaluated(self, version: int, result: dict[str, Any]) -> None:
        self.evaluations[version] = result
        self._fresh = self._fresh or not result.get("reused")
        line = f"version {version}: held-out success {result['success_rate']:.3f}"
        if result.get("reused"):
            self.hold(version, "evaluation", line + " (recorded)")
        else:
            self.say(line, version)

    def row(self, record: dict[str, Any]) -> None:
        """One row of the table of versions, once the version's record is complete; the
        run's :data:`METRICS` file, rewritten with every record so far."""
        from storage.weights import WeightStore

        self.records[record["iteration"]] = record
        rows = [self.records[k] for k in sorted(self.records)]
        self.metrics = WeightStore(self.config.storage.root).put_run_file(self.base, METRICS, metrics_lines(rows))
        if self.interactive and not self._header:
            self.say(header_line())
            self._header = True
        if self.interactive:
            self.say(row_line(row_cells(record)))
        if record.get("eval") and not record["eval"].get("reused"):
            self.draw()

    def draw(self) -> str | None:
        """Write the picture of held-out success per version beside the weights."""
        from storage.weights import WeightStore

        points = success_points([self.records[k] for k in sorted(self.records)])
        if not points:
            return None
        title = f"train loop {self.base}: held-out success ({self.config.train.eval_tasks} tasks)"
        store = WeightStore(self.config.storage.root)
        self.picture = store.put_run_file(self.base, PICTURE, success_png(points, title))
        return self.picture

    def finish(self, records: list[dict[str, Any]]) -> str | None:
        """The picture, drawn again if an evaluation was made or it is missing."""
        from storage.weights import WeightStore

        self.release()
        for r in records:
            self.records[r["iteration"]] = r
        store = WeightStore(self.config.storage.root)
        if self._fresh or not store.run_file_exists(self.base, PICTURE):
            return self.draw()
        self.picture = store.run_file(self.base, PICTURE) if success_points(records) else None
        return self.picture
