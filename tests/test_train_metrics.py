"""What a train loop records per iteration and what it does when an update diverges:
the on-policy mean return of each batch (its rollouts from the root), the gradient
norm of each policy update, one ``metrics.jsonl`` line per iteration beside the weights,
and a non-finite update refused before anything is written or recorded."""

from __future__ import annotations

import errno
import json
import math
from io import StringIO
from pathlib import Path

import pytest
from rich.console import Console
from test_collector import synthetic
from test_train_local import _toy_batch
from test_train_watch import small

from flows.errors import one_line
from flows.loop import train_body
from flows.loop_progress import METRICS, LoopProgress, metrics_row, row_cells
from focus.testing import run
from focus.train_local import PolicyTrainer, TrainingDiverged, UpdateConfig, UpdateStep, train_iteration
from storage import CheckpointStore
from storage.errors import StorageFull


def _path_return(tree, rollout: int) -> float:
    """The rewards met walking from the root along ``rollout``'s own edges to its leaf."""
    node, total = tree.ROOT, 0.0
    while True:
        nxt = [e for e in tree.child_edges(node) if e.rollout == rollout]
        if not nxt:
            return total
        total += sum(nxt[0].rewards)
        node = nxt[0].child


def test_a_batch_records_the_mean_return_of_its_rollouts_from_the_root():
    col, tasks, _ = synthetic()
    state = run(col.search(tasks))
    batch = col.prepare(state)
    roots = [(t, r.rollout) for t in state.trees for r in t.log if r.phase == 0 and not r.failed]
    assert all(r.node == t.ROOT for t in state.trees for r in t.log if r.phase == 0)
    assert len(roots) == batch.stats["phases"][0]["rollouts"] == 9  # 3 tasks x 3 evidence rollouts
    # a continuation may start at a root too: search chose it, so it is left out
    assert any(r.node == t.ROOT and r.phase == 1 for t in state.trees for r in t.log)
    returns = [_path_return(t, r) for t, r in roots]
    assert batch.stats["evidence_rollouts"] == 9
    assert batch.stats["return_mean"] == pytest.approx(sum(returns) / 9, abs=1e-12)
    assert len(set(returns)) > 1  # a mean of different returns, not a constant
    assert batch.summary()["return_mean"] == batch.stats["return_mean"]  # what the loop's record carries


def test_each_step_reports_its_gradient_norm_before_the_clip():
    batch = _toy_batch(0, [("7", 1.0), ("3", -1.0), ("8", 0.5)])
    seen: list[UpdateStep] = []
    clipped: list[UpdateStep] = []
    stats = PolicyTrainer(config=UpdateConfig(rule="adam", target_kl=None, lr=3e-3, epochs=2, minibatch=2)).update(
        batch, seen.append
    )
    PolicyTrainer(
        config=UpdateConfig(rule="adam", target_kl=None, lr=3e-3, epochs=2, minibatch=2, max_grad_norm=1e-3)
    ).update(batch, clipped.append)
    assert len(seen) == 4 and all(s.grad_norm > 0 for s in seen)
    assert stats.grad_norm == pytest.approx(sum(s.grad_norm for s in seen) / 4, rel=1e-12)
    # the first step's gradient is the same whatever the clip: its norm is taken before it
    assert clipped[0].grad_norm == seen[0].grad_norm > 1.0


def test_a_diverging_update_raises_before_writing_weights(tmp_path):
    batch = _toy_batch(0, [("7", 1.0), ("3", -1.0), ("8", 0.5)])
    trainer = PolicyTrainer(
        config=UpdateConfig(rule="adam", target_kl=None, lr=1e6, epochs=4, minibatch=1, max_grad_norm=1e9)
    )
    with pytest.raises(TrainingDiverged, match="lower the learning rate") as got:
        train_iteration(trainer, None, batch, tmp_path / "policy.pt")
    assert one_line(got.value) == str(got.value)  # shown as it is, one line
    assert "\n" not in str(got.value)


def diverging_trainer(batch_url, ctx, **options):
    """A trainer whose update diverges (what ``train_body`` must not record)."""
    raise TrainingDiverged("policy update diverged at step 2 of 6: loss nan")


def test_a_diverged_step_is_not_recorded_and_names_its_iteration(tmp_path):
    cfg = small(tmp_path, **{"train.trainer": "test_train_metrics:diverging_trainer"})
    latest = {"weights": None, "policy_version": "v0", "critic": None, "state": None}
    with pytest.raises(TrainingDiverged, match=r"^iteration 3: policy update diverged at step 2 of 6"):
        train_body(cfg, "w", 3, "file:///nowhere", latest)
    assert not CheckpointStore(str(tmp_path)).exists("w", "train", 3)  # a rerun trains it again


def trainer_over_the_limit(batch_url, ctx, **options):
    """A trainer whose weights file passes the file-size limit as it is written in its work
    folder: ``Path.write_bytes`` raises EFBIG naming no file (what the local trainer met
    under ``ulimit -f 1100``)."""
    Path(ctx.workdir, "policy.pt").write_bytes(b"")  # the folder is there to write in
    raise OSError(errno.EFBIG, "File too large")


def trainer_out_of_space(batch_url, ctx, **options):
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize(
    "trainer, what",
    [
        ("trainer_over_the_limit", "File too large: past the file-size limit"),
        ("trainer_out_of_space", "no space left on the device (or quota exceeded)"),
    ],
)
def test_a_trainer_that_fills_its_disk_names_its_work_folder_and_what_to_do(tmp_path, trainer, what):
    """`focus train` under `ulimit -f 1100` stopped with `error: OSError: [Errno 27] File
    too large`: no file, no folder, no advice (the local trainer writes policy.pt in its
    work folder, under the temporary folder, not in the store). A full disk there said
    `no space left on the device; free space and rerun to resume`, naming nothing either.
    The line names the work folder, how to move it, and that the rerun trains again."""
    cfg = small(tmp_path, **{"train.trainer": f"test_train_metrics:{trainer}"})
    latest = {"weights": None, "policy_version": "v0", "critic": None, "state": None}
    with pytest.raises(StorageFull) as got:
        train_body(cfg, "w", 3, "file:///nowhere", latest)
    line = one_line(got.value)
    assert line.startswith("iteration 3: the trainer cannot write in its work folder ") and what in line, line
    assert "focus-train" in line and "set TMPDIR to move it" in line, line
    assert line.endswith("then rerun to resume: the loop trains iteration 3 again"), line
    assert not CheckpointStore(str(tmp_path)).exists("w", "train", 3)


def _record(i: int) -> dict:
    return {
        "run_id": "w",
        "iteration": i,
        "policy_version": f"v{i}",
        "stats": {"transitions": 300 + i, "return_mean": 0.25 * i, "evidence_rollouts": 32, "wall_s": 1.5, "tasks": 8},
        "train": {
            "policy_version": f"v{i + 1}",
            "metrics": {"train_loss": 0.1, "train_final_kl": 0.01, "train_grad_norm": 1.2},
            "wall_s": 2.0,
            "reused": i == 0,
        },
    }


def test_metrics_rows_are_flat_and_carry_what_the_records_hold():
    row = metrics_row({**_record(1), "eval": {"success_rate": 0.5, "mean_return": 0.4, "episodes": 8}})
    assert row == {
        "run_id": "w",
        "iteration": 1,
        "policy_version": "v1",
        "return_mean": 0.25,
        "evidence_rollouts": 32,
        "transitions": 301,
        "collect_wall_s": 1.5,
        "trained_policy_version": "v2",
        "train_loss": 0.1,
        "train_final_kl": 0.01,
        "train_grad_norm": 1.2,
        "train_wall_s": 2.0,
        "eval_success_rate": 0.5,
        "eval_mean_return": 0.4,
        "eval_episodes": 8,
    }
    assert row_cells(_record(1))[3] == "0.250"  # the table's return column


def test_each_iteration_rewrites_the_runs_metrics_file(tmp_path):
    show = LoopProgress(small(tmp_path), enabled=False, console=Console(file=StringIO()))
    for i in (0, 1):
        show.row(_record(i))
    assert show.metrics is not None and show.metrics.endswith(f"/weights/w/{METRICS}")
    lines = Path(show.metrics.removeprefix("file://")).read_text(encoding="utf-8").splitlines()
    rows = [json.loads(x) for x in lines]
    assert [r["iteration"] for r in rows] == [0, 1] and rows[1]["return_mean"] == 0.25
    # a resumed loop shows every record again, from the first: the same file
    again = LoopProgress(small(tmp_path), enabled=False, console=Console(file=StringIO()))
    for i in (0, 1):
        again.row(_record(i))
    assert Path(again.metrics.removeprefix("file://")).read_text(encoding="utf-8").splitlines() == lines
    assert all(math.isfinite(r["train_grad_norm"]) for r in rows)


def test_inspect_shows_a_loops_metrics(tmp_path):
    from typer.testing import CliRunner

    from cli.app import app

    show = LoopProgress(small(tmp_path), enabled=False, console=Console(file=StringIO()))
    for i in (0, 1):
        show.row(_record(i))
    out = CliRunner().invoke(app, ["inspect", f"{tmp_path}/weights/w"], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert lines[0] == "train loop w: 2 trained iteration(s)"
    assert lines[1].split() == ["iteration", "return", "transitions", "loss", "kl", "clip", "grad", "norm"] + [
        "collect",
        "s",
        "train",
        "s",
        "held-out",
    ]
    assert lines[3].split() == ["1", "0.25", "301", "0.1", "0.01", "-", "1.2", "1.5", "2", "-"]
    rows = CliRunner().invoke(app, ["inspect", f"{tmp_path}/weights/w", "--json"]).output.splitlines()
    assert [json.loads(r)["iteration"] for r in rows] == [0, 1]
    missing = CliRunner().invoke(app, ["inspect", f"{tmp_path}/weights/nope"])
    assert missing.exit_code == 1 and "no train loop 'nope'" in missing.output


def test_inspect_shows_no_grad_norm_for_a_one_step_rule(tmp_path):
    """The default rule (``sgd``, one step sized to the target KL) measures no gradient
    norm and records 0: ``focus inspect`` of every default loop showed "grad norm 0" on
    each trained iteration, read as a zero gradient, where the live line shows none."""
    from typer.testing import CliRunner

    from cli.app import app

    show = LoopProgress(small(tmp_path), enabled=False, console=Console(file=StringIO()))
    record = _record(1)
    record["train"]["metrics"] = {**record["train"]["metrics"], "train_grad_norm": 0.0}
    show.row(record)
    out = CliRunner().invoke(app, ["inspect", f"{tmp_path}/weights/w"], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert out.output.splitlines()[2].split() == ["1", "0.25", "301", "0.1", "0.01", "-", "-", "1.5", "2", "-"]


def test_the_trained_line_shows_kl_clip_and_grad_norm(tmp_path):
    show = LoopProgress(small(tmp_path), enabled=False, console=Console(file=StringIO()))
    metrics = {"train_steps": 6.0, "train_loss": 0.2322, "train_final_kl": 0.02276, "train_clip_fraction": 0.14}
    show.trained(0, {"metrics": {**metrics, "train_grad_norm": 1.134}, "wall_s": 4.41})
    show.trained(1, {"metrics": {**metrics, "train_grad_norm": 0.0}, "reused": True})  # a one-step rule: no norm
    show.release()  # a reused step's line is held back until then (tests/test_loop_lines.py)
    assert show.lines == [
        "iteration 0: trained 6 steps, loss 0.2322, kl 0.0228, clip 0.14, grad norm 1.13 (4.4 s)",
        "iteration 1: trained 6 steps, loss 0.2322, kl 0.0228, clip 0.14 (recorded)",
        "iteration 1's training: recorded, reused",
    ]


def test_inspect_of_a_loop_before_its_first_iteration_ends_says_so(tmp_path):
    """`focus inspect <root>/weights/L` while a loop is in its first iteration (no
    metrics.jsonl yet) said `cannot read the metrics ...: FileNotFoundError: [Errno 2]
    ...`, as for a loop that does not exist; each is now told apart in one line, exit 1."""
    from typer.testing import CliRunner

    from cli.app import app
    from tasks.loop_settings import settle

    settle(small(tmp_path))  # the loop's first run records its settings before its first iteration
    begun = CliRunner().invoke(app, ["inspect", f"{tmp_path}/weights/w"], env={"COLUMNS": "400"})
    assert begun.exit_code == 1, begun.output
    assert begun.output.strip() == (
        f"error: train loop 'w' under {tmp_path} has no finished iteration yet: its metrics are written as each "
        "iteration ends"
    ), begun.output
    missing = CliRunner().invoke(app, ["inspect", f"{tmp_path}/weights/nope"], env={"COLUMNS": "400"})
    assert missing.exit_code == 1 and missing.output.strip() == (
        f"error: no train loop 'nope' under {tmp_path} (no records of it, no file://{tmp_path}/weights/nope/metrics.jsonl)"
    ), missing.output


def test_metrics_rows_carry_the_batchs_parse_and_tool_errors():
    """The batch's statistics count parse errors and tool errors (the rollouts' usage
    records summed once); an iteration's ``metrics.jsonl`` line left them out. The
    row reads them from the record's stats as the collection step returned them
    (``Batch.summary()``), not counted again."""
    from fixtures.failing import ToolFailsReachTarget

    from focus.agent import Agent
    from focus.collector import Collector
    from focus.critic import ConstantCritic
    from focus.execution import Execution
    from focus.priority import Phase, Selective
    from focus.testing import ScriptedPolicy
    from focus.toy import reach_target_tasks, toy_format

    fmt = toy_format()
    policy = ScriptedPolicy(["3", "what?", "4", "2", "no", "5"], fmt.codec)  # "what?" and "no" do not parse
    phases = (Phase("evidence", rollouts_per_task=2), Phase("continue", transitions=8, wave_size=2))
    agent = Agent(policy, ToolFailsReachTarget(), fmt, max_steps=6)
    col = Collector(agent, Selective(phases=phases), ConstantCritic(0.5), execution=Execution(max_concurrency=1))
    summary = col.prepare(run(col.search(reach_target_tasks(2, seed=0)))).summary()
    assert summary["parse_errors"] > 0 and summary["tool_errors"] > 0
    row = metrics_row({**_record(1), "stats": {**summary, "wall_s": 1.5}})
    assert (row["parse_errors"], row["tool_errors"]) == (summary["parse_errors"], summary["tool_errors"])
    # the same record, not a recount: whatever the stats say is what the row says
    row = metrics_row({**_record(1), "stats": {**summary, "parse_errors": 7, "tool_errors": 11}})
    assert (row["parse_errors"], row["tool_errors"]) == (7, 11)
