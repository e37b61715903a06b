"""Short reprs for the records that carry token ids, so that a notebook can show them.

A turn's prompt is thousands of ids with a real model, and a tree, an edge or a batch's
rows hold many turns: the dataclasses' own reprs printed every id (a notebook cell
showing one tree of a toy collection printed 84 kB; a list of rows, megabytes). Here
every field is shown, but a sequence longer than :data:`SHOWN` shows its first items
and how many more there are, and a long string its ends. Equality and pickling are the
dataclasses' own; only the printing changes.
"""

from __future__ import annotations

import dataclasses
import reprlib
from typing import Any

#: Items of a sequence shown before the count of the rest.
SHOWN = 8

_SHORT = reprlib.Repr()
_SHORT.maxlevel = 3
_SHORT.maxtuple = _SHORT.maxlist = _SHORT.maxdict = _SHORT.maxset = SHOWN
_SHORT.maxstring = 160
_SHORT.maxother = 2000  # an item that is itself a record prints its own short repr whole


def short_value(value: Any) -> str:
    """``repr(value)``, a sequence over :data:`SHOWN` items cut to them and the count of the rest."""
    text = _SHORT.repr(value)
    if isinstance(value, (tuple, list)) and len(value) > SHOWN:
        text = f"{text[:-4]}...+{len(value) - SHOWN} more{text[-1]}"  # reprlib ends it with "...)"
    return text


def short_repr(record: Any) -> str:
    """A dataclass's repr with every field, each through :func:`short_value`."""
    fields = ", ".join(f"{f.name}={short_value(getattr(record, f.name))}" for f in dataclasses.fields(record) if f.repr)
    return f"{type(record).__name__}({fields})"
