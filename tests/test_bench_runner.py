"""``python -m benchmarks``: every figure of the benchmark pages (benchmarks/README.md,
benchmarks/QUALITY.md) comes from a record.

The committed pages must be exactly what the committed records render (so no figure is
edited by hand), every benchmark of the registry must have its block on one page and
its renderer, and a smoke run of a few cheap benchmarks must write records and render
copies of the pages.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from benchmarks import readme
from benchmarks import render_format as fmt
from benchmarks.results import BY_NAME, REGISTRY, RESULTS, ROOT

PAGES = {name: ROOT / "benchmarks" / name for name in readme.PAGES}


def _pages() -> dict[str, str]:
    return {name: path.read_text(encoding="utf-8") for name, path in PAGES.items()}


def test_the_committed_pages_are_what_the_committed_records_render():
    texts = _pages()
    rendered, warnings = readme.render_pages(texts, RESULTS)
    assert warnings == []
    for name, text in texts.items():
        assert rendered[name] == text, (
            f"benchmarks/{name} differs from its records: run `python -m benchmarks --render-only`"
        )


def test_every_benchmark_has_its_block_and_its_renderer():
    every = "\n".join(_pages().values())
    names = readme.blocks(every)
    assert readme.problems(every) == []
    for text in _pages().values():  # a page with no block would be a page of prose only
        assert readme.blocks(text)
    assert set(names) == {readme.SUMMARY, *BY_NAME}
    assert set(readme.RENDERERS) == set(BY_NAME)
    assert len(BY_NAME) == len(REGISTRY)  # names are unique
    for b in REGISTRY:  # every registered module takes --json PATH (the runner passes it)
        src = (ROOT / (b.module.replace(".", "/") + ".py")).read_text(encoding="utf-8")
        assert re.search(r'add_argument\(\s*"--json"', src), b.module


def test_records_on_disk_are_the_registry_s():
    for path in RESULTS.glob("*.json"):
        rec = json.loads(path.read_text(encoding="utf-8"))
        assert rec["benchmark"] == path.stem and path.stem in BY_NAME
        assert not rec["quick"], f"{path.name} is a smoke run's record"
        for key in ("command", "started_utc", "wall_s", "load_average_before", "load_average_after", "machine"):
            assert rec[key] not in (None, "", []), (path.name, key)


def test_a_missing_record_renders_as_not_run(tmp_path):
    pages, warnings = readme.render_pages(_pages(), tmp_path)
    assert warnings == []
    rendered = "\n".join(pages.values())
    for b in REGISTRY:
        body = _body(rendered, b.name)
        assert body.startswith("_Not run on this machine yet: `python -m benchmarks --only " + b.name + "`"), body
    assert f"0 of {len(REGISTRY)} benchmarks recorded." in _body(rendered, readme.SUMMARY)


def test_a_record_without_the_keys_its_renderer_reads_is_reported(tmp_path):
    record = {
        "benchmark": "writer_race",
        "command": "python -m benchmarks.writer_race",
        "quick": False,
        "started_utc": "2026-01-01T00:00:00Z",
        "wall_s": 12.0,
        "load_average_before": [1.0, 1.0, 1.0],
        "load_average_max_during": 1.5,
        "load_average_after": [1.2, 1.0, 1.0],
        "machine": {"cores": 2, "cpu_model": "x", "cpu_flags": [], "python": "3.11.7"},
        "git_commit": "abc1234",
        "figures": {"attempts": 1},  # no writers, no local: the benchmark's figures changed
    }
    (tmp_path / "writer_race.json").write_text(json.dumps(record))
    rendered, warnings = readme.render(PAGES["README.md"].read_text(encoding="utf-8"), tmp_path)
    assert len(warnings) == 1 and warnings[0].startswith("writer_race:")
    body = _body(rendered, "writer_race")
    assert body.startswith("Run of 2026-01-01 00:00 UTC at `abc1234`, 12 s: `python -m benchmarks.writer_race`")
    assert "does not have what its renderer (RENDERERS in benchmarks/readme.py) reads" in body


def test_block_problems_are_named():
    text = "<!-- generated: engine -->\n<!-- end generated: engine -->\n" * 2
    text += "<!-- generated: nothing -->\n<!-- end generated: nothing -->\n<!-- generated: scale -->\n"
    found = readme.problems(text)
    assert "block engine appears 2 times" in found
    assert "block nothing names no benchmark" in found
    assert "no generated block for local_model" in found
    assert any("opening and" in p for p in found)  # scale's block is never closed


def test_numbers_are_formatted_to_significant_digits():
    assert fmt.num(0.1234) == "0.123"
    assert fmt.num(12.345) == "12.3"
    assert fmt.num(12345.6) == "12,346" and fmt.num(82.0) == "82" and fmt.num(1.0) == "1.00"
    assert fmt.num(0.0001234) == "1.23e-04"
    assert fmt.num(7) == "7" and fmt.num(None) == "n/a" and fmt.num(float("nan")) == "n/a"
    assert fmt.span([1.0, 3.0, 2.0], fmt.x_) == "1.00x-3.00x"
    assert fmt.verdict(1.2, 1.3, "<=") == "met" and fmt.verdict(0.8, 0.9, ">=") == "**missed**"
    assert fmt.table(["a", "b"], [["x|y", 1]]) == "| a | b |\n| --- | --- |\n| x\\|y | 1 |"


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_quick_run_records_and_renders_a_readme_copy(tmp_path):
    """``python -m benchmarks --quick`` on three cheap benchmarks, into a temporary
    folder: each record holds the figures and the run's context, and the copies of the
    pages render them (the other blocks say not run)."""
    chosen = ["writer_race", "batch_write", "search_planning"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "benchmarks", "--quick", "--only", ",".join(chosen), "--results", str(tmp_path)]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=170)
    assert done.returncode == 0, done.stderr[-3000:]
    # the commit git names here; none where git cannot tell (no .git, no git, or a checkout another
    # user owns: git refuses it as of "dubious ownership", as in a container run under another id)
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        commit = head.stdout.strip() if head.returncode == 0 else None
    except OSError:
        commit = None
    for name in chosen:
        rec = json.loads((tmp_path / f"{name}.json").read_text(encoding="utf-8"))
        assert rec["benchmark"] == name and rec["quick"] is True
        assert rec["command"].startswith(f"python -m {BY_NAME[name].module} ")
        assert rec["machine"]["cores"] == os.cpu_count() and rec["machine"]["python"]
        assert len(rec["load_average_before"]) == 3 and len(rec["load_average_after"]) == 3
        assert rec["load_average_max_during"] >= 0 and rec["wall_s"] > 0
        assert rec["git_commit"] is None if commit is None else rec["git_commit"].removesuffix("+dirty") == commit
        assert rec["figures"], name
    race = json.loads((tmp_path / "writer_race.json").read_text(encoding="utf-8"))["figures"]
    assert race["local"]["holders_max"] == 1 and race["local"]["mismatched"] == 0
    assert "s3" not in race  # --no-s3 in the smoke arguments
    copies = {name: (tmp_path / name).read_text(encoding="utf-8") for name in readme.PAGES}
    assert readme.problems("\n".join(copies.values())) == []
    copy = copies["README.md"]
    assert copy != PAGES["README.md"].read_text(encoding="utf-8")
    for name in chosen:
        body = _body(copy, name)
        assert "Smoke run (`--quick`)" in body and "|" in body, body
    assert "| local folder | 3 x 3 |" in _body(copy, "writer_race")
    assert _body(copy, "engine").startswith("_Not run on this machine yet")
    assert _body(copies["QUALITY.md"], "learning").startswith("_Not run on this machine yet")
    # rendering again from the same records changes nothing
    again, warnings = readme.render(copy, tmp_path)
    assert again == copy and warnings == []


def _body(text: str, name: str) -> str:
    m = re.search(rf"<!-- generated: {name} -->\n(.*?)\n<!-- end generated: {name} -->", text, re.S)
    assert m, name
    return m.group(1)


def test_the_rendered_pages_do_not_make_a_run_dirty() -> None:
    # a record's commit is marked +dirty only for changes a run did not write itself:
    # every rendered page is excluded (benchmarks/QUALITY.md was not, and each record
    # run after a render read "+dirty")
    from benchmarks.readme import PAGES
    from benchmarks.results import RECORDED

    for page in PAGES:
        assert f":!benchmarks/{page}" in RECORDED, page
