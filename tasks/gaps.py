"""Gaps in a collection's checkpoints: a step missing while steps after it are saved.

The collector's loop replays recorded steps in collection order and computes from the
first step that is not recorded (:mod:`focus.journal`); that is exact only while the
recorded steps form a prefix of the collection. A checkpoint removed from the store
(damage, a partial copy, an operator deleting a file) breaks the prefix: each step after
it was computed from the state the missing one produced. Replaying them as they are
would go wrong two ways: a phase whose end is recorded would end at the gap (the batch
silently loses the waves after it), and a wave computed again would be saved next to the
old ones, which a save keeps (:class:`storage.CheckpointStore` keeps a checkpoint's
first copy).

:func:`find_gap` (pure) finds the first missing step and the saved steps after it;
:func:`mend` (the I/O) discards those, and the loop computes them again from the last
intact step: plans are pure functions of the grafted rollouts and the seeds, so with a
model whose answers repeat the batch is a clean run's. A checkpoint whose manifest is
there but whose data file is not counts as missing. :func:`repairing` is what
:func:`tasks.collect.collect` wraps a resumed search in: the mend before it, and after
it a line for each repair (a damaged batch written again, or a batch an earlier run left
that the recomputed steps do not give).

The records a first run saves before any step - the configuration's fingerprint and the
critic's identity - are no steps: a collection with saved steps but without one of them
was damaged (a partial copy, a file deleted by hand), never left so by a crash, since
each is saved, and its save finished, before the first step is computed.
:func:`missing_record` is the refusal to take the current configuration or critic for
the lost one (:class:`RecordMissing`): saved as if the collection were new, it would let
a rerun with another configuration or critic resume the old steps under it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from storage import BatchExistsError, CorruptDataError, StorageError
from tasks.fingerprint import CONFIG_KEY, CRITIC_KEY, IdTaken

if TYPE_CHECKING:
    from tasks.journal import CheckpointJournal

log = logging.getLogger(__name__)
CONSOLE = {"focus_console": True}

Key = tuple[str, int]
#: The collection's own records after its last step (a picture of the trees, the
#: export's record): made from the final state, so stale once any step is computed again.
AFTER_STEPS = {"trees.svg": 0, "export": 1}
_LAST = float("inf")
#: The records a collection's first run saves before any step (:mod:`tasks.journal`), by what they are.
RECORDS: dict[Key, str] = {CONFIG_KEY: "configuration record", CRITIC_KEY: "critic-identity record"}
#: The first step of every collection.
EVIDENCE_KEY: Key = ("evidence", 0)


def is_loop_record(key: tuple[Any, int]) -> bool:
    """Whether ``key`` is a record a train loop keeps under its own id (its settings, a
    trainer step, an evaluation: :mod:`tasks.loop_settings`, :mod:`flows.loop`), never a
    collection's: the two share ``checkpoints/<id>``, so one id cannot name both."""
    return key[0] in ("settings", "train") or str(key[0]).startswith("eval-")


class RecordMissing(StorageError):
    """A record a first run saves before any step (:data:`RECORDS`) is missing while
    steps of the collection are saved; the message names its URL and what to do."""


class StoreIncomplete(RecordMissing):
    """What a first run saves first - the configuration record, the critic's identity and
    the evidence - is all missing while later steps are saved: the store (or the
    collection's folder) was removed or cleaned while a run wrote it, or copied in part.
    Nothing left can be checked or resumed; the operator starts over elsewhere (exit 2)."""


@dataclass(frozen=True)
class Gap:
    """The first step of a collection that is not saved whole, with what must go."""

    #: The first step missing: its manifest is gone, or (``broken``) its data file.
    missing: Key
    broken: bool
    #: Saved checkpoints to discard, in collection order: those after ``missing``, and any
    #: whose data file is gone (a checkpoint that cannot be loaded is no checkpoint).
    discard: tuple[Key, ...]


def position(phases: Sequence[Any], key: Key) -> tuple[float, float, int] | None:
    """Where ``key`` comes in the collection (:func:`tasks.journal.checkpoint_key`'s
    keys); ``None`` for a record that is no step of it (the configuration, the critic's
    identity). A wave's ``unfinished`` record comes before the wave: it is saved when the
    wave stops on bad responses, and the wave once a rerun completes it."""
    name, wave = key
    if not isinstance(name, str):
        return None
    if name == "evidence":
        return (0, 0, 1)
    if name == "evidence.score":
        return (0, 0, 2)
    if name in AFTER_STEPS:
        return (_LAST, AFTER_STEPS[name], 0)
    index, dot, rest = name.partition(".")
    if not dot or not index.isdigit() or int(index) >= len(phases):
        return None
    pi, phase = int(index), phases[int(index)]
    if rest == f"{phase.name}.unfinished":
        return (0, 0, 0) if phase.is_evidence else (1 + pi, wave, 0)
    if phase.is_evidence:
        return None
    sub = {phase.name: 1, f"{phase.name}.score": 2}.get(rest)
    if sub is not None:
        return (1 + pi, wave, sub)
    return (1 + pi, _LAST, 0) if rest == f"{phase.name}.end" else None


def expected_steps(phases: Sequence[Any], saved: Mapping[Key, bool], ends: Mapping[Key, int]) -> Iterator[Key]:
    """The steps a collection saves, in order, for the caller to stop at the first one
    not saved. ``ends``: the number of waves each readable ``<p>.<name>.end`` records.

    Where a phase's end cannot be read, the phase ends at its first wave not saved once
    no later wave of it is saved: nothing says whether that wave was lost or never
    planned, and the loop finds out by planning it (an empty plan ends the phase)."""
    yield ("evidence", 0)
    yield ("evidence.score", 0)
    for pi, phase in enumerate(phases):
        if phase.is_evidence:
            continue
        base = f"{pi}.{phase.name}"
        n = ends.get((f"{base}.end", 0))
        if n is None:  # the phase's last saved wave (a wave's unfinished record or scores count)
            mine = (base, f"{base}.score", f"{base}.unfinished")
            n = 1 + max((w for name, w in saved if name in mine), default=-1)
        for w in range(n):
            yield (base, w)
            yield (f"{base}.score", w)
        yield (f"{base}.end", 0)


def find_gap(phases: Sequence[Any], saved: Mapping[Key, bool], ends: Mapping[Key, int]) -> Gap | None:
    """The first gap in a collection's checkpoints, or ``None`` when they form a prefix
    of it (a plain resume, or a finished collection).

    ``saved``: every checkpoint with a manifest, and whether its data file is there
    (:meth:`storage.CheckpointStore.saved`); ``ends``: the wave count each saved phase
    end records. The first missing step is the first of :func:`expected_steps` not saved
    whole (or, if every step is, the first record whose data file is gone); everything
    saved after it was computed from it and is discarded, as is every checkpoint whose
    data file is gone.
    """

    def where(key: Key) -> tuple[float, float, int]:
        at = position(phases, key)
        assert at is not None  # only steps are compared
        return at

    steps = [k for k in saved if position(phases, k) is not None]
    broken = sorted((k for k in steps if not saved[k]), key=where)
    missing = next((k for k in expected_steps(phases, saved, ends) if not saved.get(k, False)), None)
    if missing is None:  # every step is saved whole: only a record after them can be broken
        if not broken:
            return None
        missing = broken[0]
    at = where(missing)
    doomed = sorted((k for k in steps if where(k) > at or not saved[k]), key=where)
    if not doomed:
        return None
    return Gap(missing, missing in saved, tuple(doomed))


def describe(key: Key) -> str:
    """A step as the progress lines name it (``1.continue wave 2``)."""
    name, wave = key
    for suffix, what in ((".score", "{} wave {}'s scores"), (".unfinished", "{} wave {} (unfinished)")):
        if name.endswith(suffix) and name != "evidence.score":
            return what.format(name[: -len(suffix)], wave)
    if name.endswith(".end"):
        return f"the end of {name[: -len('.end')]}"
    if name in ("evidence", "evidence.score"):
        return {"evidence": "the evidence", "evidence.score": "the evidence's scores"}[name]
    return f"{name} wave {wave}" if name[:1].isdigit() else f"its {name} record"


# ---- the I/O: mending a collection's store ----


class Mended(NamedTuple):
    """What :func:`mend` found and left for the resume."""

    gap: Gap | None
    #: The saved steps the loop will replay, in the order it asks for them (:func:`replay_order`).
    replayed: list[Key]
    #: The checkpoints read to find the gap (the phase ends), for the replay to take as they are.
    loaded: dict[tuple[int | str, int], Any]


def mend(journal: CheckpointJournal) -> Mended:
    """Make the saved steps of ``journal``'s collection a prefix of it again: find the
    first gap (one listing of its checkpoints and a read of each saved phase end) and
    discard what :func:`find_gap` says must go, last first (whatever an interruption
    leaves, the next rerun finds the same gap). Run it holding the lease, once the
    collection is known to be unfinished: a finished one whose batch checks out needs
    none of its steps. Each checkpoint is read once: what is read here goes on to the
    replay (:attr:`Mended.loaded`)."""
    phases, store, cid = journal.config.search.phases, journal.store, journal.cid
    saved = {(p, w): whole for (p, w), whole in store.saved(cid).items() if isinstance(p, str)}
    ends: dict[Key, int] = {}
    loaded: dict[tuple[int | str, int], Any] = {}  # as the store's keys are typed
    for key, whole in saved.items():
        if whole and key[0].endswith(".end") and position(phases, key) is not None:
            if (n := journal.load(key)) is not None:
                ends[key], loaded[key] = int(n), n
    gap = find_gap(phases, saved, ends)
    if gap is not None:
        store.discard(cid, gap.discard[::-1])
    return Mended(gap, replay_order(phases, saved, ends, gap), loaded)


def replay_order(
    phases: Sequence[Any], saved: Mapping[Key, bool], ends: Mapping[Key, int], gap: Gap | None
) -> list[Key]:
    """The saved steps a resume replays, in the order the loop asks for them: those of
    :func:`expected_steps` up to the first one not saved whole, once ``gap``'s are
    discarded (what :func:`repairing` reads ahead)."""
    gone = set(gap.discard) if gap is not None else set()
    kept = {k: whole for k, whole in saved.items() if k not in gone}
    counts = {k: n for k, n in ends.items() if k in kept}
    return list(itertools.takewhile(lambda k: kept.get(k, False), expected_steps(phases, kept, counts)))


def gap_line(journal: CheckpointJournal, gap: Gap) -> str:
    """What a resume that mends ``gap`` says (one line)."""
    manifest = journal.store.url_for(journal.cid, *gap.missing) + ".manifest.json"
    what = f"checkpoint {manifest} lists a data file that is missing" if gap.broken else f"{manifest} is missing"
    later = [k for k in gap.discard if k != gap.missing]
    return (
        f"collection {journal.cid}: {what}; {len(later)} saved step(s) after it were computed from it and are "
        f"discarded: computing again from {describe(gap.missing)} on"
    )


def _may_go_without(journal: CheckpointJournal, key: Key) -> bool:
    """Whether the collection may resume without its record ``key``: only the critic's
    identity, with another critic allowed (``--allow-policy-change``)."""
    return key == CRITIC_KEY and journal.critic.allow_change


def missing_record(
    journal: CheckpointJournal, key: Key, *, saved: Mapping[Any, bool] | None = None
) -> RecordMissing | None:
    """The refusal for ``journal``'s collection, whose record ``key`` (:data:`RECORDS`)
    was not found, if any step of it is saved (``saved``: its checkpoints, listed here
    when not given); ``None`` when none is (a first run, or one stopped before its first
    step), where the record is saved as new. The critic's names the flag that resumes anyway."""
    listed = journal.store.saved(journal.cid) if saved is None else saved
    steps = [k for k in listed if k not in RECORDS]
    if not steps:
        return None
    manifest = journal.store.url_for(journal.cid, *key) + ".manifest.json"
    folder = manifest.rsplit("/", 1)[0]
    if not any(k in listed for k in (CONFIG_KEY, CRITIC_KEY, EVIDENCE_KEY)):
        phases = journal.config.search.phases
        ordered = sorted((at, k) for k in steps if isinstance(k[0], str) and (at := position(phases, (k[0], k[1]))))
        first = ordered[0][1] if ordered else steps[0]
        return StoreIncomplete(
            f"collection {journal.cid}: the store {journal.config.storage.root} is incomplete: {folder} holds "
            f"{len(steps)} step(s) of it, from {describe((str(first[0]), first[1]))} on, but not its configuration record, its "
            "critic's identity or its evidence, which its first run saved before them (was the store or the "
            "folder removed while a run wrote it?); what is left cannot be checked or resumed: start over at a "
            "new storage root (--store) or under a new collection id"
        )
    critic = key == CRITIC_KEY
    return RecordMissing(
        f"collection {journal.cid}: its {RECORDS[key]} {manifest} is missing while {len(steps)} step(s) of it are "
        "saved (a first run saves it before any step): without it a rerun cannot tell whether they were made "
        f"with this {'critic' if critic else 'configuration'}; restore the file from where the store "
        f"came from, or collect under a new collection id (or remove {folder} to start this one again)"
        + (
            ", or pass --allow-policy-change (in a Prefect run of the collect flow, its allow_policy_change parameter)"
            if critic
            else ""
        )
    )


def check_records(journal: CheckpointJournal) -> None:
    """Refuse ``journal``'s collection if its steps are saved without its configuration
    record, or without its critic's identity unless another critic is allowed
    (:class:`RecordMissing`). One listing, nothing written: run it before the lease is
    taken, whose sweep removes a data file whose manifest is gone, a lost record's too."""
    saved = journal.store.saved(journal.cid)
    if CONFIG_KEY not in saved and any(is_loop_record(k) for k in saved):
        folder = journal.store.url_for(journal.cid, *CONFIG_KEY).rsplit("/", 1)[0]
        raise IdTaken(
            f"collection id {journal.cid!r} in {journal.config.storage.root} is a train loop's ({folder} holds its "
            "settings and trainer records): a collection and a train loop cannot share an id; collect under "
            "another collection id"
        )
    for key in RECORDS:
        if key in saved or _may_go_without(journal, key):
            continue
        if (error := missing_record(journal, key, saved=saved)) is not None:
            raise error


def load_record(journal: CheckpointJournal, key: Key) -> Any | None:
    """The record ``key`` (:data:`RECORDS`) of ``journal``'s collection, or ``None`` on a
    first run (no step saved: it is saved as new). Missing while steps are saved, it was
    lost, and taking the current configuration or critic for it would check those steps
    against the wrong record: :class:`RecordMissing`, unless it is the critic's and
    another critic is allowed (``allow_policy_change``: the current one's identity is
    saved, with one warning line)."""
    try:
        value = journal.load(key)
    except CorruptDataError as e:  # its advice, to compute the step again, is a step's: a record is restored
        raise RecordMissing(
            f"collection {journal.cid}: its {RECORDS[key]} is damaged ({str(e).split('; ')[0]}); restore it from "
            "where the store came from, or collect under a new collection id"
        ) from e
    if value is not None:
        return value
    error = missing_record(journal, key)
    if error is None:
        return None
    if not _may_go_without(journal, key):
        raise error
    url = journal.store.url_for(journal.cid, *key) + ".manifest.json"
    log.warning(
        "collection %s: its critic-identity record %s is missing while steps are saved; resuming with the "
        "current critic as allowed (--allow-policy-change), whose identity is saved from here on",
        journal.cid,
        url,
        extra=CONSOLE,
    )
    return None


@contextlib.asynccontextmanager
async def repairing(journal: CheckpointJournal) -> AsyncIterator[None]:
    """The search and export of an unfinished (or damaged) collection, with its repairs:
    a gap in its checkpoints mended first (:func:`mend`, one warning line); after, a
    warning if its damaged batch was written again. Where the steps computed again give
    another batch than one an earlier run left (a model whose answers do not repeat), the
    refusal names the missing step and what to do, not only 'a different batch'. The saved
    steps the search replays are read ahead meanwhile (:func:`replay_order`,
    :class:`storage.read_ahead.ReadAhead`)."""
    gap, replayed, loaded = await asyncio.to_thread(mend, journal)
    if gap is not None:
        log.warning("%s", gap_line(journal, gap), extra=CONSOLE)
    try:
        sizes = journal.config.storage.read_ahead.options()
        with journal.store.reading_ahead(journal.cid, replayed, loaded, **sizes):  # the replay's loads, ahead of it
            yield
    except BatchExistsError as e:
        if gap is None:
            raise
        url = journal.batch_store.url_for(journal.cid, journal.config.iteration)
        raise BatchExistsError(
            f"{url} holds a batch written before {describe(gap.missing)} went missing from the checkpoints, and "
            "the steps after it, computed again, give another batch (the model's answers did not repeat): "
            f"remove {url} and rerun to write the new one, or keep it and collect under a new collection id"
        ) from e
    if journal.damaged:
        url = journal.batch_store.url_for(journal.cid, journal.config.iteration)
        why = f"batch {url} did not match its manifest ({journal.damaged})"
        log.warning("%s; wrote it again from the checkpoints", why, extra=CONSOLE)
