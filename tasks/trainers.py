"""Trainer steps of the train loop: what one is given and returns, and the two FOCUS
ships (``train.trainer = "local" | "tinker"``).

A trainer step is ``f(batch_url, TrainContext, **options) -> TrainResult`` (the types
below; ``train.trainer`` may name your own by import path); the ``train_loop`` flow
calls it once per iteration, in a worker thread, and records its result. Both built-ins read the batch back from the store
(exactly what was exported) and write what they produce as one version of the
:class:`storage.weights.WeightStore`, beside the batches under the store root:

- :func:`local_trainer` trains the embedded tiny model (:mod:`focus.train_local`):
  clipped policy gradient on the batch's advantages, and the local critic fitted on
  its critic targets. It starts from the previous version's weights *and optimizer
  state*, so a rerun after a crash computes bit for bit what an uninterrupted run does.
- :func:`tinker_trainer` runs ``forward_backward`` + ``optim_step`` on Tinker
  (:class:`focus.backends.tinker_backend.TinkerTrainer`) and returns the ``tinker://``
  sampler path the next collection samples from. Without ``TINKER_API_KEY`` (or with
  ``train.tinker.dry_run``) it builds and checks every request with the SDK's types
  and sends none.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # tasks.config re-exports the types below: no import of it at load time
    from storage.weights import WeightStore
    from tasks.config.schema import FocusConfig


@dataclass(frozen=True)
class TrainContext:
    """What a trainer step is given besides the batch URL.

    ``weights`` is the weights URL (or path) the batch was sampled with (``None``: the
    model's default), ``critic`` the critic weights it was scored with, ``state`` the
    previous step's :attr:`TrainResult.state` (``None`` on the first step). ``out`` is
    the folder URL under the store root where this step's version goes
    (``storage.WeightStore``: ``weights/<run>/v<iteration + 1>``); ``workdir`` a local
    scratch folder. ``report(step, total=None, loss=None)``, when given, shows how far
    training is on the loop's live line (cheap; call it from any thread, as often as
    you like); a trainer that never calls it shows its elapsed time only.
    """

    iteration: int
    config: FocusConfig
    weights: str | None
    policy_version: str | None
    workdir: str
    model_url: str | None = None
    out: str = ""
    critic: str | None = None
    state: str | None = None
    report: Callable[..., None] | None = None


@dataclass(frozen=True)
class TrainResult:
    """What a trainer step returns: the new policy version and where its weights are.

    For the embedded model ``weights`` is a weights file (URL or path) the flow loads
    into the model server before the next collection; for Tinker, the ``tinker://``
    sampler path the next collection samples from. ``critic`` is the critic to score
    the next collection with, ``state`` whatever the next step needs to continue
    (passed back as :attr:`TrainContext.state`). ``metrics`` are numbers to report.
    """

    policy_version: str
    weights: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    critic: str | None = None
    state: str | None = None


#: A file of a version of the weight store, relative to the root.
_VERSION_FILE = re.compile(r"^weights/[^/]+/v\d{6}/[^/]+$")


def local_weights(url: str | None, root: str) -> str | None:
    """A local path holding the weights at ``url`` (a path, a ``file://`` URL, or any
    fsspec URL; files of the weight store under ``root`` are checked against their
    manifest). ``None`` stays ``None`` (the model's default weights)."""
    if url is None:
        return None
    if "://" not in url:
        return url
    from storage import CorruptDataError, ManifestError
    from storage.temp import user_temp_folder
    from storage.weights import WeightStore

    store = WeightStore(root)
    try:
        stored = _VERSION_FILE.match(store.loc.relative(url)) is not None
    except Exception:  # noqa: BLE001 - not under the root: fetch it as it is
        stored = False
        if url.startswith("file://"):
            return url.removeprefix("file://")
        import fsspec

        from storage.manifest import sha256

        with fsspec.open(url, "rb") as f:
            data = f.read()
        path = user_temp_folder("focus-weights") / f"{sha256(data)[:32]}-{url.rsplit('/', 1)[-1]}"
        if not path.is_file():
            tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
            tmp.write_bytes(data)
            os.replace(tmp, path)
        return str(path)
    try:
        if url.startswith("file://"):  # read in place, once checked
            if stored:
                store.read(url)
            return url.removeprefix("file://")
        return str(store.local_copy(url))
    except (CorruptDataError, ManifestError) as e:
        raise CorruptDataError(f"{e}; {_train_again(store, url)}") from e


def _train_again(store: WeightStore, url: str) -> str:
    """What to do about a damaged version of the weight store: a stored file was loaded
    unchecked (a bit flip or a cut: `the embedded model server did not start: ... not a
    torch checkpoint`, nothing about the store); the trainer step that wrote version v
    is the loop's record ``("train", v - 1)``, and training is deterministic."""
    from storage import CheckpointStore

    _, run_id, folder, *_ = store.loc.relative(url).split("/")  # weights/<run>/v<version>/<file>
    record = CheckpointStore(store.root).url_for(run_id, "train", int(folder[1:]) - 1) + ".manifest.json"
    return f"restore it from where the store came from, or remove {record} and rerun to train that iteration again"


def _read_batch(config: FocusConfig, batch_url: str) -> Any:
    from storage import BatchStore

    return BatchStore(config.storage.root).read(batch_url)


def check_local_sampling(cfg: FocusConfig) -> None:
    """Refuse sampling the local trainer's ratio cannot compare with: top-p below 1 (the
    ratio assumes full softmax sampling), and a greedy collection (temperature 0)
    without an explicit ``train.local.temperature``, which was trained at temperature 1
    without a word. The loop checks it before its first collection (:func:`flows.loop.check`)."""
    from tasks.config.schema import ConfigError

    if cfg.agent.sampling.top_p != 1.0:
        raise ConfigError("the local trainer needs agent.sampling.top_p = 1 (its ratio assumes full softmax sampling)")
    if cfg.train.local.temperature is None and cfg.agent.sampling.temperature <= 0:
        raise ConfigError(
            "the local trainer needs agent.sampling.temperature > 0: greedy samples have no behaviour distribution "
            "for its ratio (or set train.local.temperature)"
        )


def local_trainer(batch_url: str, ctx: TrainContext, **options: Any) -> TrainResult:
    """Train the embedded model and the local critic on one batch; publish the version.

    ``options`` override fields of ``train.local`` (``focus.train_local.UpdateConfig``).
    Writes ``policy.pt``, ``optimizer.pt`` and (with ``critic.kind = "local"``)
    ``critic.pt`` into ``ctx.out``.
    """
    from focus.train_local import PolicyTrainer, UpdateConfig, train_iteration
    from storage.weights import WeightStore
    from tasks.config.schema import ConfigError

    cfg = ctx.config
    if cfg.model.kind != "local":
        raise ConfigError(f"train.trainer 'local' trains the embedded model; model.kind is {cfg.model.kind!r}")
    check_local_sampling(cfg)
    update = UpdateConfig(**{**cfg.train.local.model_dump(), **options})
    if update.temperature is None:
        update = update.model_copy(update={"temperature": cfg.agent.sampling.temperature})
    store = WeightStore(cfg.storage.root)
    batch = _read_batch(cfg, batch_url)
    state = store.read(ctx.state) if ctx.state else None
    trainer = PolicyTrainer(local_weights(ctx.weights, cfg.storage.root), update, state=state)
    critic = None
    if cfg.critic.kind == "local":
        from focus.critic import LocalCritic

        critic = LocalCritic.load(ctx.critic) if ctx.critic else cfg.build_critic()
    work = Path(ctx.workdir)
    work.mkdir(parents=True, exist_ok=True)
    report = ctx.report
    on_step = (lambda s: report(s.step, s.total, s.loss)) if report is not None else None
    out = train_iteration(trainer, critic, batch, work / "policy.pt", on_step)
    files = {"policy.pt": (work / "policy.pt").read_bytes(), "optimizer.pt": trainer.state_bytes()}
    if critic is not None and out["critic"]["fitted"]:
        critic.save(str(work / "critic.pt"))
        files["critic.pt"] = (work / "critic.pt").read_bytes()
    metrics = {f"train_{k}": float(v) for k, v in out["train"].items()}
    metrics |= {f"critic_{k}": float(v) for k, v in out["critic"].items()}
    folder = store.put(
        ctx.out, files, {"iteration": ctx.iteration, "batch_url": batch_url, "policy_version": out["policy_version"]}
    )
    return TrainResult(
        policy_version=out["policy_version"],
        weights=f"{folder}/policy.pt",
        metrics=metrics,
        critic=f"{folder}/critic.pt" if "critic.pt" in files else ctx.critic,
        state=f"{folder}/optimizer.pt",
    )


def tinker_trainer(batch_url: str, ctx: TrainContext, **options: Any) -> TrainResult:
    """One LoRA step on Tinker per batch; the next collection samples the new weights.

    ``options`` override fields of ``train.tinker``. Sends nothing (a dry run) when
    ``dry_run`` is set, when ``TINKER_API_KEY`` is not, or when the batch was not
    sampled from a Tinker model (``model.kind`` is not ``tinker``: its token ids are
    another model's), was sampled from the base weights of another model than the one
    trained (no ``ctx.weights`` and ``model.model`` is not the base model), or has
    nothing to learn (``focus.exporters.nothing_to_learn``: its gradient is 0, but
    ``optim_step`` from the saved optimizer state still moved the weights by Adam's
    momentum). Either way
    every request is built and checked, and what it would send is written to ``ctx.out``
    as ``requests.json``.
    """
    from focus.backends.tinker_backend import TinkerTrainer, TinkerUpdateConfig, build_requests, check_requests
    from focus.exporters import actor_sequences, nothing_to_learn, to_tinker_datums
    from storage.weights import WeightStore
    from tasks.config.schema import ConfigError

    cfg = ctx.config
    tcfg = TinkerUpdateConfig(**{**cfg.train.tinker.model_dump(), **options})
    base_model = tcfg.base_model or cfg.model.model
    if not base_model:
        raise ConfigError("the tinker trainer needs train.tinker.base_model (or model.model): the model to fine-tune")
    batch = _read_batch(cfg, batch_url)
    # exactly the inputs of the configured loss: the service refuses any other key
    datums = to_tinker_datums(batch, loss_fn=tcfg.loss_fn, include_mask=False)
    name = f"{ctx.config.collection_id or 'focus'}-v{ctx.iteration + 1:06d}"
    report = check_requests(build_requests(datums, tcfg, base_model=base_model, name=name, state_path=ctx.state))
    why = None
    if tcfg.dry_run:
        why = "train.tinker.dry_run is set"
    elif not os.environ.get("TINKER_API_KEY"):
        why = "TINKER_API_KEY is not set"
    elif cfg.model.kind != "tinker":
        why = f"model.kind is {cfg.model.kind!r}: the batch's token ids are not {base_model}'s"
    elif not ctx.weights and cfg.model.model != base_model:  # sampled by model.model's base weights
        why = f"the batch was sampled by {cfg.model.model}: its token ids are not {base_model}'s"
    elif nothing_to_learn(actor_sequences(batch)):  # a zero gradient, but Adam's momentum would move the weights
        why = "every advantage is 0, or they cancel over identical sequences (nothing to learn)"
    store = WeightStore(cfg.storage.root)
    counts = {k: float(report[k]) for k in ("datums", "tokens", "tokens_with_advantage", "forward_backward_bytes")}
    if why is not None:
        report |= {"sent": False, "reason": f"{why}: built and checked every request, sent none"}
        store.put(ctx.out, {"requests.json": json.dumps(report, indent=1).encode()}, {"iteration": ctx.iteration})
        return TrainResult(
            policy_version=ctx.policy_version or "0",
            weights=ctx.weights,
            metrics={**counts, "sent": 0.0},
            critic=ctx.critic,
            state=ctx.state,
        )
    step = TinkerTrainer(tcfg, base_model).step(datums, name, ctx.state)
    report |= {"sent": True, "sampler_path": step.sampler_path, "state_path": step.state_path, "metrics": step.metrics}
    store.put(ctx.out, {"requests.json": json.dumps(report, indent=1).encode()}, {"iteration": ctx.iteration})
    return TrainResult(
        policy_version=step.sampler_path,
        weights=step.sampler_path,
        metrics={**counts, **step.metrics, "sent": 1.0},
        critic=ctx.critic,
        state=step.state_path,
    )
