"""The settings a train loop's iterations were made with, and the refusal to resume it
with others.

A collection guards itself (:mod:`tasks.fingerprint`), but a loop's trainer steps and
evaluations are records of their own, reused by iteration, and the loop hands each
collection settings derived from its own (seeds from ``seed`` and the iteration): a
loop rerun with another ``train.local.lr`` reused every trained step without a word,
and one with another temperature was refused by its first collection, which named a
derived id and seed, not what the user changed.

So the loop records its settings (its configuration without what
:class:`~tasks.config.schema.Resumable` marks for a loop: where things run, how many
iterations, the evaluation's size) as checkpoints ``("settings", n)`` of the loop's id,
each saying from which iteration on it applies. A rerun compares its configuration with
the latest record (:func:`settle`):

- the same settings: the loop resumes or extends (more ``train.iterations``);
- others, where nothing recorded was made with the latest ones since it applies (a run
  stopped in its first collection, say, with only a trainer field changed): recorded,
  the loop goes on with them;
- others, where recorded work was made with the latest ones: refused in one line
  (:class:`LoopSettingsChanged`, exit 2) naming each field with its old and new value,
  unless ``allow_change`` (``focus train --allow-config-change``): then the new
  settings apply from the first iteration not yet begun (only the trainer fields
  changed: from the first not yet trained), said in one warning line, and the
  iterations before keep theirs (:meth:`LoopSettings.config_for` rebuilds them), so a
  resumed collection or trainer step is finished with the settings it began with.

A loop made before loops recorded their settings gets those of its first run that ends
well as its first record, with a warning (its trainer steps cannot be checked; its
collections check themselves on the way). A trainer step's record says whether the
loop's first settings record was saved before it (:data:`MARK`), which tells such a
loop from one whose record was deleted: that one is refused (``RecordMissing``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from storage import CheckpointStore
from tasks.config import FocusConfig
from tasks.config.schema import resumable_fields
from tasks.fingerprint import (
    CONFIG_KEY,
    Change,
    IdTaken,
    ResumeMismatch,
    changes,
    describe,
    fingerprint,
    with_old_knobs,
    with_old_parts,
    without,
)

SETTINGS = "settings"
#: A key of a trainer step's record (``("train", i)`` of the loop's id): true when the
#: loop's first settings record was saved before the step's record. A loop whose
#: settings record is gone while such a step is saved lost the record (a file deleted,
#: a partial copy); one whose steps all lack it was made before loops kept one.
MARK = "settings_recorded"
#: Fields a train loop's resume ignores (read off the schema).
LOOP_IGNORED = resumable_fields("loop")
log = logging.getLogger("focus.train")


class LoopSettingsChanged(ResumeMismatch):
    """A train loop resumed with settings that would change iterations already made."""


@dataclass
class LoopSettings:
    """The loop's settings records, oldest first: ``(applies from iteration, settings)``."""

    records: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    #: A loop made before loops kept a record: the settings are recorded once a run of it
    #: ends well (:meth:`record`), by when each finished collection has checked its own.
    unrecorded: bool = False

    def record(self, config: FocusConfig) -> None:
        """Record the settings of a loop that had no record (see :attr:`unrecorded`)."""
        if self.unrecorded:
            store = CheckpointStore(config.storage.root)
            store.save(config.collection_id or "train", SETTINGS, 0, {"from": 0, "settings": self.records[-1][1]})
            self.unrecorded = False

    def config_for(self, config: FocusConfig, i: int) -> FocusConfig:
        """``config`` with the settings iteration ``i`` was begun with (the latest record
        whose start is at most ``i``): the current ones but for fields changed since."""
        if not self.records:
            return config
        mine = without(self.records[-1][1], LOOP_IGNORED)
        then = next((s for start, s in reversed(self.records) if start <= i), mine)
        diffs = changes(mine, without(then, LOOP_IGNORED))
        return config.with_updates(**{path: value_then for path, _, value_then in diffs}) if diffs else config


def loop_fingerprint(config: FocusConfig) -> dict[str, Any]:
    """What a train loop's result depends on: its configuration without the fields a
    loop's resume ignores (weights of the store named relative to its root)."""
    return fingerprint(config, LOOP_IGNORED)


@dataclass
class _Made:
    """Which iterations of a loop have recorded work, from iteration ``since`` on."""

    since: int
    trained: list[int]
    #: Iterations with a collection step recorded, or an evaluation of the weights they trained.
    begun: list[int]

    def first_free(self, trainer_only: bool) -> int | None:
        """The first iteration from ``since`` on that no recorded work of the kind (trainer
        steps; with ``trainer_only`` false, any) depends on; ``None``: no such work."""
        made = self.trained if trainer_only else self.trained + self.begun
        return max(made) + 1 if made and max(made) >= self.since else None


def _made(store: CheckpointStore, base: str, since: int) -> _Made:
    saved = _saved(store, base)
    trained = [i for (phase, i) in saved if phase == "train"]
    # the evaluation of version v is of the weights iteration v - 1 trained (v = 0: the starting ones)
    begun = [v - 1 for (phase, v) in saved if str(phase).startswith("eval-")]
    i = since
    while store.exists(f"{base}-it{i}", "config", 0):  # a collection saves its config record first
        begun.append(i)
        i += 1
    return _Made(since, trained, begun)


def _saved(store: CheckpointStore, base: str) -> list[tuple[int | str, int]]:
    """The keys of the loop's own records (one listing; none for a new loop)."""
    return list(store.saved(base))


def _records(store: CheckpointStore, base: str) -> list[tuple[int, dict[str, Any]]]:
    ns = sorted(n for (phase, n) in _saved(store, base) if phase == SETTINGS)
    return [
        (int(r["from"]), with_old_parts(with_old_knobs(dict(r["settings"]))))
        for r in (_load(store, base, n) for n in ns)
    ]


def _load(store: CheckpointStore, base: str, n: int) -> Any:
    """A settings record; a damaged one is :class:`~tasks.gaps.RecordMissing`. The store's
    line for a damaged step, to remove its manifest and compute it again, done for a
    record let the rerun's settings stand for those the made iterations had."""
    from storage.errors import CorruptDataError, ManifestError
    from tasks.gaps import RecordMissing

    try:
        return store.load(base, SETTINGS, n)
    except (CorruptDataError, ManifestError) as e:
        raise RecordMissing(
            f"train loop {base}: its settings record is damaged ({str(e).split('; ')[0]}); restore it from where "
            "the store came from, or train under a new --collection-id"
        ) from e


def _lost(store: CheckpointStore, base: str, trained: list[int]) -> Exception | None:
    """The error for a loop without settings records whose trainer steps say one was
    saved before them (:data:`MARK`); ``None`` where none does (a loop made before
    loops kept a record, or its steps before they said so). The latest step is read:
    a loop made before records and extended since has its first record before it."""
    from tasks.gaps import RecordMissing

    if not trained or not store.load(base, "train", max(trained)).get(MARK):
        return None
    manifest = store.url_for(base, SETTINGS, 0) + ".manifest.json"
    return RecordMissing(
        f"train loop {base}: its settings record {manifest} is missing while {len(trained)} trainer step(s) of it "
        "are saved, the latest made after the record was (a loop saves it before its first iteration): without it "
        "a rerun cannot tell whether they were made with these settings; restore the file from where the store "
        "came from, or train under a new --collection-id"
    )


def settle(config: FocusConfig, *, allow_change: bool = False, record: bool = True) -> LoopSettings:
    """Compare ``config`` with the loop's recorded settings; record them where they are
    new (not with ``record=False``: a check before anything starts). Raises
    :class:`LoopSettingsChanged` as the module docs say."""
    base = config.collection_id or "train"
    store = CheckpointStore(config.storage.root)
    records, mine = _records(store, base), loop_fingerprint(config)
    if not records:
        made = _made(store, base, 0)
        if made.first_free(trainer_only=False) is None:  # a new loop
            _refuse_a_collections_id(config, store, base)
            if record:
                store.save(base, SETTINGS, 0, {"from": 0, "settings": mine})
            return LoopSettings([(0, mine)])
        if lost := _lost(store, base, made.trained):
            raise lost
        if record:
            log.warning(
                "train loop %s has no record of the settings its iterations were made with (it was made before "
                "loops kept one): its collections still check theirs, its trainer steps cannot be checked; these "
                "settings are recorded once this run ends",
                base,
                extra={"focus_console": True},
            )
        return LoopSettings([(0, mine)], unrecorded=True)
    since, latest = records[-1]
    diffs = changes(without(latest, LOOP_IGNORED), mine)
    if not diffs:
        return LoopSettings(records)
    trainer_only = all(path.startswith("train.") for path, _, _ in diffs)
    start = _made(store, base, since).first_free(trainer_only)
    if start is not None and not allow_change:
        raise LoopSettingsChanged(_refusal(config, base, diffs, since, start))
    start = since if start is None else start
    if start > since:
        log.warning("%s", _accepted(base, diffs, since, start), extra={"focus_console": True})
    if record:
        store.save(base, SETTINGS, len(records), {"from": start, "settings": mine})
    if start == since:
        records = records[:-1]  # nothing was made with the latest record: the new one replaces it
    return LoopSettings([*records, (start, mine)])


def _refuse_a_collections_id(config: FocusConfig, store: CheckpointStore, base: str) -> None:
    """A new loop over a collection's records (its configuration record): both keep them
    under ``checkpoints/<id>``; the loop wrote its own beside the collection's."""
    if store.exists(base, *CONFIG_KEY):
        raise IdTaken(
            f"train loop {base!r}: {base!r} is the id of a collection in {config.storage.root} (its records are "
            f"in {store.url_for(base, *CONFIG_KEY).rsplit('/', 1)[0]}): a train loop and a collection cannot share "
            "an id; use another --collection-id"
        )


def _span(first: int, last: int) -> str:
    return f"iteration {first}" if first == last else f"iterations {first}-{last}"


def _refusal(config: FocusConfig, base: str, diffs: list[Change], since: int, start: int) -> str:
    span = _span(since, start - 1)
    return (
        f"train loop {base!r} in {config.storage.root}: its {span} {'was' if start - 1 == since else 'were'} "
        f"made with other settings ({describe(diffs)}); rerun with the old values to resume or extend it, use a "
        f"new --collection-id for a loop with the new ones, or pass --allow-config-change to keep {span} as "
        f"made and apply the new values from iteration {start} on"
    )


def _accepted(base: str, diffs: list[Change], since: int, start: int) -> str:
    return (
        f"train loop {base}: from iteration {start} on with {describe(diffs)} (--allow-config-change); "
        f"the iterations before it keep the settings they were made with"
    )
