"""The keys of a collection's Prefect artifacts (``flows.report``).

A Prefect server keeps an artifact key's versions together and its UI shows the latest,
so two collections whose ids clean to the same key replaced each other's statistics,
steps and tree picture. The key was the id lowercased with every other character a dash,
cut at 60: ``Odd.Id_1``, ``odd-id-1`` and ``ODD_ID_1`` shared ``odd-id-1-stats``, as did
ids alike in their first 60 characters.
"""

from __future__ import annotations

from prefect.types.names import ArtifactKey
from pydantic import TypeAdapter

from flows.report import _artifact_key

KEY = TypeAdapter(ArtifactKey)


def test_distinct_collection_ids_get_distinct_valid_artifact_keys():
    ids = ["Odd.Id_1", "odd-id-1", "ODD_ID_1", "odd.id.1", "a" * 60 + "-x", "a" * 60 + "-y", "a" * 128, "ümlaut-1"]
    keys = [_artifact_key(cid, "stats") for cid in ids]
    assert len(set(keys)) == len(ids), keys
    for key in keys:
        assert KEY.validate_python(key) == key and key.endswith("-stats")


def test_an_id_that_is_a_key_is_its_key():
    assert _artifact_key("flow-eq", "stats") == "flow-eq-stats"
    assert _artifact_key("scheduled-20261130-130000-3f9a2c", "trees") == "scheduled-20261130-130000-3f9a2c-trees"
