"""The extension interfaces as README.md and docs/architecture.md name them, against the code.

README.md's table "Where your code fits" and the "Roles" table of docs/architecture.md
are where a user looks up which interface owns a behaviour and what it must do; each
name they give must be one the library has, and each interface ``focus.extend`` exports
must be in both."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import focus.extend

ROOT = Path(__file__).resolve().parent.parent


def _table(text: str, heading: str) -> list[list[str]]:
    """The rows (cells) of the first Markdown table after the line starting ``heading``."""
    lines = text[text.index(heading) :].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not set(cells[0]) <= set("-: "):
            rows.append(cells)
    return rows[1:]  # the header


def _names(cell: str) -> list[str]:
    return re.findall(r"`([A-Za-z_][\w.]*)`", cell)


def test_readme_interface_table_names_every_extension_interface_and_existing_builtins():
    rows = _table((ROOT / "README.md").read_text(), "Where your code fits")
    listed = {n for row in rows for n in _names(row[0])}
    assert set(focus.extend.__all__) <= listed, sorted(set(focus.extend.__all__) - listed)
    for row in rows:
        modules = [importlib.import_module(m) for m in _names(row[1])]
        for name in _names(row[0]):
            assert any(hasattr(m, name) for m in modules), (name, row[1])
        for name in _names(row[2]):
            if "." in name:  # a full path
                module, _, attr = name.rpartition(".")
                assert hasattr(importlib.import_module(module), attr), name
            else:
                assert any(hasattr(m, name) for m in modules), (name, row[1])


def test_architecture_roles_table_has_every_extension_interface():
    rows = _table((ROOT / "docs" / "architecture.md").read_text(), "## Roles")
    listed = {n for row in rows for n in _names(row[0])}
    missing = sorted(set(focus.extend.__all__) - listed)
    assert not missing, f"docs/architecture.md's Roles table has no row for {missing}"
    for row in rows:
        for path in re.findall(r"`(focus/[\w/]+\.py)`", row[1]):
            assert (ROOT / path).is_file(), path


def test_readme_names_the_conformance_checks_for_custom_parts():
    import focus.testing

    mixins = sorted(n for n in dir(focus.testing) if n.endswith("Conformance"))
    assert mixins, "focus.testing has no conformance mixins"
    readme = (ROOT / "README.md").read_text()
    assert [n for n in mixins if f"`{n}`" not in readme] == []


def test_readme_says_what_focus_collect_takes_for_each_interface():
    """The user's guide says a run takes the parts you supply; `focus collect` takes an
    env, a model client and a critic of your own (`*.factory`) and only the built-ins of
    the rest, which no page said: a custom `Priority` or `Summarize` had no field to name
    and `--set agent.context=summarize` was refused as an unknown choice. Each row of the
    table says which fields choose the part in the command, each a real field (at any
    depth) listed with choices it has, and every section with a factory is named."""
    import typing

    from tasks.config.schema import field_annotation, field_paths

    rows = _table((ROOT / "README.md").read_text(), "Where your code fits")
    assert all(len(row) == 4 for row in rows), "README's table needs its column `focus collect`"
    named_factories = set()
    for row in rows:
        cell = row[3]
        for path in re.findall(r"`([a-z_]+(?:\.[a-z_]+)+)`", cell):  # a field at any depth (agent.context.factory)
            section, _, name = path.rpartition(".")
            annotation = field_annotation(path)
            assert annotation is not None, path
            named_factories |= {section} if name == "factory" else set()
            if typing.get_origin(annotation) is typing.Literal:  # the choices given after it, up to a `;`
                choices = set(typing.get_args(annotation))
                listed = set(re.findall(r"`([a-z_]+)`", cell.split(f"`{path}`", 1)[1].split(";")[0]))
                assert listed and listed <= choices, (path, listed - choices)
        assert ".factory" in cell or "library only" in cell, row[0]
    pluggable = {p.rpartition(".")[0] for p in field_paths() if p.endswith(".factory")}
    assert "agent.context" in pluggable and "search" in pluggable
    assert named_factories == pluggable, (named_factories, pluggable)
