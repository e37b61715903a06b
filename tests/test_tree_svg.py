"""The trees' picture (``focus.report.tree_svg``, the collection's ``trees.svg`` artifact)
is well-formed XML whatever the task ids hold."""

from __future__ import annotations

import dataclasses
import xml.dom.minidom

from test_storage import grow_tree

from focus.report import TITLE_CHARS, tree_svg


def test_task_ids_with_control_characters_or_thousands_of_characters_keep_the_svg_well_formed():
    """A task id is the user's string (a dataset's id column): one with a NUL or another
    control character made the SVG ill-formed (``not well-formed (invalid token)``: no
    viewer draws it, the Prefect artifact shows nothing), and a 5,000-character one ran
    over every panel. Each title is now XML text, cut to TITLE_CHARS characters."""
    ids = ["nul\x00and\x1bescape\nnewline", "a" * 5000, 'tâche <&> "q" 日本語']
    trees = [dataclasses.replace(grow_tree(), task_id=i) for i in ids]
    svg = tree_svg(trees)
    doc = xml.dom.minidom.parseString(svg)  # raised ExpatError on the first id
    titles = [t.firstChild.data for t in doc.getElementsByTagName("text") if t.firstChild.data.endswith("leaves")]
    names = [t.rsplit(": ", 1)[0] for t in titles]
    assert names == ["nul\ufffdand\ufffdescape newline", "a" * (TITLE_CHARS - 1) + "\u2026", 'tâche <&> "q" 日本語']
