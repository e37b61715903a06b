"""A train loop one can watch: on a terminal a live line per stage (collection bars,
training steps, publishing, evaluation episodes), a row per version as soon as it is
evaluated, and a picture of held-out success per version beside the weights; in a
pipe a line per stage and the collections' lines, as ``focus collect`` prints; nothing
with ``progress = false``.

The integration test runs the real ``focus train`` (no Prefect server: the direct
path, the embedded model server) under a pseudo-terminal, then checks the rows and the
picture against the evaluations recorded in the store, and that a rerun of the
finished loop starts nothing."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import time
from io import StringIO
from pathlib import Path

import pytest
from fixtures.loop import TINY_LOOP
from rich.console import Console

from flows.loop_progress import (
    COLUMNS,
    PICTURE,
    LoopProgress,
    header_line,
    log_due,
    row_cells,
    row_line,
    success_png,
    success_points,
)
from tasks.config import load_config

LOOP_TOML = Path(__file__).resolve().parents[1] / "configs" / "loop.toml"
#: A row: version, policy version, success, return, transitions, loss, reused.
ROW = re.compile(
    r"^\s*(\d+)\s+([0-9a-f]{16})\s+(\d\.\d{3}|-)\s+(-?\d+\.\d{3}|-)\s+(\d+|-)\s+(\S+)\s+(yes|no|-)\s*$", re.M
)


def png_points(data: bytes) -> dict[str, list]:
    """The points a success picture carries in its ``focus`` text field."""
    from PIL import Image

    image = Image.open(io.BytesIO(data))
    assert image.format == "PNG" and image.size[0] >= 300
    return dict(json.loads(image.text["focus"]))


def small(root: Path, **extra: object) -> object:
    over = {
        "collection_id": "w",
        **TINY_LOOP,
        "storage.root": str(root),
        "train.iterations": 2,
        "train.eval_tasks": 4,
        **extra,
    }
    return load_config(LOOP_TOML, overrides=over, environ={})


# ---- one piece at a time (no server) ----


def test_a_row_fits_80_columns_and_keeps_the_policy_version_whole():
    rec = {
        "iteration": 12,
        "policy_version": "0123456789abcdef",
        "eval": {"success_rate": 0.38333},
        "stats": {"transitions": 1234567},
        "train": {"metrics": {"train_loss": -0.012345678}, "reused": True},
    }
    line = row_line(row_cells(rec))
    assert len(line) <= 80 and len(header_line()) <= 80
    assert "0123456789abcdef" in line and "0.383" in line and "-0.01235" in line and line.endswith("yes")
    assert sum(w for _, w in COLUMNS) + 2 * (len(COLUMNS) - 1) == len(header_line())
    final = row_cells({"iteration": 3, "policy_version": "ffffffffffffffff", "eval": {"success_rate": 0.5}})
    assert final[2:] == ["0.500", "-", "-", "-", "-"]


def test_the_picture_carries_its_points():
    data = success_png([(0, 0.25), (1, 0.5), (2, 0.375)], "t")
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert png_points(data) == {"version": [0, 1, 2], "success": [0.25, 0.5, 0.375]}
    records = [{"iteration": 0, "eval": {"success_rate": 0.25}}, {"iteration": 1}]
    assert success_points(records) == [(0, 0.25)]


def test_a_stage_never_shows_more_than_its_total(tmp_path):
    console = Console(file=StringIO(), force_terminal=True, width=80)
    show = LoopProgress(small(tmp_path), console=console)
    assert show.interactive
    with show.training(0) as report:
        report(5, 4, -0.5)  # a trainer past its own estimate
        report(7, 4)
        time.sleep(0.3)  # one redraw at least (rich redraws ten times a second)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "7/7 steps" in text and "/4 steps" not in text


def test_the_train_line_shows_steps_and_loss_within_80_columns(tmp_path):
    from test_progress_tty import strip_ansi

    console = Console(file=StringIO(), force_terminal=True, width=80)
    show = LoopProgress(small(tmp_path), console=console)
    with show.training(12) as report:
        report(1234, 5678, -1.2345678e-05)  # the widest a tiny-model update gets, and then some
    # the last state is drawn when the stage ends, whatever the refresh timer did
    lines = strip_ansi(console.file.getvalue()).replace("\r", "\n").split("\n")  # type: ignore[attr-defined]
    shown = [ln for ln in lines if "1234/5678 steps" in ln]
    assert shown and all("loss -1.235e-05" in ln and len(ln) <= 80 for ln in shown), shown
    assert all(len(ln) <= 80 for ln in lines)


def test_off_a_terminal_a_long_training_logs_how_far_it_is(tmp_path, caplog):
    console = Console(file=StringIO(), force_terminal=False, width=80)
    show = LoopProgress(small(tmp_path), console=console, log_every_s=0.0)  # every report is due
    with caplog.at_level("INFO", logger="focus.train"), show.training(0) as report:
        report(1, 3, 0.25)
        report(2, 3)
    assert show.lines == [
        "iteration 0: train with the local trainer",  # as it begins: a pipe saw nothing until the first count
        "iteration 0: train 1/3 steps, loss 0.25",
        "iteration 0: train 2/3 steps",
    ]
    assert "iteration 0: train 1/3 steps, loss 0.25" in caplog.text
    assert console.file.getvalue() == ""  # type: ignore[attr-defined]
    assert not log_due(100.0, 109.9, 10.0) and log_due(100.0, 110.0, 10.0)


def test_lines_in_a_pipe_and_none_with_progress_off(tmp_path, caplog):
    cfg = small(tmp_path)
    record = {"iteration": 0, "policy_version": "a" * 16, "eval": {"success_rate": 0.5, "reused": True}}
    for enabled in (True, False):
        console = Console(file=StringIO(), force_terminal=False, width=80)
        show = LoopProgress(cfg, enabled=enabled, console=console)
        with caplog.at_level("INFO", logger="focus.train"):
            show.stage(0, "collect", "w-it0")
            with show.training(0) as report:
                report(1, 2, 0.1)
            show.evaluated(0, record["eval"])
            show.row(record)
        assert console.file.getvalue() == ""  # type: ignore[attr-defined]  # no bar: lines go through the log
        assert ("iteration 0: collect w-it0" in caplog.text) is enabled  # the log file has it
        # ... and the console's handler shows it (quiet mode shows the records so marked)
        shown = [r for r in caplog.records if getattr(r, "focus_console", False)]
        assert [r.getMessage() for r in shown][:1] == (["iteration 0: collect w-it0"] if enabled else [])
        assert "train 1/2" not in caplog.text  # a training shorter than log_every_s logs no count
        assert ("iteration 0: train with the local trainer" in caplog.text) is enabled  # but says it began
        caplog.clear()
    # a reused evaluation draws no picture; finish draws the missing one
    assert show.picture is None
    assert show.finish([record]) is not None
    assert png_points(Path(show.picture.removeprefix("file://")).read_bytes())["success"] == [0.5]


# ---- the real command ----


def _command(root: Path) -> list[str]:
    cmd = [sys.executable, "-m", "cli", "train", "-c", str(LOOP_TOML), "--collection-id", "w", "--json"]
    for key, value in {
        "storage.root": str(root),
        **TINY_LOOP,
        "train.iterations": 2,
        "train.eval_tasks": 4,
        "progress": True,
    }.items():
        cmd += ["--set", f"{key}={json.dumps(value)}"]
    return cmd


@pytest.mark.integration  # starts the embedded model server
@pytest.mark.timeout(400)
@pytest.mark.needs("torch")  # a LocalCritic
def test_focus_train_on_a_terminal_shows_each_stage_rows_and_a_picture(tmp_path):
    from fixtures.prefect import base_env
    from test_progress_tty import _run_in_pty, strip_ansi

    from storage import CheckpointStore
    from storage.weights import WeightStore

    env = {**base_env(tmp_path / "prefect"), "COLUMNS": "100", "LINES": "40", "TERM": "xterm-256color"}
    root = tmp_path / "store"
    code, raw = _run_in_pty(_command(root), env, tmp_path, timeout=360)
    text = raw.decode("utf-8", errors="replace")
    assert code == 0, text[-3000:]
    plain = strip_ansi(text)
    assert "\x1b[?25l" in text, "no live display"
    for i in (0, 1):
        for stage in (f"iteration {i}: collect w-it{i}", f"iteration {i}: trained", f"iteration {i}: publish version"):
            assert stage in plain, (stage, plain[-3000:])
        # the train line counts the trainer's optimizer steps and shows the latest loss
        assert re.search(rf"iteration {i}: train.*?\d+/\d+ steps loss -?\d", plain), plain[-3000:]
    assert "0.evidence" in plain and "1.continue" in plain  # the collection's bars
    assert re.search(r"version 2: evaluate.*?4/4 episodes", plain), plain[-3000:]
    assert "starting the model server" in plain

    evals = {v: CheckpointStore(str(root)).load("w", "eval-n4", v) for v in range(3)}
    rows = {int(m[0]): m for m in ROW.findall(plain)}
    assert sorted(rows) == [0, 1, 2], plain[-3000:]
    for v, ev in evals.items():
        assert rows[v][1] == ev["policy_version"] and rows[v][2] == f"{ev['success_rate']:.3f}"
        assert f"version {v}: held-out success {ev['success_rate']:.3f}" in plain
    # each row printed once its version was evaluated: before the next iteration's collection
    assert plain.index(rows[0][1] + "  ") < plain.index("iteration 1: collect")

    weights = WeightStore(str(root))
    png = weights.loc.cat(weights.run_file("w", PICTURE), weights.retry)
    assert png_points(png) == {"version": [0, 1, 2], "success": [evals[v]["success_rate"] for v in range(3)]}

    # the finished loop reruns from its records: nothing starts, the same rows
    t0 = time.perf_counter()
    code, raw = _run_in_pty(_command(root), env, tmp_path, timeout=120)
    rerun_s = time.perf_counter() - t0
    again = strip_ansi(raw.decode("utf-8", errors="replace"))
    assert code == 0, again[-3000:]
    assert "starting the model server" not in again and "(recorded)" not in again
    # one line for the reused steps (it said four per iteration, tests/test_loop_lines.py)
    assert "train loop w: finished, nothing to do: iterations 0-1 and the evaluations of versions 0-2 recorded" in again
    assert {int(m[0]): m[1:3] for m in ROW.findall(again)} == {v: m[1:3] for v, m in rows.items()}
    print(f"finished loop reran in {rerun_s:.2f} s")


@pytest.mark.integration  # starts the embedded model server
@pytest.mark.timeout(300)
@pytest.mark.needs("torch")  # a LocalCritic
def test_focus_train_into_a_pipe_says_each_stage(tmp_path):
    """``nohup focus train > out 2>&1``: nothing came until the loop's table, hours
    later for a real loop; now a line per stage and the collections' own lines, as
    ``focus collect`` prints into a pipe, and no bar or colour."""
    from fixtures.prefect import base_env

    root = tmp_path / "store"
    cmd = _command(root)
    done = subprocess.run(cmd, cwd=tmp_path, env=base_env(tmp_path / "p"), capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "\x1b" not in done.stdout + done.stderr and "━" not in done.stderr
    # stage lines and the collections' wave lines, each once
    lines = done.stderr.splitlines()
    for i in range(2):  # two iterations; the third record is the last version's evaluation
        assert lines.count(f"iteration {i}: collect w-it{i}") == 1, done.stderr[-3000:]
        assert sum(ln.startswith(f"iteration {i}: trained ") for ln in lines) == 1, done.stderr[-3000:]
        assert lines.index(f"iteration {i}: train with the local trainer") < lines.index(
            next(ln for ln in lines if ln.startswith(f"iteration {i}: trained "))
        )
        assert sum(ln.startswith(f"iteration {i}: publish version {i + 1} ") for ln in lines) == 1
    assert sum(ln.startswith("0.evidence: ") and "transitions" in ln for ln in lines) == 2, done.stderr[-3000:]
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [r["iteration"] for r in records] == [0, 1, 2]
    # each evaluation: a line as it begins, its episode count every 10 s (if it runs that long), its result
    counts = re.compile(r"version \d+: evaluate \d+/4 episodes$")
    assert [ln for ln in lines if ln.startswith("version ") and not counts.match(ln)] == [
        line
        for r in records
        for line in (
            f"version {r['iteration']}: evaluate on 4 held-out tasks",
            f"version {r['iteration']}: held-out success {r['eval']['success_rate']:.3f}",
        )
    ]
    # the picture is written all the same
    from storage.weights import WeightStore

    weights = WeightStore(str(root))
    got = png_points(weights.loc.cat(weights.run_file("w", PICTURE), weights.retry))
    assert got["success"] == [r["eval"]["success_rate"] for r in records]


@pytest.mark.timeout(400)
@pytest.mark.needs("torch")  # a LocalCritic
def test_the_flow_publishes_the_picture_as_an_artifact(prefect_api, tmp_path):
    """On the Prefect path the picture is also an artifact of the run, with a table, and
    off a terminal the stage lines are in the run's log (what the UI shows)."""
    import asyncio
    import base64

    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogHandler

    from flows.train_loop import train_loop

    async def run() -> tuple[object, list[dict[str, object]]]:
        state = await train_loop(
            small(tmp_path / "store", **{"train.iterations": 1, "progress": True}), return_state=True
        )
        await APILogHandler.aflush()  # the run's log lines are sent in batches
        return state.state_details.flow_run_id, await state.result()

    run_id, records = asyncio.run(run())

    async def artifacts() -> dict[str, object]:
        async with get_client() as client:
            found = await client.read_artifacts(
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["w-success", "w-success-plot"]))
            )
        return {a.key: a.data for a in found}

    async def logged() -> list[str]:
        async with get_client() as client:
            found = await client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])))
        return [g.message for g in found]

    messages = asyncio.run(logged())
    for line in (
        r"iteration 0: collect w-it0",
        r"iteration 0: trained \d+ steps?, loss",
        r"version 1: held-out success",
    ):
        assert any(re.match(line, m) for m in messages), (line, messages)

    got = asyncio.run(artifacts())
    table = got["w-success"]
    rows = json.loads(table) if isinstance(table, str) else table
    assert [(r["version"], r["held_out_success"]) for r in rows] == success_points(records)
    body = re.search(r"data:image/png;base64,([A-Za-z0-9+/=]+)", str(got["w-success-plot"]))
    assert body is not None
    assert png_points(base64.b64decode(body.group(1)))["success"] == [s for _, s in success_points(records)]
