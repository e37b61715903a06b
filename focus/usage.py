"""What rollouts used: one record per rollout, summed for waves, phases and collections.

:class:`Usage` is computed once per rollout, when the rollout is grafted into its tree
(:func:`focus.search.graft` stores it in the tree's log record under ``"usage"``), and
everything that reports usage adds those records up: batch statistics
(:meth:`focus.collector.Collector.statistics`), the search's budget
(:attr:`Usage.budget_spent`), the pipeline's step records, progress and artifacts. The
budget rule - a rollout spends its task transitions, and at least one, so a phase
whose rollouts make no transition (only parse errors or compactions) still ends - is
:meth:`Usage.spend`, written here once.

Failures are counted by kind, the prefix of a failed leaf's cause (see
docs/operations.md): ``model service`` (the model service did not answer usably after
the client's retries: down, unreachable, overloaded), ``bad response`` (it answered, but
the answer breaks the contract: too long, log-probs that do not line up, ids outside
the vocabulary; :class:`focus.policy.BadResponse`), ``model`` (the request was
rejected), ``env`` and ``error`` (anything else raised inside a rollout job).
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from focus.agent import Rollout
    from focus.tree import RolloutRecord

#: Kinds of failure, by the prefix of a failed leaf's cause.
FAILURE_KINDS = ("model service", "bad response", "model", "env", "error")
SERVICE = "model service"
BAD_RESPONSE = "bad response"


def failure_kind(cause: str) -> str:
    """The kind of a failed leaf's ``cause``: its prefix when known, else ``error``."""
    kind = cause.partition(":")[0].strip()
    return kind if kind in FAILURE_KINDS else "error"


def _merge(a: tuple[tuple[str, int], ...], b: tuple[tuple[str, int], ...]) -> tuple[tuple[str, int], ...]:
    if not a:
        return b
    if not b:
        return a
    out = dict(a)
    for k, n in b:
        out[k] = out.get(k, 0) + n
    return tuple(sorted(out.items()))


def _merge_all(counts: Sequence[tuple[tuple[str, int], ...]]) -> tuple[tuple[str, int], ...]:
    """``_merge`` of ``counts`` one after another, merging once."""
    present = [c for c in counts if c]
    if len(present) < 2:
        return present[0] if present else ()
    out = dict(present[0])
    for c in present[1:]:
        for k, n in c:
            out[k] = out.get(k, 0) + n
    return tuple(sorted(out.items()))


@dataclass(frozen=True, slots=True)
class Usage:
    """What one rollout used, or the sum over several (``+``, :meth:`total`).

    Slotted: a collection keeps one per rollout (each tree's log), and an instance with
    a ``__dict__`` of its 16 fields took 520 bytes (about 320 a transition at 10k
    transitions), one with slots takes 160 (176 with its 18 fields now)."""

    rollouts: int = 0
    failed_rollouts: int = 0
    #: Rollouts that ended in a truncated leaf (the step or context limit, not the task).
    truncated_rollouts: int = 0
    #: Task transitions (env steps); what a phase's budget counts.
    transitions: int = 0
    #: Model calls, compactions included (each is one rollout step).
    rollout_steps: int = 0
    #: Model answers received: the rollout steps, and an answer whose env step failed.
    model_calls: int = 0
    #: Generated tokens (of every answer received, recorded in a turn or not).
    tokens: int = 0
    compactions: int = 0
    #: Answers the action parser could not read (each shown back to the model as its
    #: next observation: a rollout step, no transition), and tool calls that failed, as
    #: the env's ``StepResult.info["tool_error"]`` counts them; the agent counts both per
    #: rollout (``Rollout.counters``).
    parse_errors: int = 0
    tool_errors: int = 0
    #: Budget spent as the planner counts it: :meth:`spend` of each rollout's transitions.
    budget_spent: int = 0
    #: Wall time of the rollouts, summed (they overlap, so this exceeds elapsed time).
    rollout_wall_s: float = 0.0
    #: Wall time of the rollouts that ended in a failed leaf: time lost to failures.
    failed_wall_s: float = 0.0
    #: Model calls that succeeded only after retries, the retries, and the time those
    #: took (failed attempts plus backoff), as the policy client reports them in
    #: ``Completion.meta`` (``retries``: a count or counts by cause, ``retry_s``); 0 when
    #: it does not.
    retried_calls: int = 0
    retries: int = 0
    retry_s: float = 0.0
    #: Failed rollouts by kind (:func:`failure_kind`), sorted by kind.
    failures: tuple[tuple[str, int], ...] = ()
    #: Retries by the cause the client names (``timeout``, ``server error``, ...), sorted.
    retry_causes: tuple[tuple[str, int], ...] = ()

    @staticmethod
    def spend(transitions: int) -> int:
        """Budget a rollout with ``transitions`` task transitions spends: at least one."""
        return max(1, transitions)

    @classmethod
    def of_rollout(cls, rollout: Rollout) -> Usage:
        """The usage of one finished rollout (counted from its turns, once), plus the
        model answers no turn records (``unrecorded_calls`` and ``unrecorded_tokens`` in
        its counters: an answer whose env step failed was still sampled).

        Made without the dataclass's ``__init__`` (its fields straight into a new
        instance's slots, as ``__init__`` would set them: the class has no
        ``__post_init__``): a frozen dataclass sets each of its 18 fields through
        ``object.__setattr__``, which cost more than the counting, and grafting makes
        one per rollout (continuations average 1.4-1.7 transitions)."""
        transitions = rollout_steps = tokens = compactions = 0
        for piece in rollout.pieces:
            for t in piece.turns:
                rollout_steps += 1
                tokens += len(t.completion_ids)
                if t.transition:
                    transitions += 1
                if t.kind == "compaction":
                    compactions += 1
        leaf = rollout.leaf
        failed = leaf.kind == "failed"
        c = rollout.counters
        wall = rollout.wall_s
        usage = _new(cls)
        _fill(
            usage,
            {
                "rollouts": 1,
                "failed_rollouts": int(failed),
                "truncated_rollouts": int(leaf.kind == "truncated"),
                "transitions": transitions,
                "rollout_steps": rollout_steps,
                "model_calls": rollout_steps + c.get("unrecorded_calls", 0),
                "tokens": tokens + c.get("unrecorded_tokens", 0),
                "compactions": compactions,
                "parse_errors": int(c.get("parse_errors", 0)),
                "tool_errors": int(c.get("tool_errors", 0)),
                "budget_spent": cls.spend(transitions),
                "rollout_wall_s": wall,
                "failed_wall_s": wall if failed else 0.0,
                "retried_calls": int(c.get("retried_calls", 0)),
                "retries": int(c.get("retries", 0)),
                "retry_s": float(c.get("retry_ms", 0)) / 1000,
                "failures": ((failure_kind(leaf.cause), 1),) if failed else (),
                "retry_causes": tuple(sorted((k[8:], int(n)) for k, n in c.items() if k.startswith("retries:")))
                if c.get("retries")
                else (),
            },
        )
        return usage

    def __add__(self, other: Usage) -> Usage:
        if not isinstance(other, Usage):
            return NotImplemented
        summed: list[Any] = [
            _merge(a, b) if isinstance(a, tuple) else a + b
            for a, b in ((getattr(self, n), getattr(other, n)) for n in _FIELDS)
        ]
        return Usage(*summed)

    @classmethod
    def total(cls, items: Iterable[Usage]) -> Usage:
        """The sum of ``items``: what adding them one after another with ``+`` gives (the
        same sums, added in the same order), without a new record per item (a
        collection's statistics sum one record per rollout). Each record is read once,
        all its fields together, and nothing is kept per record: the records lie all
        over a large heap (a pass per field cost a cache miss per field), and a list of
        one tuple per record would start young collections, and after a collection a
        full one over the whole heap (2 s at 100k transitions over 40 tasks)."""
        acc = _Sum()
        for u in items:
            acc.add(_COUNTED(u), u.failures, u.retry_causes)
        return acc.usage()

    @classmethod
    def totals_by(cls, items: Iterable[tuple[Hashable, Usage]]) -> tuple[Usage, dict[Hashable, Usage]]:
        """:meth:`total` of every item, and of the items of each key, in one pass: each
        record is read once (a collection's statistics sum the same records in total
        and per phase; a pass each read every record three times, a cache miss each
        at 100k transitions). Each sum adds its items in their order, so every figure
        is what :meth:`total` of that key's items gives."""
        whole = _Sum()
        groups: dict[Hashable, _Sum] = {}
        for key, u in items:
            counted, failures, causes = _COUNTED(u), u.failures, u.retry_causes
            whole.add(counted, failures, causes)
            group = groups.get(key)
            if group is None:
                group = groups[key] = _Sum()
            group.add(counted, failures, causes)
        return whole.usage(), {k: g.usage() for k, g in groups.items()}

    @classmethod
    def of_records(cls, records: Iterable[RolloutRecord]) -> Usage:
        """The sum over rollout log records (each holds its rollout's usage)."""
        return cls.total(r.usage for r in records)

    def __getstate__(self) -> tuple[Any, ...]:
        return _USAGE_STATE(self)

    def __setstate__(self, state: Any) -> None:
        restore_fields(self, state)

    def failed(self, kind: str) -> int:
        """Failed rollouts of one kind."""
        return dict(self.failures).get(kind, 0)

    def as_dict(self) -> dict[str, Any]:
        """JSON-able: the counters, failures as ``{kind: count}``, retries as ``{cause: count}``."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["failures"] = dict(self.failures)
        out["retry_causes"] = dict(self.retry_causes)
        return out


#: Usage's field names in order (its constructor's positional arguments).
_FIELDS = tuple(f.name for f in dataclasses.fields(Usage))
#: The counters (every field but the two tuples of counts by kind), read at once.
_COUNTED_FIELDS = tuple(n for n in _FIELDS if n not in ("failures", "retry_causes"))
_COUNTED = operator.attrgetter(*_COUNTED_FIELDS)
_ZERO = _COUNTED(Usage())
#: Each slot's setter, in field order (a member descriptor's, which the frozen class's
#: ``__setattr__`` does not guard).
_USAGE_SET = {name: Usage.__dict__[name].__set__ for name in _FIELDS}
_USAGE_STATE = operator.attrgetter(*_FIELDS)


def _fill(usage: Usage, fields: dict[str, Any]) -> None:
    """Every field of a new ``usage`` from ``fields`` (each by its slot's setter)."""
    for name, value in fields.items():
        _USAGE_SET[name](usage, value)


def fields_state(cls: type) -> Callable[[Any], tuple[Any, ...]]:
    """A frozen slotted dataclass's ``__getstate__``: its field values in order, read at
    once (the dataclass's own looks its fields up on every instance pickled: a tree's
    turns and records pickled a quarter slower)."""
    return operator.attrgetter(*(f.name for f in dataclasses.fields(cls)))


def restore_fields(record: Any, state: Any) -> None:
    """``__setstate__`` of a frozen slotted dataclass: ``state`` is its field values in
    order (:func:`fields_state`, or the list the dataclass's own ``__getstate__`` gives)
    or, pickled before the class had slots (a checkpoint store's trees, a Dask payload),
    the instance's ``__dict__``, a field it lacks at its default. The dataclass's own
    ``__setstate__`` zipped the fields with such a dict's keys: every field a field
    name, silently."""
    cls = type(record)
    fields = _FIELDS_OF.get(cls)
    if fields is None:
        fields = _FIELDS_OF[cls] = dataclasses.fields(cls)
    if isinstance(state, dict):
        missing = [f.name for f in fields if f.name not in state and f.default is dataclasses.MISSING]
        if missing:
            raise TypeError(f"{cls.__name__} pickled without the fields {missing}")
        for f in fields:
            _set(record, f.name, state[f.name] if f.name in state else f.default)
        return
    for f, value in zip(fields, state, strict=True):
        _set(record, f.name, value)


_FIELDS_OF: dict[type, tuple[dataclasses.Field[Any], ...]] = {}


class _Sum:
    """A running :meth:`Usage.total`: the counters added field by field in the order
    the records come (``map`` over the fields: the same additions as ``+``), the
    non-empty counts by kind kept to merge once at the end."""

    __slots__ = ("counted", "failures", "causes", "n")

    def __init__(self) -> None:
        self.counted: list[Any] = list(_ZERO)
        self.failures: list[tuple[tuple[str, int], ...]] = []
        self.causes: list[tuple[tuple[str, int], ...]] = []
        self.n = 0

    def add(self, counted: tuple[Any, ...], failures: tuple[Any, ...], causes: tuple[Any, ...]) -> None:
        self.counted = list(map(operator.add, self.counted, counted))
        if failures:
            self.failures.append(failures)
        if causes:
            self.causes.append(causes)
        self.n += 1

    def usage(self) -> Usage:
        if not self.n:
            return Usage()
        fields = dict(zip(_COUNTED_FIELDS, self.counted, strict=True))
        return Usage(**fields, failures=_merge_all(self.failures), retry_causes=_merge_all(self.causes))


_new = object.__new__
_set = object.__setattr__


def wall_of(records: Iterable[RolloutRecord]) -> float:
    """Elapsed time of the waves the records belong to: each wave's ``wave_wall_s`` once."""
    waves = {(r.phase, r.wave): r.wave_wall_s for r in records}
    return sum(waves.values())


def count_retries(counters: dict[str, int], meta: dict[str, Any]) -> None:
    """Add a call's retries to the rollout's counters (``retries:<cause>`` per cause; see
    :class:`focus.usage.Usage`). The HTTP clients report them in ``Completion.meta["http"]``
    (a :class:`focus.backends.retry.CallRecord`: one ``(cause, seconds lost)`` per failed
    attempt); another client may give ``retries`` (a count, or counts by cause) and
    ``retry_s`` in ``meta`` itself."""
    record = meta.get("http")
    errors = getattr(record, "errors", None)
    if type(errors) is tuple and not errors:  # a call answered at its first attempt: most calls
        return
    if errors is not None:
        by_cause: dict[str, int] = {}
        for cause, _lost in errors:
            by_cause[str(cause)] = by_cause.get(str(cause), 0) + 1
        lost_s = sum(float(lost) for _cause, lost in errors)
    else:
        retries = meta.get("retries")
        by_cause = (
            {str(k): int(v) for k, v in retries.items()} if isinstance(retries, dict) else {"": int(retries or 0)}
        )
        lost_s = float(meta.get("retry_s", 0.0))
    total = sum(by_cause.values())
    if total:
        counters["retried_calls"] = counters.get("retried_calls", 0) + 1
        counters["retries"] = counters.get("retries", 0) + total
        counters["retry_ms"] = counters.get("retry_ms", 0) + round(1000 * lost_s)
        for cause, n in by_cause.items():
            if cause and n:
                counters[f"retries:{cause}"] = counters.get(f"retries:{cause}", 0) + n
