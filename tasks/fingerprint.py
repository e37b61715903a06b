"""What a collection must be resumed with: the configuration that determines its result
(its fingerprint, compared by the pipeline's first step and by the preflight) and the
settings of the env's codec (:class:`CodecRecord`), the policy that sampled it (the versions its rollouts' turns report) and the critic that
scored it (what it predicts on fixed probe contexts), so a resume never mixes two
policies or two critics in one batch unless the user allows it explicitly."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from focus.critic import Critic, check_predictions, scored
from focus.journal import Step
from tasks.config import FocusConfig
from tasks.config.parts import BEFORE_PARTS
from tasks.config.schema import resumable_fields
from tasks.config.search import BEFORE_KNOBS

if TYPE_CHECKING:
    from focus.format import ChatCodec

#: Fields a collection's resume ignores: where things run and how patiently (the HTTP
#: clients' timeouts, retries and hedging change how patiently a result is fetched, not
#: the result: requests are seeded), and the train section, which a collection never
#: reads. Read off the schema's :class:`~tasks.config.schema.Resumable` marks.
RUNTIME_FIELDS = resumable_fields("collection")


class ResumeMismatch(RuntimeError):
    """A collection id reused with a different configuration."""


class IdTaken(ResumeMismatch):
    """An id given to a collection and a train loop: both keep their records under
    ``checkpoints/<id>`` (:func:`tasks.gaps.check_records`, :func:`tasks.loop_settings.settle`)."""


class PolicyChanged(ResumeMismatch):
    """A collection resumed against another policy than the one that sampled it."""


class CriticChanged(ResumeMismatch):
    """A collection resumed with another critic than the one that scored it."""


def _policy_changed(cid: str | None, before: str, now: str) -> PolicyChanged:
    return PolicyChanged(
        f"collection {cid!r} was sampled by policy {before}, the model service now serves {now}: going on would "
        "mix two policies in one batch (a resume, or weights changed while it ran); collect against the same "
        "weights (rerun with the same id), or pass --allow-policy-change (in a Prefect run of the collect flow, its allow_policy_change parameter)"
    )


#: Weight files a train loop's iteration names; those in the store's weight store are
#: fingerprinted relative to its root, so a moved store resumes (``storage/weights.py``).
WEIGHT_FIELDS = (("model", "weights"), ("critic", "weights"))
_STORED_WEIGHTS = re.compile(r"^[a-z0-9+.-]+://.*?/(weights/[^/]+/v\d{6}/[^/]+)$")


def fingerprint(config: FocusConfig, ignored: tuple[str, ...] = RUNTIME_FIELDS) -> dict[str, Any]:
    """What determines a collection's result: the config without the ``ignored`` fields
    (where things run), with the weight store's files named relative to the store's root,
    and with each search knob as the search gets it (one left unset: the library's
    default now, so a resume after that default moved is refused, naming the knob)."""
    data = config.model_dump(mode="json")
    data["search"].update(config.search.knob_values())
    data["estimator"].update(config.estimator.knob_values())
    root = config.storage.root.rstrip("/") + "/"
    for section, key in WEIGHT_FIELDS:
        value = data.get(section, {}).get(key)
        if isinstance(value, str) and value.startswith(_normalised(root)):
            data[section][key] = value[len(_normalised(root)) :]
    return without(data, ignored)


def without(data: dict[str, Any], ignored: tuple[str, ...]) -> dict[str, Any]:
    """``data`` (a fingerprint) without the dotted fields ``ignored``: applied to a stored
    one too, which may hold fields a resume ignores now (``train``, ``model.urls``)."""
    out = json.loads(json.dumps(data))
    for dotted in ignored:
        *path, last = dotted.split(".")
        node = out
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(last, None)
    return dict(out)


def _normalised(root: str) -> str:
    """``root`` as the weight store writes URLs under it (a folder becomes ``file://``)."""
    from storage.urls import Location

    return Location(root.rstrip("/")).root + "/"


def _legacy(stored: dict[str, Any]) -> dict[str, Any]:
    """A stored fingerprint as :func:`fingerprint` now writes it. One made before stores
    were relocatable names weight-store files by absolute URL: the part under the root;
    and see :func:`with_old_knobs` and :func:`with_old_parts`."""
    out = with_old_parts(with_old_knobs(stored))
    for section, key in WEIGHT_FIELDS:
        value = (out.get(section) or {}).get(key)
        if isinstance(value, str) and (m := _STORED_WEIGHTS.match(value)):
            out[section] = {**out[section], key: m.group(1)}
    return out


def with_old_knobs(stored: dict[str, Any]) -> dict[str, Any]:
    """A stored fingerprint (a collection's, a loop's settings) made before the
    configuration had the search's knobs lacks them: its selective search ran with the
    library's defaults of that time (:data:`tasks.config.search.BEFORE_KNOBS`), which
    this fills in (a fingerprint made since names every knob)."""
    search = stored.get("search")
    if not isinstance(search, dict) or search.get("kind", "selective") != "selective":
        return {**stored}
    return {**stored, "search": {**BEFORE_KNOBS, **search}}


def with_old_parts(stored: dict[str, Any]) -> dict[str, Any]:
    """A stored fingerprint made before the search, the estimator and the agent's parts
    could name a factory lacks their ``factory`` and ``options`` (and ``estimator.kind``),
    and names the agent's parts by kind alone (``"context": "segments"``): it ran with
    the values :data:`tasks.config.parts.BEFORE_PARTS` gives, which this fills in."""
    out = json.loads(json.dumps(stored))
    for dotted, before in BEFORE_PARTS.items():
        *path, last = dotted.split(".")
        node = out
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict) or last not in node:
            continue
        value = node[last]
        if isinstance(value, str):
            value = {"kind": value}
        if isinstance(value, dict):
            node[last] = {**before, **value}
    return dict(out)


def resume_mismatch(
    config: FocusConfig, stored: dict[str, Any], mine: dict[str, Any], *, allow_policy_change: bool = False
) -> ResumeMismatch | None:
    """The error for resuming ``config``'s collection, whose stored fingerprint is
    ``stored``, with the fingerprint ``mine`` (``None`` if they agree). Another
    ``model.policy_version`` (the embedded server's weights) is :class:`PolicyChanged`."""
    if CODEC not in stored or CODEC not in mine:  # compared once the env is built (CodecRecord)
        stored, mine = without(stored, (CODEC,)), without(mine, (CODEC,))
    diffs = changes(without(_legacy(stored), RUNTIME_FIELDS), mine)
    others = [d for d in diffs if d[0] != "model.policy_version"]
    if allow_policy_change or others:
        # another model altogether (model.kind, its factory) is a configuration that
        # differs, named in full: it was "sampled by policy 3457..., the model service now
        # serves None", which hid what changed and offered --allow-policy-change, which
        # cannot resume it
        diffs = others if allow_policy_change else diffs
    elif diffs:
        versions = [d.get("model", {}).get("policy_version") for d in (stored, mine)]
        return _policy_changed(config.collection_id, *map(str, versions))
    return _mismatch(config, diffs) if diffs else None


def _mismatch(config: FocusConfig, diffs: list[Change]) -> ResumeMismatch:
    return ResumeMismatch(
        f"collection {config.collection_id!r} already exists in {config.storage.root} with a different "
        f"configuration (differs in: {describe(diffs)}); resume it with the same configuration or use a new "
        "collection id"
    )


#: The key of the env codec's settings in a collection's configuration record.
CODEC = "codec"


def codec_settings(codec: ChatCodec) -> dict[str, Any]:
    """What of the env's codec decides the ids it renders: its class and its
    :meth:`~focus.format.ChatCodec.settings`, as JSON gives them back."""
    cls = type(codec)
    return dict(json.loads(json.dumps({"class": f"{cls.__module__}.{cls.__qualname__}", **codec.settings()})))


class CodecRecord:
    """The env codec's settings, kept in the configuration record (under :data:`CODEC`),
    and the refusal to resume with others (:class:`ResumeMismatch`, as for a field).

    The codec comes from ``env.factory``'s code, not from the configuration: a factory
    changed from ``HFChatCodec(..., content_special_tokens="control")`` to the default
    ``"text"`` changed no field, and a resume rendered env text holding special-token
    strings into other ids in its new waves than in its old ones, in one batch. The
    codec is known once the env is built, after the configuration check
    (:meth:`tasks.journal.CheckpointJournal.check_config`), so a new collection's record
    is saved then (:meth:`check`), still before its first step. A record saved before
    codecs were recorded has none, and such a collection resumes unchecked, as it did; a
    setting a codec gained since its record was saved (``HFChatCodec``'s tokenizer digest)
    is likewise not compared."""

    def __init__(self, config: FocusConfig) -> None:
        self.config = config
        #: The configuration check's fingerprint and the record it read (``None``: a new collection).
        self.mine: dict[str, Any] | None = None
        self.stored: dict[str, Any] | None = None

    async def check(self, codec: ChatCodec, save: Callable[[Any, Any], None]) -> None:
        """Save the configuration record with ``codec``'s settings (a new collection), or
        compare them with the record's; after the configuration check, which read it."""
        if self.mine is None:  # no configuration check: no record to save or compare
            return
        mine = codec_settings(codec)
        if self.stored is None:
            self.stored = {**self.mine, CODEC: mine}
            await asyncio.to_thread(save, CONFIG_KEY, json.dumps(self.stored, sort_keys=True))
            return
        before = self.stored.get(CODEC)
        if before is None:
            return
        # a setting the record lacks was added to the codec since it was saved: not compared
        mine = {k: v for k, v in mine.items() if k in before}
        if diffs := changes(before, mine, f"{CODEC}."):
            raise _mismatch(self.config, diffs)


Change = tuple[str, Any, Any]


def changes(a: Any, b: Any, prefix: str = "") -> list[Change]:
    """``(dotted name, value in a, value in b)`` of each field that differs. A field one
    side lacks counts as ``None``, so a field added to the config since a collection was
    stored, left unset, is no difference (the collection resumes). Lists of tables of
    one length (``search.phases``) are compared item by item."""
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[Change] = []
        for k in sorted(set(a) | set(b)):
            out += changes(a.get(k), b.get(k), f"{prefix}{k}.")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and all(isinstance(x, dict) for x in a + b):
        return [c for i, (x, y) in enumerate(zip(a, b, strict=True)) for c in changes(x, y, f"{prefix}{i}.")]
    return [] if a == b else [(prefix.rstrip("."), a, b)]


def describe(diffs: list[Change], most: int = 6) -> str:
    """``seed 0 → 5, agent.sampling.temperature 1.0 → 0.7`` (at most ``most``, then how many more)."""
    shown = ", ".join(f"{path} {_value(old)} → {_value(new)}" for path, old, new in diffs[:most])
    return shown + (f" and {len(diffs) - most} more" if len(diffs) > most else "")


def _value(v: Any) -> str:
    text = "unset" if v is None else v if isinstance(v, str) else json.dumps(v, sort_keys=True)
    return text if len(text) <= 48 else text[:45] + "..."


class PolicyIdentity:
    """The policy versions a collection's rollouts report (``Turn.policy_version``: the
    embedded server's weights version, SGLang's ``weight_version``, vLLM's model), taken
    from the first step that has any, and the refusal to record a step sampled by
    another one. A server's answers say which weights served them, so a resume against
    a server whose weights changed under the same name is caught at its first new wave,
    before anything of it is saved."""

    def __init__(self, collection_id: str | None, *, allow_change: bool = False) -> None:
        self.collection_id, self.allow_change = collection_id, allow_change
        self.versions: set[str] | None = None

    def note(self, step: Step, value: Any, *, new: bool) -> None:
        """Learn the versions of a step (replayed, or ``new``); refuse a new one that differs."""
        if step.kind == "evidence":
            rollouts: Any = ((e.turns for e in t.edges.values()) for t in value.trees)
        elif step.kind in ("wave", "unfinished"):
            rollouts = ((p.turns for p in ro.pieces) for ro in value.rollouts)
        else:
            return
        found = {t.policy_version for group in rollouts for turns in group for t in turns if t.policy_version}
        if not found:
            return
        if new and self.versions is None and len(found) > 1 and not self.allow_change:
            # the first step has nothing before it to differ from, but it must agree with itself
            raise PolicyChanged(
                f"collection {self.collection_id!r}: the rollouts of its {step.kind} step were sampled by "
                f"{len(found)} policies ({', '.join(sorted(found))}): the model service changed weights while it "
                "ran; rerun against one set of weights, or pass --allow-policy-change (in a Prefect run of the collect flow, its allow_policy_change parameter)"
            )
        if self.versions is None or self.allow_change or not new:
            self.versions = (self.versions or set()) | found
        elif not found <= self.versions:
            # name only the new versions: a wave cut by a restart on other weights reports
            # the old ones too, and "now serves A, B" read as if A were still served
            now = ", ".join(sorted(found - self.versions))
            raise _policy_changed(self.collection_id, ", ".join(sorted(self.versions)), now)


#: Where a collection's first run saves, before any step, its configuration's
#: fingerprint and the identity of its critic (checked by :func:`tasks.gaps.check_records`).
CONFIG_KEY, CRITIC_KEY = ("config", 0), ("critic", 0)
#: Contexts the critic scores to identify itself: short, ids below 256 (inside any
#: vocabulary), different lengths and tails, so two critics that differ anywhere a
#: context's tail reaches are unlikely to agree on all of them.
PROBES: tuple[tuple[int, ...], ...] = (
    (0,),
    (1, 2, 3),
    (255, 254, 253, 252),
    tuple(range(32, 96)),
    tuple(range(200, 120, -1)),
    (10, 97, 98, 99, 10, 62, 32),
)


async def critic_identity(critic: Critic) -> str:
    """The critic's name and a digest of what it predicts on :data:`PROBES`.

    Works for every kind of critic, including a scoring service that says nothing about
    its weights: a service restarted with other weights behind the same URL predicts
    other values. Values are rounded to 9 significant digits, so a service whose sums
    differ in the last bits between calls (a GPU's reduction order) still reads as
    itself, while a refit critic, whose values move far more, does not. Costs one
    critic call of six short contexts per run."""
    where = f"critic {type(critic).__name__}"
    preds = check_predictions(await scored(critic, PROBES, where), len(PROBES), where)
    data = [[f"{p.value:.9g}", None if p.std is None else f"{p.std:.9g}"] for p in preds]
    digest = hashlib.sha256(json.dumps(data).encode()).hexdigest()[:12]
    return f"{type(critic).__name__} {digest}"


class CriticIdentity:
    """The critic a collection started with, saved beside its configuration, and the
    refusal to resume with another (:class:`CriticChanged`), unless ``allow_change``."""

    def __init__(self, collection_id: str | None, *, allow_change: bool = False) -> None:
        self.collection_id, self.allow_change = collection_id, allow_change
        self.identity: str | None = None

    async def check(
        self, critic: Critic, load: Callable[[tuple[str, int]], Any], save: Callable[[tuple[str, int], Any], None]
    ) -> None:
        """Save ``critic``'s identity on the first run; compare it on a resume. ``load``
        returns ``None`` only where no identity is saved and none is needed
        (:func:`tasks.gaps.load_record`: no step saved yet, or another critic allowed)."""
        mine = await critic_identity(critic)
        stored = await asyncio.to_thread(load, CRITIC_KEY)
        if stored is not None and stored != mine and not self.allow_change:
            raise CriticChanged(
                f"collection {self.collection_id!r} was scored by critic {stored}, the critic now is {mine}: "
                "resuming would mix two critics' scores in one batch; resume with the same critic, or pass "
                "--allow-policy-change (in a Prefect run of the collect flow, its allow_policy_change parameter)"
            )
        if stored is None:
            await asyncio.to_thread(save, CRITIC_KEY, mine)
        self.identity = mine
