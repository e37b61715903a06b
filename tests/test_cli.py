"""The focus command: the embedded default end to end (quietly), reruns and errors
decided before anything starts, inspect, and help that says what the defaults are."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fixtures.prefect import ROOT, base_env, free_port, from_template
from typer.testing import CliRunner

from cli.app import app
from cli.collect import SHOWN

pytestmark = pytest.mark.timeout(240)

SMALL = ["--tasks", "2", "--transitions", "6", "--set", "agent.sampling.max_tokens=8", "--set", "agent.max_steps=4"]


def focus(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 220) -> subprocess.CompletedProcess[str]:
    """The command as the console script runs it (``python -m cli`` is the same entry)."""
    return subprocess.run(
        [sys.executable, "-m", "cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.integration
def test_collect_embedded_default_quietly_then_rerun_and_inspect(prefect_template, tmp_path):
    """No model, no Prefect server, no Dask: the model starts locally and the steps run
    without an orchestrator (no server to keep the run); the console shows the result
    and nothing of the logging, which is in the log file. ``--prefect`` runs the same
    collection as a flow on a temporary Prefect server, whose home holds the session's
    migrated database (:func:`fixtures.prefect.from_template`: a fresh home migrated it
    first, 5-15 s more; a first run on a fresh home: tests/test_server_orphans.py and
    tests/test_cli_machine.py)."""
    env = {**base_env(from_template(prefect_template, tmp_path / "prefect")), "PREFECT_LOGGING_LEVEL": "INFO"}
    log = tmp_path / "collect.log"
    done = focus(["collect", *SMALL, "--collection-id", "emb", "--json", "--log-file", str(log)], env, tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["batch_url"] == f"file://{os.path.realpath(tmp_path)}/runs/batches/emb/iter-000000"
    assert result["stats"]["transitions"] >= 6 and result["stats"]["failed_rollouts"] == 0
    for chatter in ("INFO", "distributed", "Traceback", "temporary server", "prefect"):
        assert chatter not in done.stderr, done.stderr
    assert len(done.stdout.strip().splitlines()) == 1  # --json: the result alone on standard output
    text = log.read_text(encoding="utf-8")
    assert "collection emb: batch at" in text and "flow run" not in text
    # a named collection may be finished: its model server starts after the preflight,
    # not in the console entry (tests/test_finished_rerun.py has a new one's early start)
    assert "model server ready at" in text and "(started by the console entry)" not in text, text
    assert text.count("start-up:") == 1 and text.count("shut-down:") == 1, text  # the command's, not twice

    # the same collection as a Prefect flow (a temporary server): the same batch
    flow_log = tmp_path / "flow.log"
    as_flow = focus(
        ["collect", *SMALL, "--collection-id", "emb-flow", "--json", "--prefect", "--log-file", str(flow_log)],
        env,
        tmp_path,
    )
    assert as_flow.returncode == 0, as_flow.stderr[-3000:]
    flowed = json.loads(as_flow.stdout.strip().splitlines()[-1])
    text = flow_log.read_text(encoding="utf-8")
    assert "Beginning flow run 'emb-flow'" in text and "Finished in state Completed" in text
    assert text.count("start-up:") == 1 and text.count("shut-down:") == 1, text
    for chatter in ("INFO", "distributed", "Traceback", "temporary server", "prefect"):
        assert chatter not in as_flow.stderr, as_flow.stderr
    from storage import BatchStore

    a, b = (
        BatchStore(str(tmp_path / "runs")).read(result["batch_url"]),
        BatchStore(str(tmp_path / "runs")).read(flowed["batch_url"]),
    )
    assert [(r.completion_ids, r.logprobs, r.advantage) for r in a.actor] == [
        (r.completion_ids, r.logprobs, r.advantage) for r in b.actor
    ]

    # the rerun is decided from the store: nothing starts (the API URL is a closed port)
    rerun_env = {**env, "PREFECT_API_URL": f"http://127.0.0.1:{free_port()}/api"}
    again = focus(["collect", *SMALL, "--collection-id", "emb", "--json"], rerun_env, tmp_path, timeout=60)
    assert again.returncode == 0, again.stderr[-3000:]
    rerun = json.loads(again.stdout.strip().splitlines()[-1])
    assert rerun["already_finished"] is True and rerun["batch_url"] == result["batch_url"]
    mismatch = focus(["collect", *SMALL, "--collection-id", "emb", "--seed", "5"], rerun_env, tmp_path, timeout=60)
    lines = (mismatch.stdout + mismatch.stderr).strip().splitlines()
    assert mismatch.returncode == 2 and len(lines) == 1 and "differs in: seed" in lines[0], lines

    out = CliRunner().invoke(app, ["inspect", result["batch_url"], "--json"])
    assert out.exit_code == 0, out.output
    summary = json.loads(out.output)
    assert summary["actor_rows"] == result["stats"]["actor_rows"] > 0
    assert summary["policy_versions"] and summary["phases"][1]["name"] == "continue"
    wide = CliRunner().invoke(app, ["inspect", result["batch_url"]], env={"COLUMNS": "250"})
    # every phase, every figure, nothing cut
    assert "actor_rows" in wide.output and "advantage_mean" in wide.output
    assert "evidence" in wide.output and "continue" in wide.output and "transition_budget" in wide.output
    folder = result["batch_url"].rsplit("/", 1)[0]
    listing = CliRunner().invoke(app, ["inspect", folder, "--json"])
    assert listing.exit_code == 0, listing.output
    its = json.loads(listing.output)["iterations"]
    assert [(i["iteration"], i["url"]) for i in its] == [(0, result["batch_url"])]
    assert its[0]["actor_rows"] == summary["actor_rows"]
    assert "1 finished iteration" in CliRunner().invoke(app, ["inspect", folder], env={"COLUMNS": "250"}).output


@pytest.mark.parametrize(
    ("argv", "starts"),
    [
        (["collect"], True),
        (["collect", "--tasks", "2", "-c", "x.toml"], True),
        (["collect", "--model-url", "http://127.0.0.1:1"], False),
        (["collect", "--model-url=http://127.0.0.1:1"], False),
        (["collect", "--help"], False),
        # a named collection may be finished, which its preflight answers without a server
        (["collect", "--collection-id", "c"], False),
        (["collect", "--collection-id=c"], False),
        (["collect", "--set", "collection_id=c"], False),
        (["train"], False),
        (["inspect", "runs"], False),
        ([], False),
    ],
)
def test_only_a_collection_that_may_use_the_embedded_model_starts_it_early(argv, starts):
    from cli.entry import wants_embedded_model

    assert wants_embedded_model(argv, env={}) is starts
    assert wants_embedded_model(["collect"], env={"FOCUS_COLLECTION_ID": "c"}) is False


def test_a_config_file_names_a_collection_only_outside_its_comments(tmp_path):
    """configs/collect.toml's commented ``# collection_id = "demo"`` names nothing: a new
    collection from it gets the early model server."""
    from cli.entry import wants_embedded_model

    collect_toml = Path(__file__).resolve().parent.parent / "configs" / "collect.toml"
    assert wants_embedded_model(["collect", "-c", str(collect_toml)], env={}) is True
    named = tmp_path / "named.yaml"
    named.write_text("seed: 3\ncollection_id: nightly  # resumed by name\n")
    assert wants_embedded_model(["collect", "--config", str(named)], env={}) is False


def test_invalid_config_fails_before_any_work(tmp_path):
    out = CliRunner().invoke(
        app, ["collect", "--set", "search.phases.1.wave_size=0", "--store", str(tmp_path / "s")], env={}
    )
    assert out.exit_code == 2
    assert "search.phases.1.wave_size: Input should be greater than or equal to 1" in out.output
    assert len(out.output.strip().splitlines()) == 1
    assert not (tmp_path / "s").exists()
    out = CliRunner().invoke(app, ["collect", "--set", "nokey"])
    assert out.exit_code == 2 and "expected KEY=VALUE" in out.output


@pytest.mark.parametrize(
    "argv,expected",
    [
        (["collect", "--tasks", "0"], "env.n_tasks: Input should be greater than 0 (from --tasks)"),
        (["collect", "--transitions", "-5"], "search.phases.1.transitions: Input should be greater than or equal to 0 (from --transitions)"),
        (["collect", "--set", "env.n_tasks=3", "--tasks", "0"], "(from --tasks)"),  # the flag wins, and is named
        (["collect", "--set", "env.n_tasks=0"], "env.n_tasks: Input should be greater than 0 (from --set env.n_tasks)"),
        (["train", "--iterations", "0"], "train.iterations: Input should be greater than 0 (from --iterations)"),
        (["train", "--tasks", "0"], "(from --tasks)"),
    ],
)  # fmt: skip
def test_a_bad_value_names_the_flag_the_user_gave(argv, expected, tmp_path):
    out = CliRunner().invoke(app, [*argv, "--store", str(tmp_path / "s")], env={})
    assert out.exit_code == 2 and expected in out.output, out.output
    assert len(out.output.strip().splitlines()) == 1 and not (tmp_path / "s").exists()


def test_deploy_to_a_prefect_server_that_does_not_answer_says_so_in_one_line():
    api = f"http://127.0.0.1:{free_port()}/api"  # nothing listens there
    out = CliRunner().invoke(app, ["deploy"], env={"PREFECT_API_URL": api})
    lines = out.output.strip().splitlines()
    assert out.exit_code == 1 and len(lines) == 1, out.output
    assert lines[0].startswith(f"error: the Prefect server at {api} did not answer (ConnectError")
    assert lines[0].endswith("start it or set PREFECT_API_URL, then run focus deploy again")


def test_deploy_refuses_a_watchdog_that_would_crash_healthy_runs(tmp_path):
    """``--crash-after 10`` (Prefect's shortest trigger) with the default 10 s heartbeats:
    one heartbeat a moment late marked a running collection Crashed (measured: 10.4 s
    after it started, in tests/test_deploy.py), so it is refused before anything is
    registered; with heartbeats every 5 s it passes (and meets the absent server)."""
    api = f"http://127.0.0.1:{free_port()}/api"  # nothing listens there
    out = CliRunner().invoke(app, ["deploy", "--crash-after", "10"], env={"PREFECT_API_URL": api})
    lines = out.output.strip().splitlines()
    assert out.exit_code == 2 and len(lines) == 1, out.output
    assert "--crash-after 10 would mark healthy runs Crashed: they send a heartbeat every 10 s" in lines[0]
    assert "use --crash-after 20 or more, or a heartbeat_s of 5 or less" in lines[0]
    cfg = tmp_path / "c.toml"
    cfg.write_text("[execution]\nheartbeat_s = 20\n")  # one deployment's file is enough to refuse
    out = CliRunner().invoke(app, ["deploy", "--manual-config", str(cfg)], env={"PREFECT_API_URL": api})
    assert out.exit_code == 2 and "--crash-after 30 would mark healthy runs Crashed" in out.output, out.output
    faster = ["deploy", "--crash-after", "10", "--set", "execution.heartbeat_s=5"]
    out = CliRunner().invoke(app, faster, env={"PREFECT_API_URL": api})
    assert out.exit_code == 1 and "did not answer" in out.output, out.output
    out = CliRunner().invoke(app, ["deploy", "--crash-after", "0"], env={"PREFECT_API_URL": api})
    assert out.exit_code == 1 and "did not answer" in out.output, out.output  # no watchdog, nothing to check


@pytest.mark.integration  # starts (tries to start) the embedded model server
def test_serve_model_that_cannot_start_says_why_in_one_line(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = CliRunner().invoke(app, ["serve-model", "--port", str(port)])
    lines = out.output.strip().splitlines()
    assert out.exit_code == 1 and len(lines) == 1, out.output
    assert "Address already in use" in lines[0] and f"127.0.0.1:{port}" in lines[0] and "--port" in lines[0]
    out = CliRunner().invoke(app, ["serve-model", "--port", "0", "--weights", str(tmp_path / "none.pt")])
    lines = out.output.strip().splitlines()
    assert out.exit_code == 1 and len(lines) == 1, out.output
    assert "no tinylm weights file at" in lines[0]


@pytest.mark.parametrize("port", ["-1", "65536"])
def test_serve_model_with_a_port_out_of_range_is_one_line_exit_2(port):
    """A port out of range started the server process, which failed with
    'OverflowError: bind(): port must be 0-65535.', exit 1."""
    out = CliRunner().invoke(app, ["serve-model", "--port", port])
    assert (out.exit_code, out.output) == (2, f"error: --port {port}: a port is 0-65535 (0 picks a free one)\n")


def test_inspect_names_a_missing_batch_and_a_bad_url(tmp_path):
    out = CliRunner().invoke(app, ["inspect", f"file://{tmp_path}/batches/none/iter-000000"])
    assert out.exit_code == 1 and "cannot read batch" in out.output and "_manifest.json is missing" in out.output
    out = CliRunner().invoke(app, ["inspect", f"file://{tmp_path}/batches/none"])
    assert out.exit_code == 1 and "no finished batch" in out.output
    out = CliRunner().invoke(app, ["inspect", str(tmp_path)])
    assert out.exit_code == 2 and "neither a batch URL" in out.output


def test_inspect_of_a_store_root_says_so_and_names_what_it_holds(tmp_path):
    """A store root (``runs``, what ``--store`` names) got the line for a bad URL, which
    said nothing of the collections and loops right under it."""
    for part in ("batches/c2/iter-000000", "batches/c1/iter-000000", "weights/loop1/v000000", "_staging/x"):
        (tmp_path / part).mkdir(parents=True)
    (tmp_path / "weights" / "loop1" / "metrics.jsonl").write_text("")
    root = shlex.quote(str(tmp_path))  # the tests' folder has a space: quoted, ready to paste
    both = (
        f"it holds 2 collection(s): c1, c2 (focus inspect {root}/batches/<id>) and "
        f"1 train loop(s): loop1 (focus inspect {root}/weights/<id>)"
    )
    out = CliRunner().invoke(app, ["inspect", str(tmp_path), "--json"])
    assert out.exit_code == 2, out.output
    assert out.output == f"error: {tmp_path} is a store root, not a batch, a collection or a train loop; {both}\n"
    out = CliRunner().invoke(app, ["inspect", f"{tmp_path}/batches/", "--json"])
    assert out.exit_code == 2, out.output
    assert out.output == (
        f"error: {tmp_path}/batches/ is the batches folder of the store {tmp_path} (a folder of batches per "
        f"collection), not a collection itself; it holds 2 collection(s): c1, c2 (focus inspect {root}/batches/<id>); "
        f"the store also holds 1 train loop(s): loop1 (focus inspect {root}/weights/<id>)\n"
    )
    for i in range(3, 12):
        (tmp_path / "batches" / f"c{i}").mkdir()
    out = CliRunner().invoke(app, ["inspect", str(tmp_path)], env={"COLUMNS": "400"})
    assert "11 collection(s): c1, c10, c11, c2, c3, c4, c5, c6 and 3 more (" in out.output, out.output


@pytest.mark.parametrize("command", ["collect", "deploy", "train", "inspect", "serve-model"])
def test_help_shows_no_placeholder_for_flags_and_says_the_defaults(command):
    out = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "250", "NO_COLOR": "1"})
    assert out.exit_code == 0, out.output
    assert "<bool>" not in out.output
    if command == "collect":
        for option, default in (
            ("--tasks", "8"),
            ("--seed", "0"),
            ("--transitions", "200"),
            ("--model-timeout", "120.0"),
        ):
            line = next(ln for ln in out.output.splitlines() if option in ln)
            assert f"[default: {default}]" in line, line
        assert re.search(r"--json\s+Print", out.output)  # a flag: no type placeholder
    if command == "deploy":
        assert "[default: 1]" in next(ln for ln in out.output.splitlines() if "--limit" in ln)


def test_every_statistic_shown_is_defined_in_the_docs():
    """Each figure the CLI shows has a line saying what it means (docs/pipeline.md, "The statistics")."""
    text = (ROOT / "docs" / "pipeline.md").read_text(encoding="utf-8")
    section = text[text.index("### The statistics") :]
    for name in (
        *SHOWN,
        "failure_causes",
        "already_finished",
        "policy_versions",
        "advantage_mean",
        "critic_target_mean",
    ):
        assert re.search(rf"^\| `{name}` \| \w|`{name}`\s*(and `\w+`\s*)?\(", section, re.M), f"{name} is not defined"


def test_the_configured_prefect_server_is_found_without_importing_prefect(tmp_path):
    from flows.server import configured_api_url

    assert configured_api_url({"PREFECT_API_URL": "http://a:1/api"}) == "http://a:1/api"
    home = tmp_path / "home"
    home.mkdir()
    (home / "profiles.toml").write_text(
        'active = "team"\n[profiles.team]\nPREFECT_API_URL = "http://prefect.internal:4200/api"\n[profiles.other]\n'
    )
    assert configured_api_url({"PREFECT_HOME": str(home)}) == "http://prefect.internal:4200/api"
    assert configured_api_url({"PREFECT_HOME": str(home), "PREFECT_PROFILE": "other"}) is None
    assert configured_api_url({"PREFECT_HOME": str(tmp_path / "none")}) is None


def test_quiet_mode_sends_dask_worker_processes_logs_to_the_log_file(tmp_path):
    """A worker process (a fresh interpreter importing distributed) started with the
    environment quiet mode sets logs into the command's log file, not on the terminal;
    a user's own DASK_LOGGING settings win."""
    from flows.logs import dask_workers_log_to

    log = tmp_path / "collect.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DASK_")}
    dask_workers_log_to(log, env)
    code = (
        "import logging, distributed; "
        "logging.getLogger('distributed.worker').error('Failed to communicate with scheduler during heartbeat.'); "
        "logging.getLogger('distributed.nanny').info('nanny chatter')"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    text = log.read_text(encoding="utf-8")
    assert "ERROR" in text and "during heartbeat" in text and "nanny chatter" in text
    mine = {"DASK_LOGGING__DISTRIBUTED": "error"}
    dask_workers_log_to(log, mine)
    assert mine == {"DASK_LOGGING__DISTRIBUTED": "error"}


_WITHOUT_TORCH = """
import sys


class _NoTorch:
    '''An install without the train extra: torch cannot be imported.'''

    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError("No module named 'torch'", name="torch")
        return None


sys.meta_path.insert(0, _NoTorch())
sys.argv = ["focus", *sys.argv[1:]]
from cli.entry import main

main()
"""


@pytest.mark.integration
def test_collecting_needs_no_torch_and_training_says_which_extra(tmp_path):
    """The embedded model's server and the collection run without torch (an install
    without the ``train`` extra); the local trainer is refused before anything starts,
    with the extra to install."""
    env = base_env(tmp_path / "prefect")
    store = str(tmp_path / "runs")
    cmd = [sys.executable, "-c", _WITHOUT_TORCH]
    done = subprocess.run(
        [*cmd, "collect", *SMALL, "--store", store, "--json", "--log-file", str(tmp_path / "c.log")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=220,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["stats"]["actor_rows"] > 0
    done = subprocess.run(
        [*cmd, "train", "--iterations", "1", "--set", f"storage.root={store}", "--log-file", str(tmp_path / "t.log")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, lines
    assert "train.trainer 'local' needs torch, which is not installed: pip install 'focus-rl[train]'" in lines[0]


@pytest.mark.integration
@pytest.mark.needs("torch")
def test_train_takes_the_collect_shorthands_as_their_fields(tmp_path, monkeypatch):
    """``focus train --store --seed --tasks --transitions`` set the same fields as
    ``focus collect``'s flags do (``storage.root``, ``seed``, ``env.n_tasks``, the last
    phase's budget): the loop's configuration with them is the one with ``--set``, field
    for field but the store (read in-process where the command hands it to the loop);
    and a real loop run with them writes under the store it names.

    Both were real ``focus train`` runs (85 s of a worker's time at load 12), whose
    records were compared; the same configuration makes the same loop run."""
    import cli.train

    small = ["--iterations", "1", "--collection-id", "t", "--json", "--set", "agent.sampling.max_tokens=8"]
    flags = ["--store", str(tmp_path / "flags"), "--seed", "5", "--tasks", "3", "--transitions", "12"]
    sets = [
        "--set", f"storage.root={tmp_path / 'set'}", "--set", "seed=5", "--set", "env.n_tasks=3",
        "--set", "search.phases.1.transitions=12",
    ]  # fmt: skip
    for key in [k for k in os.environ if k.upper().startswith(("FOCUS_", "PREFECT_API"))]:
        monkeypatch.delenv(key)  # as base_env leaves the command's environment
    handed: list[Any] = []
    monkeypatch.setattr(cli.train, "_run", lambda out, cfg, resume, **kw: handed.append(cfg) or [])
    for args in (flags, sets):
        out = CliRunner().invoke(app, ["train", *small, *args], catch_exceptions=False)
        assert out.exit_code == 0, out.output
    by_flags, by_set = handed
    roots = (by_flags.storage.root, by_set.storage.root)
    assert roots == (f"file://{tmp_path / 'flags'}", f"file://{tmp_path / 'set'}")
    assert by_flags.seed == 5 and by_flags.env.n_tasks == 3 and by_flags.search.phases[-1].transitions == 12
    assert by_flags.with_updates(**{"storage.root": by_set.storage.root}).model_dump() == by_set.model_dump()

    env = base_env(tmp_path / "prefect")
    done = focus(["train", *small, *flags, "--log-file", str(tmp_path / "flags.log")], env, tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    [record] = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    # the store's URLs are "file://" and the path as it is (fsspec reads them so):
    # Path.as_uri() writes a space as %20, and the test failed where TMPDIR had one
    assert record["batch_url"].startswith(f"file://{tmp_path / 'flags'}/"), record["batch_url"]
    assert record["stats"]["tasks"] == 3
    # the evidence phase's rollouts plus a continuation budget of 12, not the default 200
    assert record["stats"]["budget_spent"] < 3 * 4 * 6 + 12 + 6
    assert record["train"]["policy_version"]


def test_inspect_summarises_a_batch_from_its_columns_without_building_rows(tmp_path, monkeypatch):
    """``focus inspect`` built a typed row per actor and critic row to take a mean: for
    the 120k actor rows of a 100k-transition collection 1.6 s and 280 MB more than the
    read. The figures come from the Arrow columns now, and are the rows' to the bit."""
    import numpy as np

    import focus.batch as batch_mod
    from cli.inspect import batch_summary
    from focus.batch import ActorRow, Batch, CriticRow
    from storage import BatchStore

    advantages = [0.3, -1.25, 0.1, 0.7, -0.05]
    actor = [
        ActorRow("c", 0, f"t{i % 2}", "t#0", 0, i, 0, f"v{i % 2}", (1, 2), (3,), (-0.5,), (1,), a, 0.0, "stop")
        for i, a in enumerate(advantages)
    ]
    critic = [CriticRow("c", 0, "t0", "t#0", i, (1, 2), 0.1 * i + 0.05, 1.0, None) for i in range(3)]
    store = BatchStore(tmp_path)
    url = store.write(Batch("c", 0, actor, critic, {"transitions": 5}))

    def no_rows(*_: object) -> None:
        raise AssertionError("typed rows built")

    monkeypatch.setattr(batch_mod, "actor_rows", no_rows)
    monkeypatch.setattr(batch_mod, "critic_rows", no_rows)
    summary = batch_summary(store.read(url))
    adv, tgt = np.array(advantages), np.array([r.target for r in critic])
    assert summary["policy_versions"] == ["v0", "v1"]
    assert (summary["advantage_mean"], summary["advantage_std"]) == (float(adv.mean()), float(adv.std()))
    assert summary["critic_target_mean"] == float(tgt.mean()) and summary["actor_rows"] == 5


def test_the_resume_line_names_the_pythonpath_a_factory_was_found_through(monkeypatch):
    """`PYTHONPATH=examples/math focus collect --set env.kind=factory ...`, interrupted,
    printed a resume line without the PYTHONPATH: pasted into another shell it stopped
    with `cannot import module`. The line now starts with it when the configuration
    names the user's code, quoted for the shell; without such code it is left out."""
    import shlex

    from cli.common import resume_command
    from tasks.config import load_config

    sets = ["env.kind=factory", "env.factory=env:env_factory"]
    factory = load_config(overrides={"env.kind": "factory", "env.factory": "env:env_factory"}, environ={})
    monkeypatch.setenv("PYTHONPATH", "/srv/math:/opt/my envs")
    store = {"storage.root": "/data/st"}
    line = resume_command("collect", None, {"seed": 3, **store}, sets, None, "c1", factory)
    assert line == (
        "PYTHONPATH='/srv/math:/opt/my envs' focus collect --seed 3 --store /data/st "
        "--set env.kind=factory --set env.factory=env:env_factory --collection-id c1"
    )
    assert shlex.split(line)[0] == "PYTHONPATH=/srv/math:/opt/my envs"  # one assignment word
    trainer = load_config(overrides={"train.trainer": "mytrainers:train"}, environ={})
    assert resume_command("train", None, store, None, None, "L", trainer).startswith("PYTHONPATH=")
    toy = load_config(overrides={}, environ={})
    assert (
        resume_command("collect", None, store, None, None, "c1", toy)
        == "focus collect --store /data/st --collection-id c1"
    )
    monkeypatch.delenv("PYTHONPATH")
    assert resume_command("collect", None, {}, sets, None, "c1", factory).startswith("focus collect ")
    # an id given as --set is said once, as --collection-id (it was said both ways)
    named = ["collection_id=c1", "seed=4", "collection_id = c1", "storage.root=s3://b/p"]
    assert (
        resume_command("collect", None, {}, named, None, "c1", toy)
        == "focus collect --set seed=4 --set storage.root=s3://b/p --collection-id c1"
    )


def test_the_resume_line_works_from_any_folder(tmp_path, monkeypatch):
    """`focus collect -c configs/x.toml --store st` printed its `rerun or resume` line
    with the paths as typed: pasted in another folder it could not read the config file,
    or began a new collection in that folder's `./st` (`./runs` for the default store).
    Local paths are absolute now (the store named as `--store` where it came relative
    from the default, the file or a variable); URLs are kept as they are."""
    import shlex

    from cli.common import resume_command
    from tasks.config import load_config

    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "x.toml").write_text('[storage]\nroot = "from file"\n')
    monkeypatch.delenv("FOCUS_STORAGE__ROOT", raising=False)
    toy = load_config(overrides={}, environ={})

    def words(config: Path | None, flags: dict, sets: list[str] | None = None) -> list[str]:
        return shlex.split(resume_command("collect", config, flags, sets, None, "c1", toy))

    here = os.getcwd()  # tmp_path with its links resolved, as abspath gives it
    assert words(Path("configs/x.toml"), {"storage.root": "st"}) == [
        "focus", "collect", "-c", f"{here}/configs/x.toml", "--store", f"{here}/st", "--collection-id", "c1",
    ]  # fmt: skip
    # a store as --set, made absolute; a URL and an absolute path as typed
    assert words(None, {}, ["storage.root=my st", "seed=2"])[2:6] == [
        "--set",
        f"storage.root={here}/my st",
        "--set",
        "seed=2",
    ]
    assert words(None, {"storage.root": "s3://b/p"})[2:4] == ["--store", "s3://b/p"]
    assert words(None, {"storage.root": "/abs/st"})[2:4] == ["--store", "/abs/st"]
    # a store the command did not name, relative: the default, the config file's, a variable's
    assert words(None, {}) == ["focus", "collect", "--store", f"{here}/runs", "--collection-id", "c1"]
    assert words(Path("configs/x.toml"), {})[4:6] == ["--store", f"{here}/from file"]
    monkeypatch.setenv("FOCUS_STORAGE__ROOT", "v")
    assert words(None, {})[2:4] == ["--store", f"{here}/v"]
    # ... absolute or a URL already: the line stays short
    monkeypatch.setenv("FOCUS_STORAGE__ROOT", "memory://b/p")
    assert words(None, {}) == ["focus", "collect", "--collection-id", "c1"]
    monkeypatch.setenv("FOCUS_STORAGE__ROOT", "/abs/st")
    assert words(None, {}) == ["focus", "collect", "--collection-id", "c1"]
    # a factory found through a relative PYTHONPATH entry is found from anywhere too
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["examples/math", "/opt/x"]))
    factory = load_config(overrides={"env.kind": "factory", "env.factory": "env:env_factory"}, environ={})
    line = resume_command("collect", None, {}, None, None, "c1", factory)
    assert shlex.split(line)[0] == f"PYTHONPATH={here}/examples/math{os.pathsep}/opt/x", line


def test_stop_from_another_thread_ends_the_run_with_its_error():
    """What a command's work cannot go on without (its embedded model server gone for
    good, found by the server's keeper thread) stops the run as a first signal does,
    and the run ends with that error, not with a cancellation; after the work ended, or
    after a signal, it changes nothing."""
    import asyncio
    import threading

    from cli.interrupts import Interrupts

    started = threading.Event()

    async def forever() -> None:
        started.set()
        await asyncio.sleep(3600)

    stopper = Interrupts()
    gone = RuntimeError("the embedded model server is gone")
    threading.Thread(target=lambda: (started.wait(30), stopper.stop(gone)), daemon=True).start()
    with pytest.raises(RuntimeError, match="is gone") as raised:
        stopper.run(forever())
    assert raised.value is gone and isinstance(raised.value.__cause__, asyncio.CancelledError)

    async def done() -> int:
        return 7

    finished = Interrupts()
    assert finished.run(done()) == 7
    finished.stop(gone)
    assert finished.error is None


_TWO_SIGNALS_UNDER_A_BAR = """
import asyncio, os, signal
from rich.console import Console
from rich.progress import Progress
from cli.interrupts import Interrupts

console = Console(stderr=True, force_terminal=True, width=60)

async def work():
    with Progress(console=console) as bar:
        bar.add_task("0.evidence", total=4)
        bar.refresh()
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)  # lands before the first's stop can end the work
        await asyncio.sleep(30)

with Interrupts() as stop:
    stop.console, stop.resume = console, "focus collect --collection-id c"
    stop.run(work())
"""


def test_a_second_signals_line_starts_below_the_live_bar():
    """A second signal's line was written where a live bar (or spinner) left the cursor,
    at the end of its last line: the terminal showed `0.evidence ━━━━ 0/32 rollouts
    running 0:00:00interrupted again (SIGINT): ...`. It now starts a line of its own."""
    env = {**base_env(ROOT / ".no-prefect-home"), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", _TWO_SIGNALS_UNDER_A_BAR], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 130, done.stderr[-2000:]
    assert "0.evidence" in done.stderr and "Traceback" not in done.stderr
    assert done.stderr.endswith(
        "\ninterrupted again (SIGINT): stopped at once, the command's servers killed; finished steps are saved; "
        "resume with: focus collect --collection-id c\n"
    ), repr(done.stderr[-300:])


def test_the_interrupt_line_does_not_wait_out_an_unreachable_store(monkeypatch):
    """Whether an interrupted collection's batch write completed is asked of the store
    before the line is printed; with the store unreachable (an S3 endpoint down) it was
    asked with a step's 8 patient attempts, and a Ctrl-C printed its line 14 s later (27 s
    with a save under way). Now with 3 quick ones: the usual line, at once."""
    from test_pipeline import small_config

    from cli.collect import _finished_line
    from storage.retry import retrying

    waits: list[float] = []  # the store's waits between attempts, not wall time (a loaded machine is slow)
    monkeypatch.setitem(retrying.__kwdefaults__, "sleep", waits.append)

    for k, v in {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    cfg = small_config("s3://focus-gone", "cut")
    with pytest.raises(Exception, match="storage unreachable after 3 attempt"):
        _finished_line(cfg)
    assert 0 < sum(waits) < 5, waits


def test_focus_train_ends_with_the_command_that_resumes_it(capsys):
    """`focus train` ended with `resume or rerun with the same options and:
    --collection-id L`, a command to complete by hand; it prints the command itself, as
    `focus collect` does (`rerun or resume: ...`)."""
    from cli.train import _print_table

    resume = "focus train -c configs/loop.toml --iterations 2 --collection-id L"
    _print_table([], "L", resume)
    assert capsys.readouterr().out.strip().splitlines()[-1] == f"rerun or resume: {resume}"


def test_inspect_of_the_weights_folder_says_what_it_keeps_and_what_to_inspect(tmp_path):
    """``focus inspect <root>/weights`` said the weights folder 'holds 2 collection(s)'
    (the store's, under ``batches``), and nothing of what the folder itself is."""
    root = shlex.quote(str(tmp_path))
    for part in ("batches/c1/iter-000000", "batches/c2/iter-000000"):
        (tmp_path / part).mkdir(parents=True)
    keeps = "(the weights each train loop published and its metrics, a folder per loop), not a train loop itself"
    for url in (f"{tmp_path}/weights", f"{tmp_path}/weights/"):
        out = CliRunner().invoke(app, ["inspect", url])
        assert out.exit_code == 2, out.output
        assert out.output == (
            f"error: {url} is the weights folder of the store {tmp_path} {keeps}; it holds no train loop; "
            f"the store holds 2 collection(s): c1, c2 (focus inspect {root}/batches/<id>)\n"
        )
    (tmp_path / "weights" / "loop1" / "v000000").mkdir(parents=True)
    out = CliRunner().invoke(app, ["inspect", f"{tmp_path}/weights"])
    assert out.exit_code == 2, out.output
    assert out.output == (
        f"error: {tmp_path}/weights is the weights folder of the store {tmp_path} {keeps}; it holds 1 train "
        f"loop(s): loop1 (focus inspect {root}/weights/<id>); the store also holds 2 collection(s): c1, c2 "
        f"(focus inspect {root}/batches/<id>)\n"
    )


def test_urls_with_a_space_are_printed_ready_to_paste(tmp_path, capsys):
    """A store under a folder with a space: the last line of a collection printed
    ``batch: file:///.../my runs/...``, which pasted after ``focus inspect`` is two
    arguments. The URL is quoted as the ``rerun or resume`` line quotes its words, and
    a shell splits the quoted word back into the one URL."""
    from cli.collect import print_result

    url = f"file://{tmp_path}/my runs/batches/c/iter-000000"
    print_result({"collection_id": "c", "stats": {"tasks": 1}, "batch_url": url})
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == f"batch: '{url}'" and shlex.split(last.removeprefix("batch: ")) == [url]
    plain = "file:///runs/batches/c/iter-000000"
    print_result({"collection_id": "c", "stats": {"tasks": 1}, "batch_url": plain})
    assert capsys.readouterr().out.splitlines()[-1] == f"batch: {plain}"  # nothing to quote: as before
    store = tmp_path / "my runs"
    (store / "batches" / "c1").mkdir(parents=True)
    out = CliRunner().invoke(app, ["inspect", str(store)], env={"COLUMNS": "400"})
    assert out.exit_code == 2 and f"(focus inspect '{store}'/batches/<id>)" in out.output, out.output


def test_inspect_of_a_store_that_does_not_exist_says_so(tmp_path):
    """A root typed wrong: ``focus inspect <typo>/batches/c`` said 'no finished batch in
    ... (a batch exists once its _manifest.json is written)', as of a collection still
    running, and ``focus inspect <typo>`` that it was neither a batch URL nor a collection."""
    typo = tmp_path / "rusn"
    for url, head in (
        (f"{typo}/batches/c", "cannot read batches"),
        (f"{typo}/batches/c/iter-000000", "cannot read batch"),
    ):
        out = CliRunner().invoke(app, ["inspect", url])
        assert out.exit_code == 1, out.output
        assert out.output == f"error: {head}: no store at {typo}: the folder {typo} does not exist\n"
    out = CliRunner().invoke(app, ["inspect", str(typo)])
    assert out.exit_code == 2 and out.output.startswith(f"error: {str(typo)!r} does not exist: give a batch URL")


def test_inspect_of_a_store_with_saved_steps_and_no_batch_yet_says_so(tmp_path):
    """A store whose first collection runs (or stopped before its batch): it was 'neither
    a batch URL (...) nor a collection folder (...)'."""
    (tmp_path / "checkpoints" / "c9").mkdir(parents=True)
    (tmp_path / "leases").mkdir()
    out = CliRunner().invoke(app, ["inspect", str(tmp_path)])
    assert out.exit_code == 2, out.output
    assert out.output == (
        f"error: {tmp_path} is a store root with no finished batch yet; it holds the saved steps of 1 collection(s): "
        "c9 (running, or stopped before its batch: rerun its focus collect with the same collection id to finish it)\n"
    )
