"""Progress of long phases - a rich bar on a terminal, log lines elsewhere.

The CLI tests run the real ``focus collect`` (the local model server on loopback, the
session's Prefect server) once under a pseudo-terminal and once with its output on
pipes, and check the figures shown against the batch read back with ``focus inspect``.
The unit test drives :class:`CollectionProgress` with a fake clock on a forced-terminal
console to check the arithmetic of each figure.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import shlex
import struct
import subprocess
import sys
import termios
import time
from io import StringIO
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fixtures.prefect import kill_tree
from rich.console import Console
from typer.testing import CliRunner

import flows.progress as progress_mod
from benchmarks.cli_start import screen_lines
from cli.app import app
from flows.progress import CollectionProgress
from focus.priority import Phase
from focus.usage import Usage
from tasks.records import StepRecord

BUDGET = 12
WAVE_SIZE = 2
COLUMNS, LINES = 160, 40
#: CSI sequences (colours, cursor, erase) and OSC sequences (titles, links).
ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[()][0-9A-Za-z]")
#: A frame of the bar: done, budget (``done/budget``, or ``done (budget N)`` once past it), rates.
BAR = re.compile(
    r"1\.continue\s.*?(\d+)(?:/| transitions \(budget )(\d+)\)?\s?(?:transitions)?\s+([\d.]+) transitions/s, "
    r"(\d+) tokens/s, budget left (\d+)"
)
LOG_LINE = re.compile(
    r"1\.continue wave (\d+): (\d+) transitions, ([\d.]+) transitions/s, (\d+) tokens/s, budget left (\d+)"
)


def strip_ansi(text: str) -> str:
    return ANSI.sub("", text)


def _command(tmp_path: Path, cid: str, *, as_json: bool = True) -> list[str]:
    """A small embedded-default collection (test_cli's), in-process rollouts, several waves."""
    cmd = [sys.executable, "-m", "cli", "collect", "--tasks", "2", "--transitions", str(BUDGET)]
    cmd += ["--collection-id", cid, "--store", str(tmp_path / "runs"), "--log-file", str(tmp_path / "log")]
    cmd += ["--json"] if as_json else []
    # waves of WAVE_SIZE continuations (wave_unit "jobs"), so the phase has several
    settings = ("agent.sampling.max_tokens=8", "agent.max_steps=4", f"search.phases.1.wave_size={WAVE_SIZE}")
    for s in (*settings, "search.phases.1.wave_unit=jobs"):
        cmd += ["--set", s]
    return cmd


def _env(prefect_env: dict[str, str], **extra: str) -> dict[str, str]:
    env = {k: v for k, v in prefect_env.items() if k not in ("NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE")}
    env.update(COLUMNS=str(COLUMNS), LINES=str(LINES), TERM="xterm-256color", **extra)
    return env


def _run_in_pty(cmd: list[str], env: dict[str, str], cwd: Path, timeout: float) -> tuple[int, bytes]:
    """Run ``cmd`` with stdout and stderr on a pseudo-terminal; everything it wrote."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", LINES, COLUMNS, 0, 0))
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, start_new_session=True
    )
    os.close(slave)
    out = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while True:
            if time.monotonic() > deadline:
                raise AssertionError(f"focus collect did not finish in {timeout} s; output:\n{out[-3000:]!r}")
            ready, _, _ = select.select([master], [], [], 0.5)
            if not ready:
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every holder of the slave side has closed it
                break
            if not chunk:
                break
            out += chunk
        return proc.wait(timeout=30), bytes(out)
    finally:
        os.close(master)
        if proc.poll() is None:
            kill_tree(proc)


def _inspect(url: str) -> dict[str, Any]:
    done = CliRunner().invoke(app, ["inspect", url, "--json"])
    assert done.exit_code == 0, done.output
    return dict(json.loads(done.output))


def _result_json(text: str) -> dict[str, Any]:
    line = [ln for ln in text.splitlines() if ln.startswith('{"collection_id"')][-1]
    return dict(json.loads(line))


@pytest.mark.timeout(150)
def test_collect_on_a_terminal_shows_the_rich_bar(tmp_path, prefect_env):
    code, raw = _run_in_pty(_command(tmp_path, "tty", as_json=False), _env(prefect_env), tmp_path, timeout=120)
    text = raw.decode("utf-8", errors="replace")
    assert code == 0, text[-3000:]
    assert "\x1b[?25l" in text and "\x1b[2K" in text, "no live display (cursor hidden, line redrawn)"
    plain = strip_ansi(text)
    frames = [m.groups() for m in BAR.finditer(plain)]
    assert frames, plain[-3000:]
    # a bar for the evidence phase too, and the whole output fits a screen
    assert re.search(r"0\.evidence\s.*?(\d+)/\1 rollouts", plain), plain[-3000:]
    shown = screen_lines(text)  # what the terminal shows at the end, not the bars' redraws
    assert len(shown) <= 30 and shown[0].startswith("0.evidence") and shown[1].startswith("1.continue"), shown
    assert "INFO" not in plain and "distributed" not in plain
    done = [int(f[0]) for f in frames]
    assert done == sorted(done), f"the bar went backwards: {done}"
    assert {int(f[1]) for f in frames} == {BUDGET}

    # the whole line, a shell word: a TMPDIR may hold a space, and the URL is then quoted
    (batch_url,) = shlex.split(re.findall(r"^batch: (.+?)\s*$", plain, re.M)[-1])
    assert "actor_rows" in plain and "flow_wall_s" in plain  # the result table
    phase = _inspect(batch_url)["phases"][1]
    assert phase["name"] == "continue" and phase["transition_budget"] == BUDGET
    final_t, _, rate_t, rate_k, left = frames[-1]
    # the bar counts what the phase used, which may pass the budget (running rollouts finish)
    assert int(final_t) == phase["transitions"] >= BUDGET
    assert int(left) == max(BUDGET - phase["transitions"], 0)
    # both rates are over the same wall time: their ratio is the phase's tokens per transition
    assert float(rate_t) > 0 and int(rate_k) > 0
    ratio = phase["tokens"] / phase["transitions"]
    assert abs(int(rate_k) - float(rate_t) * ratio) <= 0.5 + 0.05 * ratio + 1e-9, (rate_t, rate_k, ratio)
    # the rate is over the phase's wall time as this process saw it, planning between waves
    # included: the bar's clock starts as the phase starts and stops at its last wave's
    # record, so it misses only the phase's closing step (a 12-transition phase: 0.20 s
    # of the phase's 0.23 s wall seen), never the planning that a waves-only rate would
    elapsed = int(final_t) / float(rate_t)
    assert elapsed >= 0.75 * phase["wall_s"] - 0.02, (elapsed, phase["wall_s"])


@pytest.mark.timeout(150)
def test_collect_into_a_pipe_logs_lines_without_control_sequences(tmp_path, prefect_env):
    env = _env(prefect_env, PREFECT_LOGGING_LEVEL="INFO")
    done = subprocess.run(_command(tmp_path, "pipe"), cwd=tmp_path, env=env, capture_output=True, timeout=120)
    out, err = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == 0, out[-2000:] + err[-3000:]
    assert "\x1b" not in out and "\x1b" not in err, "control sequences in a pipe"
    assert "━" not in out + err, "a progress bar drawn into a pipe"
    lines = [m.groups() for m in LOG_LINE.finditer(err)]
    assert re.search(r"^0\.evidence: \d+ rollouts, \d+ transitions", err, re.M), err[-3000:]
    assert re.search(r"^0\.evidence: 1/\d+ rollouts, [\d.]+ rollouts/s", err, re.M), err[-3000:]  # as they finish
    phase = _inspect(_result_json(out)["batch_url"])["phases"][1]
    # one line per measured wave (the last planned wave is empty: the phase's end)
    assert [int(g[0]) for g in lines] == list(range(phase["waves"])), err[-3000:]
    used = [int(g[1]) for g in lines]
    assert used == sorted(used) and used[-1] == phase["transitions"]
    assert [int(g[4]) for g in lines] == [max(BUDGET - u, 0) for u in used]
    assert all(float(g[2]) > 0 for g in lines)


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def perf_counter(self) -> float:
        return self.now


def used(transitions: int, tokens: int, spent: int | None = None) -> Usage:
    """A wave record's ``phase_usage`` (the fields progress reads)."""
    return Usage(transitions=transitions, tokens=tokens, budget_spent=transitions if spent is None else spent)


def wave(w: int, usage: Usage | None = None) -> StepRecord:
    """The record of wave ``w`` of phase 1: measured with ``usage``, else reused."""
    return StepRecord("wave", "1.continue", w, 1, reused=usage is None, phase_usage=usage)


def _final_frame(console: Console) -> str:
    text = strip_ansi(console.file.getvalue())  # type: ignore[attr-defined]
    return [ln for ln in re.split(r"[\r\n]", text) if "transitions" in ln][-1]


def test_figures_after_wave_records(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(progress_mod, "time", SimpleNamespace(perf_counter=clock.perf_counter))
    console = Console(file=StringIO(), force_terminal=True, width=200, color_system="truecolor")
    log = SimpleNamespace(info=lambda *a: pytest.fail(f"logged on a terminal: {a}"))
    with CollectionProgress(None, log=log, console=console) as progress:
        assert progress.interactive
        progress.start_phase(1, Phase("continue", transitions=100))
        clock.now += 2.0
        line = progress.wave_done(wave(0, used(30, 900)))
        assert (
            line
            == "1.continue wave 0: 30 transitions, 15.0 transitions/s, 450 tokens/s, budget left 70, about 5 s left"
        )
        assert progress.wave_done(wave(1)) == ""  # not measured: nothing shown
        clock.now += 3.0
        line = progress.wave_done(wave(2, used(110, 2000)))
        # over the phase's 5 s; the phase ran past its budget (nothing left, not negative)
        assert line.endswith("110 transitions, 22.0 transitions/s, 400 tokens/s, budget left 0")
    frame = _final_frame(console)
    # past its budget the count says so, never "110/100"
    assert "1.continue" in frame and "110 transitions (budget 100)" in frame and "110/100" not in frame
    assert "22.0 transitions/s, 400 tokens/s, budget left 0" in frame


def test_resumed_phase_takes_its_first_measured_wave_as_the_baseline(monkeypatch):
    """Reused waves' transitions are in the first measured total: counting them over this
    process's time would report a rate the phase never had."""
    clock = _Clock()
    monkeypatch.setattr(progress_mod, "time", SimpleNamespace(perf_counter=clock.perf_counter))
    console = Console(file=StringIO(), force_terminal=True, width=200)
    with CollectionProgress(None, console=console) as progress:
        progress.start_phase(2, Phase("deep", transitions=50))
        assert progress.wave_done(wave(0)) == ""
        clock.now += 0.5
        first = progress.wave_done(wave(1, used(40, 400)))
        assert first == "2.deep wave 1: 40 transitions, rates from the next wave (resumed), budget left 10"
        clock.now += 2.0
        second = progress.wave_done(wave(2, used(50, 500)))
        assert second == "2.deep wave 2: 50 transitions, 5.0 transitions/s, 50 tokens/s, budget left 0"
    assert "50/50 transitions 5.0 transitions/s" in _final_frame(console)


def test_the_bar_fits_80_columns(monkeypatch):
    """On an 80-column terminal the rates wrap; nothing is cut (no ellipsis)."""
    clock = _Clock()
    monkeypatch.setattr(progress_mod, "time", SimpleNamespace(perf_counter=clock.perf_counter))
    console = Console(file=StringIO(), force_terminal=True, width=80)
    with CollectionProgress(None, console=console) as progress:
        progress.start_phase(1, Phase("continue", transitions=96))
        clock.now += 2.0
        progress.wave_done(wave(0, used(112, 2000)))
    text = strip_ansi(console.file.getvalue())  # type: ignore[attr-defined]
    assert "…" not in text and "112 transitions (budget 96)" in text
    assert all(len(line) <= 80 for line in re.split(r"[\r\n]", text))
    assert "budget left 0" in text.replace("\n", " ")


def test_not_a_terminal_logs_lines_and_draws_nothing():
    console = Console(file=StringIO(), force_terminal=False)
    logged: list[str] = []
    with CollectionProgress(
        None, log=SimpleNamespace(info=lambda line, **_: logged.append(line)), console=console
    ) as progress:
        assert not progress.interactive
        progress.start_phase(1, Phase("continue", transitions=10))
        line = progress.wave_done(wave(0, used(4, 8)))
    assert logged == [line] == progress.lines and re.search(r"budget left 6, about \d+ s left$", line)
    assert console.file.getvalue() == ""  # type: ignore[attr-defined]


def _piped(clock: _Clock) -> tuple[CollectionProgress, list[str], list[str]]:
    """A progress into a pipe with a fake clock; (progress, info lines, warning lines)."""
    infos: list[str] = []
    warnings: list[str] = []
    log = SimpleNamespace(info=lambda line, **_: infos.append(line), warning=lambda line, **_: warnings.append(line))
    return CollectionProgress(None, log=log, console=Console(file=StringIO(), force_terminal=False)), infos, warnings


def test_a_long_phase_logs_a_line_per_tenth_of_its_budget_not_per_wave(monkeypatch):
    """100k transitions in waves of 100: the log got 1,000 lines, one per wave (4,137 at
    the default wave size over 2,000 tasks); now the first wave's, one per tenth of the
    budget and the last. Every wave's line is still computed (``lines``)."""
    clock = _Clock()
    monkeypatch.setattr(progress_mod, "time", SimpleNamespace(perf_counter=clock.perf_counter))
    progress, infos, _ = _piped(clock)
    with progress:
        progress.start_phase(1, Phase("continue", transitions=100_000))
        for w in range(1000):
            clock.now += 0.05
            progress.wave_done(wave(w, used(100 * (w + 1), 300 * (w + 1))))
    assert len(progress.lines) == 1000
    done = [int(LOG_LINE.search(line).group(2)) for line in infos]  # type: ignore[union-attr]
    assert done == [100, *range(10_000, 100_001, 10_000)], infos


def test_a_slow_phase_logs_at_least_a_line_a_minute_and_every_failure(monkeypatch):
    """Waves a minute apart each get their line, though each spends less than a tenth of
    the budget; a wave whose rollouts failed always gets its warning."""
    clock = _Clock()
    monkeypatch.setattr(progress_mod, "time", SimpleNamespace(perf_counter=clock.perf_counter))
    progress, infos, warnings = _piped(clock)
    with progress:
        progress.start_phase(1, Phase("continue", transitions=100_000))
        progress.wave_done(wave(0, used(10, 30)))
        clock.now += 1.0
        progress.wave_done(wave(1, used(20, 60)))  # neither a tenth nor a minute: not logged
        failed = StepRecord(
            "wave", "1.continue", 2, 1, phase_usage=used(30, 90), failed_rollouts=1, rollouts=4,
            failure_causes={"env: RuntimeError": 1},
        )  # fmt: skip
        progress.wave_done(failed)
        for w in range(3, 6):
            clock.now += 60.0
            progress.wave_done(wave(w, used(10 * (w + 1), 30 * (w + 1))))
    assert [LOG_LINE.search(line).group(1) for line in infos] == ["0", "3", "4", "5"]  # type: ignore[union-attr]
    assert warnings == ["1.continue wave 2: 1 of 4 rollouts failed: env: RuntimeError (x1)"]


def test_disabled_shows_and_logs_nothing():
    console = Console(file=StringIO(), force_terminal=True)
    logged: list[str] = []
    with CollectionProgress(
        None, enabled=False, log=SimpleNamespace(info=lambda line, **_: logged.append(line)), console=console
    ) as p:
        p.start_phase(1, Phase("continue", transitions=10))
        p.wave_done(wave(0, used(4, 8)))
    assert logged == [] and console.file.getvalue() == ""  # type: ignore[attr-defined]


def test_dumb_terminal_gets_lines_not_a_bar(monkeypatch):
    """rich cannot redraw on TERM=dumb; a bar would appear only at the end."""
    monkeypatch.setenv("TERM", "dumb")
    console = Console(file=StringIO(), force_terminal=True)
    logged: list[str] = []
    with CollectionProgress(
        None, log=SimpleNamespace(info=lambda line, **_: logged.append(line)), console=console
    ) as progress:
        progress.start_phase(1, Phase("continue", transitions=10))
        progress.wave_done(wave(0, used(4, 8)))
    assert not progress.interactive and len(logged) == 1


def test_budget_left_counts_as_the_planner_does():
    """A rollout that made no transition (a failed first call) still spends one unit of
    the phase budget in the planner: the line says what the planner has left."""
    figures = progress_mod.wave_figures(wave(3, used(20, 40, 23)), 30, None, 0.0)
    assert (figures.transitions, figures.spent, figures.budget_left) == (20, 23, 7)


EVIDENCE_LINE = re.compile(
    r"^0\.evidence: (\d+)/(\d+) rollouts, [\d.]+ rollouts/s(?:, about \d+(?:\.\d)? (?:s|min|h) left)?$"  # none on the last
)


def test_the_evidence_bar_advances_as_its_rollouts_finish(monkeypatch):
    """The evidence bar showed 0/N and "running" until its step ended (a fifth of a run
    at 2,000 tasks); it now counts the rollouts done, then fills from the step record."""
    clock = _Clock()
    monkeypatch.setattr(progress_mod, "time", SimpleNamespace(perf_counter=clock.perf_counter))
    console = Console(file=StringIO(), force_terminal=True, width=200)
    with CollectionProgress(None, console=console) as progress:
        progress.start_evidence(Phase("evidence", rollouts_per_task=4), 8)
        for _ in range(3):
            clock.now += 1.0
            progress.rollout_done()
        task = progress._progress.tasks[0]
        assert (task.completed, task.total) == (3, 8)
        assert (
            task.fields["count"] == "3/8 rollouts" and task.fields["rates"] == "running, 1.0 rollouts/s, about 5 s left"
        )
        progress.evidence_done(StepRecord("evidence", "0.evidence", 0, 0, rollouts=8, usage=used(40, 400)))
        progress.start_phase(1, Phase("continue", transitions=10))
        assert progress.rollout_done() is None  # a continuation's rollouts: its waves report them
    assert "8/8 rollouts" in strip_ansi(console.file.getvalue())  # type: ignore[attr-defined]


def test_piped_evidence_logs_a_line_per_tenth_of_its_rollouts_and_one_a_minute(monkeypatch):
    """8,000 evidence rollouts (2,000 tasks x 4) logged nothing until the step's line;
    now the first rollout's, one per tenth and one at least a minute, then the step's."""
    clock = _Clock()
    monkeypatch.setattr(progress_mod, "time", SimpleNamespace(perf_counter=clock.perf_counter))
    progress, infos, _ = _piped(clock)
    with progress:
        progress.start_evidence(Phase("evidence", rollouts_per_task=4), 8000)
        for _ in range(1000):
            clock.now += 0.01
            progress.rollout_done()
        clock.now += 61.0  # a slow stretch: a line though no new tenth is done
        progress.rollout_done()
        for _ in range(6999):
            progress.rollout_done()
        progress.evidence_done(StepRecord("evidence", "0.evidence", 0, 0, rollouts=8000, usage=used(9000, 90_000)))
    done = [int(m.group(1)) for line in infos if (m := EVIDENCE_LINE.match(line))]
    assert done == [1, 800, 1001, *range(1600, 8000, 800)], infos
    assert infos[-1].startswith("0.evidence: 8000 rollouts, 9000 transitions") and len(infos) == len(done) + 1


def test_a_direct_collection_reports_its_evidence_rollouts_and_logs_its_services_once(tmp_path, monkeypatch, caplog):
    """The library's execution hands each finished rollout to the progress
    (``Execution.observe_rollouts``), into a pipe here. The flow's own services start
    nothing the command did not (the config names them): their ``start-up:`` and
    ``shut-down:`` lines were logged a second time, after the command's."""
    import asyncio
    import logging

    from test_pipeline import small_config

    from flows.direct import collect_direct
    from flows.services import Services

    cfg = small_config(str(tmp_path / "store"), "evidence-lines", progress=True)  # 3 tasks x 2 rollouts
    monkeypatch.setattr(progress_mod, "_CONSOLE", Console(file=StringIO(), force_terminal=False))
    with caplog.at_level(logging.INFO):
        with Services(cfg) as ready:  # the command's (cli.common.started)
            asyncio.run(collect_direct(ready))
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    evidence = [ln for ln in infos if ln.startswith("0.evidence")]
    assert [EVIDENCE_LINE.match(ln).groups() for ln in evidence[:-1]] == [  # type: ignore[union-attr]
        (str(k), "6") for k in range(1, 6)
    ], evidence
    assert evidence[-1].startswith("0.evidence: 6 rollouts, ")
    assert [ln.split(":")[0] for ln in infos if ln.startswith(("start-up:", "shut-down:"))] == ["start-up", "shut-down"]


def test_the_evidence_rate_starts_when_the_search_starts_not_with_the_lease_wait(tmp_path, monkeypatch, caplog):
    """A rerun that waited for another host's lease (30 s: ``storage.held_lease``)
    counted the wait in its evidence rates, which started with the command. The wait is
    made 1,000 s here (the lease taken 1,000 s later on the progress's clock): the rates
    are the search's."""
    import asyncio
    import contextlib
    import logging

    from test_pipeline import small_config

    from flows.direct import collect_direct
    from flows.services import Services
    from tasks.journal import CheckpointJournal

    offset = [0.0]
    monkeypatch.setattr(progress_mod, "time", SimpleNamespace(perf_counter=lambda: time.perf_counter() + offset[0]))
    taken = CheckpointJournal.lease

    @contextlib.asynccontextmanager
    async def late_lease(self):
        offset[0] += 1000.0  # the wait for another host's lease
        async with taken(self):
            yield

    monkeypatch.setattr(CheckpointJournal, "lease", late_lease)
    cfg = small_config(str(tmp_path / "store"), "late-lease", progress=True)  # 3 tasks x 2 rollouts
    monkeypatch.setattr(progress_mod, "_CONSOLE", Console(file=StringIO(), force_terminal=False))
    with caplog.at_level(logging.INFO):
        with Services(cfg) as ready:
            asyncio.run(collect_direct(ready))
    evidence = [r.getMessage() for r in caplog.records if r.getMessage().startswith("0.evidence")]
    rates = [
        float(m.group(1)) for ln in evidence[:-1] if (m := re.search(r", ([\d.]+) rollouts/s(?:, about .*)?$", ln))
    ]
    assert len(rates) == 5 and min(rates) > 0.1, evidence  # 5 rollouts in 1,000 s: 0.005 a second
    step = re.search(r"^0\.evidence: 6 rollouts, (\d+) transitions, ([\d.]+) transitions/s", evidence[-1])
    assert step is not None and float(step.group(2)) > int(step.group(1)) / 100, evidence[-1]


def test_an_execution_hands_each_rollout_to_its_observer_and_pickles_without_it():
    """``Execution.observe_rollouts``: called once per finished rollout, the rollouts the
    same as without it; a copy sent to another process (Dask) carries no observer."""
    import asyncio
    import pickle

    from fixtures.prefect import DigitPolicy

    from focus.agent import Agent
    from focus.execution import Execution
    from focus.search import RolloutJob
    from focus.toy import ReachTarget, reach_target_tasks, toy_format

    agent = Agent(DigitPolicy(), ReachTarget(), toy_format(), max_steps=6)
    starts = [asyncio.run(agent.start(t)) for t in reach_target_tasks(3, seed=1)]
    jobs = [RolloutJob(i % 3, 0, 1000 + i, starts[i % 3]) for i in range(9)]
    plain = asyncio.run(Execution(max_concurrency=4).run(agent, jobs))
    seen: list[Any] = []
    ex = Execution(max_concurrency=4)
    ex.observe_rollouts(lambda rollout: seen.append(rollout))  # a lambda: it cannot be pickled
    observed = asyncio.run(ex.run(agent, jobs))
    assert sorted(map(id, seen)) == sorted(map(id, observed)) and len(seen) == 9
    assert [[t.completion_ids for t in r.turns] for r in observed] == [
        [t.completion_ids for t in r.turns] for r in plain
    ]
    copy = pickle.loads(pickle.dumps(ex))
    assert copy._on_rollout is None and asyncio.run(copy.run(agent, jobs[:2])) is not None


def test_the_flow_reports_its_evidence_rollouts_too(tmp_path, monkeypatch, prefect_api):
    """The ``collect`` flow's progress observes its execution as the direct path's does."""
    import asyncio

    from test_pipeline import small_config

    import flows.collect as flow_mod

    shown: list[str] = []

    class Recording(CollectionProgress):
        def rollout_done(self, rollout: object = None) -> str | None:
            line = super().rollout_done(rollout)
            shown.extend([line] if line else [])
            return line

    monkeypatch.setattr(flow_mod, "CollectionProgress", Recording)
    monkeypatch.setattr(progress_mod, "_CONSOLE", Console(file=StringIO(), force_terminal=False))
    asyncio.run(flow_mod.collect(small_config(str(tmp_path / "store"), "flow-evidence", progress=True)))
    assert [EVIDENCE_LINE.match(ln).groups() for ln in shown] == [(str(k), "6") for k in range(1, 7)], shown  # type: ignore[union-attr]


def test_the_lines_say_how_long_is_left_at_the_rate_so_far(monkeypatch):
    """A long phase said its rate alone (50,000 evidence rollouts at 1,200 a second, in
    a pipe: a line per tenth); each line now says what is left at that rate, the last
    none. Waves: the budget left over the transitions per second."""
    clock = _Clock()
    monkeypatch.setattr(progress_mod, "time", SimpleNamespace(perf_counter=clock.perf_counter))
    logged: list[str] = []
    console = Console(file=StringIO(), force_terminal=False)
    with CollectionProgress(None, log=SimpleNamespace(info=lambda ln, **_: logged.append(ln)), console=console) as p:
        p.start_evidence(Phase("evidence", rollouts_per_task=1), 50_000)
        lines = []
        for _ in range(5_000):
            clock.now += 1 / 1_250
            lines.append(p.rollout_done())
        assert lines[-1] == "0.evidence: 5000/50000 rollouts, 1250.0 rollouts/s, about 36 s left"
        assert lines[0] == "0.evidence: 1/50000 rollouts, 1250.0 rollouts/s"  # no guess before 1% is done
        assert lines[499].endswith("rollouts/s, about 40 s left") and not lines[498].endswith("left")
        for _ in range(45_000):
            clock.now += 1 / 125
            last = p.rollout_done()
        assert last == "0.evidence: 50000/50000 rollouts, 137.4 rollouts/s"  # the step's line is logged instead
        assert len(logged) == 10 and all(re.search(r"rollouts/s, about [\d.]+ (s|min) left$", ln) for ln in logged[1:])
        p.start_phase(1, Phase("continue", transitions=1_000_000))
        clock.now += 10.0
        assert p.wave_done(wave(0, used(1_000, 3_000))).endswith(
            "100.0 transitions/s, 300 tokens/s, budget left 999000, about 2.8 h left"
        )
    assert progress_mod.time_left(89.4) == "about 89 s left" and progress_mod.time_left(90) == "about 2 min left"


def test_the_pipeline_s_failure_line_names_the_last_failure_s_task_and_step():
    """A NaN reward at step 2 of task t1 (``test_unseen_mdps``'s counter env): the
    library's line names the task and step of the last failure, the pipeline's named the
    causes and counts only, so an operator could not tell which task's step to reproduce.
    The step records (:class:`tasks.records.Tally`, as the pipeline's journal makes them)
    now carry it, for the evidence and for a wave."""
    import asyncio
    import math

    from test_unseen_mdps import collector

    from flows.progress import failure_line
    from focus import ConstantCritic
    from focus.journal import MemoryJournal
    from tasks.records import Tally

    def reward(task: str, t: int, x: int, a: int) -> float:
        return math.nan if task == "t1" and t == 2 else float(a)

    tally, lines = Tally(), []

    class Noted(MemoryJournal):
        async def record(self, step, value):  # type: ignore[no-untyped-def]
            await super().record(step, value)
            record = StepRecord(step.kind, "key", step.wave, step.phase, **tally.step(step, value))
            if line := failure_line(f"{step.kind} {step.phase}.{step.wave}", record):
                lines.append(line)

    col, tasks = collector(reward, 4, ConstantCritic(0.5), max_steps=6)
    asyncio.run(col.search(tasks, Noted()))
    assert {line.split(":")[0] for line in lines} >= {"evidence 0.0", "wave 1.0"}, lines
    cause = re.escape("env: Counter.step returned the reward nan, not a finite number within ±1e+60")
    for line in lines:
        assert re.fullmatch(
            rf"\S+ \S+: \d+ of \d+ rollouts failed: {cause} \(x\d+\); last cause \(task 't1', step 2\): {cause}", line
        ), line
