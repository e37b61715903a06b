"""The example READMEs quote no figure by hand: each is rendered from the record its
command wrote (``examples/<name>/record.json``, by ``python -m examples.records``), so
the committed READMEs must be exactly what the committed records render, and every
example of the registry must have its block, its record and its renderer."""

from __future__ import annotations

import json
import re

from examples import readme
from examples.records import BY_NAME, EXAMPLES, REGISTRY, read, record_path


def test_the_example_readmes_are_what_their_records_render():
    for path in readme.readmes():
        text = path.read_text(encoding="utf-8")
        rendered, warnings = readme.render(text)
        assert not warnings, f"{path}: {warnings}"
        assert rendered == text, (
            f"{path.relative_to(EXAMPLES.parent)} differs from its record: figures typed by hand, or a record "
            "rerun without rendering; run `.venv/bin/python -m examples.records --render-only`"
        )


def test_every_example_has_its_block_record_and_renderer():
    for e in REGISTRY:
        text = (EXAMPLES / e.name / "README.md").read_text(encoding="utf-8")
        assert f"<!-- generated: {e.name} -->" in text, f"examples/{e.name}/README.md has no block for its record"
        assert e.name in readme.RENDERERS
        rec = read(e.name)
        assert rec is not None, f"no {record_path(e.name)}: run `.venv/bin/python -m examples.records --only {e.name}`"
        assert rec["command"] == e.command, f"{e.name}: the record was made by another command"
        assert rec["wall_s"] > 0 and rec["machine"]["cores"] and rec["result"]
        for kept in e.keep:
            assert (EXAMPLES / e.name / kept).is_file()
        # the README shows the command it measured
        assert e.command in text, f"examples/{e.name}/README.md does not show {e.command!r}"
    assert "<!-- generated: summary -->" in (EXAMPLES / "README.md").read_text(encoding="utf-8")


def test_a_missing_or_incomplete_record_is_said_not_hidden(tmp_path):
    text = (EXAMPLES / "math" / "README.md").read_text(encoding="utf-8")
    rendered, warnings = readme.render(text, tmp_path)
    assert "Not recorded yet" in rendered and not warnings
    (tmp_path / "math").mkdir()
    (tmp_path / "math" / "record.json").write_text(json.dumps({"command": "x"}))
    rendered, warnings = readme.render(text, tmp_path)
    assert warnings and "does not have what examples/readme.py reads" in rendered
    # a block naming no example is reported, and left as it is
    odd = "<!-- generated: nope -->\nhand-typed 0.5\n<!-- end generated: nope -->\n"
    assert readme.render(odd, tmp_path) == (odd, ["block nope names no example of examples.records.REGISTRY"])


def test_the_train_local_table_comes_from_the_record():
    rec = read("train_local")
    assert rec is not None
    text = (EXAMPLES / "train_local" / "README.md").read_text(encoding="utf-8")
    block = re.search(r"<!-- generated: train_local -->\n(.*?)<!-- end generated", text, re.S)
    assert block is not None
    for seed, rates in rec["result"]["success"].items():
        assert f"seed {seed} {rates[0]:.3f} -> {rates[-1]:.3f}" in block.group(1)
        assert rec["result"]["final_versions"][seed] in block.group(1)
    assert set(BY_NAME) == {"math", "browse", "train_tinker", "train_local"}
