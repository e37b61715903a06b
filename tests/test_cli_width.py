"""The CLI's output fits 80 columns with nothing cut: ``focus inspect``'s statistics
(names whole, long values folded), the collection listing (the folder printed once,
not a URL folded in a cell), and the statistics table ``focus collect`` prints."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import replace

from rich.console import Console
from test_storage import batch_from_trees, grow_tree
from typer.testing import CliRunner

from cli.app import app
from cli.common import pairs_table
from focus.batch import Batch
from storage import BatchStore

ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")


def lines_of(text: str) -> list[str]:
    return ANSI.sub("", text).splitlines()


def test_inspect_and_the_listing_fit_80_columns(tmp_path):
    root = tmp_path / "store"
    store = BatchStore(str(root))
    made = batch_from_trees([grow_tree("t1"), grow_tree("t2", branches=1)], collection_id="narrow")
    # a policy version as long as a Tinker sampler path, and phases as a collection records them
    actor = [
        replace(r, policy_version=f"tinker://{'0123456789' * 5}/sampler_weights/{i % 2}")
        for i, r in enumerate(made.actor)
    ]
    phases = [{"name": "evidence", "rollouts": 4, "transitions": 11}, {"name": "continue", "transition_budget": 96}]
    url = store.write(Batch(made.collection_id, made.iteration, actor, made.critic, {**made.stats, "phases": phases}))
    env = {"COLUMNS": "80", "NO_COLOR": "1"}
    out = CliRunner().invoke(app, ["inspect", url], env=env)
    assert out.exit_code == 0, out.output
    summary = json.loads(CliRunner().invoke(app, ["inspect", url, "--json"], env=env).output)
    shown = lines_of(out.output)
    assert all(len(line) <= 80 for line in shown), [line for line in shown if len(line) > 80]
    assert "…" not in out.output
    names = {k for k in summary if k not in ("phases", "failure_causes")}
    cells = {c.strip() for line in shown for c in line.split("│")}
    assert names <= cells, names - cells  # every statistic's name whole, in a cell of its own

    listing = CliRunner().invoke(app, ["inspect", url.rsplit("/", 1)[0]], env=env)
    assert listing.exit_code == 0, listing.output
    shown = [line for line in lines_of(listing.output) if not line.startswith("batches in ")]
    assert all(len(line) <= 80 for line in shown) and "…" not in listing.output, shown
    assert "iter-000000" in listing.output and "1 finished iteration" in listing.output
    assert len(shown) == 3, shown  # title, header, one row: nothing wrapped
    assert f"batches in {shlex.quote(url.rsplit('/', 1)[0] + '/')}" in ANSI.sub("", listing.output).replace("\n", "")


def test_pairs_use_one_column_pair_when_two_do_not_fit():
    items = [(f"statistic_with_a_long_name_{i}", 10**i) for i in range(6)]
    wide, narrow = pairs_table("t", items, width=200), pairs_table("t", items, width=80)
    assert len(wide.columns) == 4 and len(narrow.columns) == 2
    console = Console(width=80, record=True)
    console.print(narrow)
    text = console.export_text()
    assert all(f"statistic_with_a_long_name_{i}" in text for i in range(6)) and "…" not in text


def test_every_option_with_a_value_names_it_in_one_style():
    """One metavar style: a word in capitals (ID, N, PATH, URL, SECONDS, KEY=VALUE),
    never typer's ``<str>`` beside them; a flag shows none."""
    import typer

    def commands(cmd):  # typer's own click: by duck type
        subs = getattr(cmd, "commands", {}).values()
        return [cmd, *[c for s in subs for c in commands(s)]]

    seen = 0
    for cmd in commands(typer.main.get_command(app)):
        for p in cmd.params:
            if p.param_type_name == "option" and not (p.is_flag or p.count) and p.name != "help":
                assert p.metavar and re.fullmatch(r"[A-Z][A-Z=]*", p.metavar), (cmd.name, p.name, p.metavar)
                seen += 1
    assert seen >= 20
    out = CliRunner().invoke(app, ["collect", "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert "<str>" not in out.output and "<int>" not in out.output and re.search(r"--store\s+URL", out.output)


def test_the_lists_of_commands_and_arguments_read_as_written():
    """``focus --help`` lists each command by its docstring's first paragraph on one line
    (typer kept its line breaks: ``inspect``'s broke after ``every phase),``), and an
    argument shows its metavar alone (``inspect --help`` showed ``url <str>``)."""
    import typer

    wide = {"COLUMNS": "250", "NO_COLOR": "1"}
    listing = CliRunner().invoke(app, ["--help"], env=wide).output
    group = typer.main.get_command(app)
    for name, cmd in getattr(group, "commands", {}).items():
        first = " ".join((cmd.help or "").split("\n\n")[0].split())
        assert any(f"{name} " in line and first in line for line in listing.splitlines()), (name, listing)
    shown = CliRunner().invoke(app, ["inspect", "--help"], env=wide).output
    assert "<str>" not in shown and re.search(r"\*\s+URL\s+A batch URL", shown), shown
    shown = CliRunner().invoke(app, ["config", "--help"], env=wide).output
    assert "came from (default, the file" in shown, shown
    # a command's own help: each paragraph wrapped by the terminal, not at the source's breaks
    shown = CliRunner().invoke(app, ["deploy", "--help"], env=wide).output
    assert "FOCUS_* variables of this process apply when each run starts" in shown, shown
