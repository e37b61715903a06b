"""The critic: predicted remaining return from a checkpoint's context.

A :class:`Critic` maps the exact context token ids of checkpoints to value predictions,
in batches and asynchronously (a critic is usually a service). It may also report an
uncertainty per prediction. Search uses predictions to rank checkpoints; preparation
shrinks observed returns toward them (``focus.estimation``). Actor and critic stay
fixed while a tree is scored; training updates them between collections (a trainable
critic never fitted is fitted on the evidence before its first prediction:
:func:`warm_start`, called by ``Collector.run_evidence``).

Backends: :class:`ConstantCritic` (no model: the same value everywhere),
:class:`HttpCritic` (a scoring service over HTTP) and :class:`LocalCritic` (a small
trainable model on CPU, fitted on the critic targets of prepared batches; see
torch imported lazily).
"""

from __future__ import annotations

import abc
import asyncio
import copy
import inspect
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from numbers import Number, Real
from typing import Any, ClassVar

from focus.backends.retry import HttpConfig, http_config
from focus.env import VALUE_LIMIT
from focus.local_limits import LocalResourceError
from focus.reprs import short_value


class CriticError(RuntimeError):
    """The critic could not score (service down, malformed answer, bad input)."""


class CriticRefused(CriticError):
    """The critic service refused a request with a status that refuses any request
    (``focus.refusals.REFUSED_STATUSES``: a wrong URL, path or key, a server that is no
    scoring service): a setting to fix, not a failure of the collection. It said only
    ``POST <url> was rejected with status 501: <page>``, naming no critic or setting."""


@dataclass(frozen=True)
class Prediction:
    value: float
    std: float | None = None


class Critic(abc.ABC):
    """Predicted remaining return of checkpoint contexts. Implement :meth:`predict`."""

    #: Whether the prediction of a context depends on that context alone, not on the
    #: other contexts of the call or on how contexts are split into calls. The collector
    #: then scores a wave's trees as they finish, a few trees per call, instead of all
    #: of them in one call at the wave's barrier (:mod:`focus.waves`); the scores are
    #: the same either way only for such a critic. Off by default: a model behind a
    #: server or a batched forward pass may round differently in another batch.
    row_wise: ClassVar[bool] = False

    @abc.abstractmethod
    async def predict(self, contexts: Sequence[Sequence[int]]) -> list[float]:
        """One predicted value per context, in order."""

    async def predict_with_std(self, contexts: Sequence[Sequence[int]]) -> list[Prediction]:
        """Predictions with an uncertainty; the default reports none."""
        pending: Any = self.predict(contexts)  # a subclass may declare it without async
        if not inspect.isawaitable(pending):
            raise CriticError(
                f"{type(self).__name__}.predict returned {type(pending).__name__}, not an awaitable: declare it `async def`"
            )
        values = await pending
        _check_listed(values, f"critic {type(self).__name__}")
        return [Prediction(v) for v in values]

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release connections; the default holds none."""


async def scored(critic: Critic, contexts: Sequence[Sequence[int]], where: str) -> list[Prediction]:
    """``critic.predict_with_std(contexts)``, with an exception from inside it (a user's
    critic with a bug, a client library's error) raised as a :class:`CriticError`
    naming ``where`` (the critic) and chaining the original: a bare ``KeyError: 'value'``
    stopped the collection, and the pipeline's one-line error, naming neither the critic
    nor that it was scoring."""
    try:
        return await critic.predict_with_std(contexts)
    except (CriticError, LocalResourceError):  # this machine's limit names itself (focus.local_limits)
        raise
    except Exception as e:
        cause = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        raise CriticError(f"{where} raised {cause} while scoring {len(contexts)} contexts") from e


def _check_listed(values: object, where: str) -> None:
    """A mapping's keys were taken as the values (``{i: v}`` scored 0, 1, 2, ...); ``None``
    (a ``return`` forgotten) or a single number failed with "'NoneType' object is not
    iterable" inside this module, naming neither the critic nor its method."""
    if isinstance(values, (Mapping, str, bytes)) or not hasattr(values, "__iter__"):
        what = "None" if values is None else f"a {type(values).__name__}"
        raise CriticError(f"{where} returned {what}: return a list, one value per context in order")


def _check_values(
    values: Sequence[Any], n: int, where: str, label: Callable[[int], str] | None = None, *, finite: bool = True
) -> list[float]:
    if len(values) != n:
        raise CriticError(f"{where} returned {len(values)} values for {n} contexts")
    out: list[Any] = []
    for i, v in enumerate(values):
        try:
            if isinstance(v, str | bytes):  # float() reads "0.3"
                raise TypeError(v)
            f: Any = v if v is None and not finite else float(v)  # a null (as a NaN): the caller names it
        except (TypeError, ValueError):
            raise CriticError(f"{where} returned a non-numeric value {v!r} at {_at(i, label)}") from None
        except OverflowError:  # an int past a float's range (10**400)
            raise CriticError(
                f"{where} returned the value {short_value(v)} beyond ±{VALUE_LIMIT:g} at {_at(i, label)}"
            ) from None
        if finite and not math.isfinite(f):
            raise CriticError(f"{where} returned a non-finite value {f!r} at {_at(i, label)}")
        if finite and abs(f) > VALUE_LIMIT:  # its square's square overflows in the noise fit
            raise CriticError(f"{where} returned the value {f!r} beyond ±{VALUE_LIMIT:g} at {_at(i, label)}")
        out.append(f)
    return out


def _at(i: int, label: Callable[[int], str] | None) -> str:
    return f"position {i}" + (f" ({label(i)})" if label else "")


def context_label(trees: Any, keys: Sequence[tuple[int, int]]) -> Callable[[int], str]:
    """What :func:`check_predictions` names for the i-th of the ``(tree index, node id)``
    pairs scored (``trees[tree index]`` a :class:`focus.tree.Tree`): the node, its kind
    and depth, and its tree as the batch names it (``task#index``). Formatted only for an
    error."""

    def label(i: int) -> str:
        ti, nid = keys[i]
        node = trees[ti].nodes[nid]
        return f"{node.kind} node {nid} at depth {node.depth} of tree {trees[ti].task_id}#{ti}"

    return label


def check_predictions(
    preds: Sequence[Any], n: int, where: str, label: Callable[[int], str] | None = None
) -> list[Prediction]:
    """What a critic's :meth:`Critic.predict_with_std` returned, checked: ``n``
    predictions with finite values and, where given, finite non-negative stds. A
    :class:`CriticError` names the first that is not (a NaN would otherwise travel into
    every advantage and target of its tree), by its position in the call and, given
    ``label`` (position -> text, :func:`context_label`), by the state it scored: a
    position in a call of hundreds of contexts does not tell a user which state their
    critic fails on."""
    _check_listed(preds, where)
    if len(preds) != n:
        raise CriticError(f"{where} returned {len(preds)} predictions for {n} contexts")
    # a number is a value without a std: numpy's and torch's have a ``std`` method, which
    # was read as the std
    bare = [isinstance(p, Number) or callable(getattr(p, "std", None)) for p in preds]
    values = _check_values(
        [p if b else getattr(p, "value", p) for p, b in zip(preds, bare, strict=True)], n, where, label
    )
    out = []
    for i, (p, v) in enumerate(zip(preds, values, strict=True)):
        std = None if bare[i] else getattr(p, "std", None)
        if std is not None:
            one = (lambda _, i=i: label(i)) if label else None
            (std,) = _check_values([std], 1, f"{where} (std at position {i})", one)
            if std < 0:
                raise CriticError(f"{where} returned a negative std {std!r} at {_at(i, label)}")
        out.append(Prediction(v, std))
    return out


@dataclass(frozen=True)
class _Target:
    """One critic target for :func:`warm_start` (what a critic's ``fit`` reads)."""

    context_ids: tuple[int, ...]
    target: float
    weight: float


def warm_start(critic: Critic, trees: Sequence[Any], gamma: float = 1.0, truncation: str = "bootstrap") -> bool:
    """Fit ``critic`` on the critic targets of ``trees`` (each checkpoint's mean return
    below it, :func:`focus.estimation.critic_targets`) if it is trainable (a ``fit``
    method) and was never fitted (``fitted`` false); returns whether it did.

    The collector calls it on the evidence, before the first prediction
    (``Collector.run_evidence``, unless ``warm_start_critic=False``). Why
    (docs/findings/learning.md, "Why a FOCUS batch taught less where the decisive
    step is early"): an unfitted critic predicts its
    default (0) everywhere, and at a checkpoint with one child the TD advantage is
    ``λ·(r + V(c) − v̂)``, so with ``v̂ = 0`` an action that led to reward 0 gets 0, never
    a negative advantage, and every other token a positive bias: the first update
    barely teaches a decision no continuation repeats. The fit is deterministic
    (:class:`LocalCritic`: seeded, one thread), so a resumed collection, whose evidence
    its journal replays, fits the same critic. Truncated leaves without a value are left
    out; the collector values them first (:func:`focus.placement.bootstrapped`).
    """
    from focus.estimation import critic_targets

    fit = getattr(critic, "fit", None)
    if getattr(critic, "fitted", True) or not callable(fit):
        return False
    rows = [
        _Target(tree.nodes[nid].context_ids, t.target, t.weight)
        for tree in trees
        for nid, t in sorted(critic_targets(tree, gamma=gamma, truncation=truncation).items())  # type: ignore[arg-type]
        if t.weight > 0 and tree.nodes[nid].context_ids
    ]
    if not rows:
        return False
    fit(rows)
    return True


class ConstantCritic(Critic):
    """The same prediction everywhere (e.g. 0.5 for success rewards): no model needed."""

    row_wise: ClassVar[bool] = True

    def __init__(self, value: float = 0.0, std: float | None = None) -> None:
        # a value read as text ("0.5" from a file or a flag) failed in abs(), naming neither
        for name, got in (("value", value), ("std", std)):
            if not isinstance(got, Real) and (name == "value" or got is not None):
                or_none = " or None" if name == "std" else ""
                raise TypeError(
                    f"ConstantCritic {name} must be a number{or_none}, got {short_value(got)} ({type(got).__name__})"
                )
        if not abs(value) <= VALUE_LIMIT:  # refused at the first scoring otherwise, after the evidence
            raise ValueError(f"ConstantCritic value must be finite and within ±{VALUE_LIMIT:g}, got {value!r}")
        if std is not None and not (math.isfinite(std) and std >= 0):
            raise ValueError(f"ConstantCritic std must be a finite number >= 0 or None, got {std!r}")
        self.value, self.std = float(value), None if std is None else float(std)

    async def predict(self, contexts: Sequence[Sequence[int]]) -> list[float]:
        return [self.value] * len(contexts)

    async def predict_with_std(self, contexts: Sequence[Sequence[int]]) -> list[Prediction]:
        return [Prediction(self.value, self.std)] * len(contexts)


class HttpCritic(Critic):
    """A scoring service: ``POST url`` with a JSON list of contexts (lists of token ids).

    The answer is a JSON list of numbers, or ``{"values": [...], "stds": [...]}``.
    Requests are split into batches of ``batch_size`` and sent through the model
    clients' HTTP stack under the same retry policy (``config``, an
    :class:`~focus.backends.HttpConfig`: timeouts, retries with backoff, deadline,
    hedging; a score does not depend on which copy of a hedged request answers). After
    the last attempt a :class:`CriticError` names the URL and the cause; an answer of
    the wrong shape counts as malformed and is retried like one; the same malformed
    answer to different requests, probes beside one included (:func:`probe_contexts`),
    is a service of another shape, and the call stops at once with a :class:`CriticError`
    saying so (:mod:`focus.backends.unreadable`). A NaN, infinite, huge or null value is
    the service's answer, not retried: :meth:`predict` refuses it, :meth:`predict_with_std`
    passes it to the caller's :func:`check_predictions` (the collector's names the state): a
    null is sent by choice (JavaScript's JSON writes NaN so); a null std is none. Too many
    or too few values are refused at once naming the counts: a service's batching bug, which
    a retry of the same request repeats (both took 11 attempts, 9-14 s, before).
    ``transport``: an httpx transport to send through instead of the default (tests, proxies).
    """

    def __init__(
        self,
        url: str,
        *,
        batch_size: int = 64,
        config: HttpConfig | None = None,
        transport: Any = None,
    ) -> None:
        from focus.backends.http import HttpClient  # the HTTP stack loads with the first HTTP critic

        # both failed deeper down, on an attribute the wrong type lacks, naming no argument
        if not isinstance(url, str):
            raise TypeError(
                "HttpCritic url must be a URL string such as 'http://127.0.0.1:8100/score', "
                f"got {short_value(url)} ({type(url).__name__})"
            )
        http_config(config, "HttpCritic config")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"HttpCritic url must start with http:// or https://, got {url!r}")
        if batch_size < 1:
            raise ValueError("HttpCritic.batch_size must be at least 1")
        self.url, self.batch_size = url, batch_size
        scheme, _, rest = url.partition("://")
        host, slash, path = rest.partition("/")
        self.http = HttpClient(
            f"{scheme}://{host}", config, transport=transport, error=CriticError, probe=probe_contexts, service="critic"
        )
        self._path = slash + path

    def stats(self) -> dict[str, Any]:
        """The HTTP client's totals in this process (``HttpClient.stats``)."""
        return self.http.stats()

    async def _post(self, batch: list[list[int]]) -> list[Prediction]:
        try:
            values, stds = await self.http.request("POST", self._path, batch, self._parse, size=len(batch))
        except CriticError as e:
            raise self._refused(e) from e
        for what, got in (("values", values), ("stds", stds)):  # counted here, not in the parse: not retried
            if len(got) != len(batch):
                raise CriticError(f"critic at {self.url} returned {len(got)} {what} for {len(batch)} contexts")
        return [Prediction(v, s) for v, s in zip(values, stds, strict=True)]

    def _refused(self, e: CriticError) -> CriticError:
        """``e``, or a :class:`CriticRefused` naming the settings when its status refuses any request."""
        from focus.refusals import REFUSED_STATUSES, rejected_status

        status = rejected_status(str(e))
        if status not in REFUSED_STATUSES:
            return e
        return CriticRefused(
            f"the critic service at {self.url} refused the request (status {status}): check critic.url and "
            f"critic.api_key_env (HttpCritic's url and HttpConfig.api_key in the library); last: {e}"
        )

    def _parse(self, body: Any) -> list[list[Any]]:
        if isinstance(body, dict) and "values" not in body:
            raise CriticError(f"critic at {self.url} answered an object without 'values': keys {sorted(body)}")
        values, stds = (body["values"], body.get("stds")) if isinstance(body, dict) else (body, None)
        if not isinstance(values, list):
            raise CriticError(f"critic at {self.url} answered {type(values).__name__}, expected a list of numbers")
        # finite=False, nulls kept: retried as malformed, a NaN or null took 11 attempts and named no state
        where, stds = f"critic at {self.url}", [None] * len(values) if stds is None else stds
        return [_check_values(v, len(v), w, finite=False) for v, w in ((values, where), (stds, f"{where} (stds)"))]

    async def predict_with_std(self, contexts: Sequence[Sequence[int]]) -> list[Prediction]:
        batches = [[int(t) for t in c] for c in contexts]
        parts = [batches[i : i + self.batch_size] for i in range(0, len(batches), self.batch_size)]
        results = await asyncio.gather(*(self._post(p) for p in parts))
        return [p for part in results for p in part]

    async def predict(self, contexts: Sequence[Sequence[int]]) -> list[float]:
        values = [p.value for p in await self.predict_with_std(contexts)]
        return _check_values(values, len(values), f"critic at {self.url}")

    async def aclose(self) -> None:
        await self.http.aclose()


def probe_contexts(body: list[list[int]], k: int = 1) -> list[list[int]]:
    """The ``k``-th request beside the scoring request ``body`` (from 1): as many contexts
    (its answer must hold a value for each), each the first tokens of one of ``body``'s
    and then token ``k`` (below 256: inside any vocabulary). The same malformed answer to
    other contexts tells a service of another shape from one batch's bad answer
    (:mod:`focus.backends.unreadable`); the probe's values are dropped."""
    from focus.backends.unreadable import PROBE_TOKENS

    return [[*c[: PROBE_TOKENS - 1], k] for c in body]


@contextmanager
def _torch_threads(n: int) -> Iterator[None]:
    """Run a tiny model on ``n`` intra-op threads, restoring the setting after: on a
    busy machine, spare threads of a small matmul only spin against the rollouts
    (measured 16x slower fits with 2 threads on a loaded 2-core machine)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class LocalCritic(Critic):
    """A small trainable critic on CPU: an MLP over hashed n-gram features of the context.

    Features are counts of the 1..``ngram``-grams among the last ``window`` token ids,
    hashed into ``buckets`` slots (log-scaled); the tail of a context is where the
    latest observations are. :meth:`fit` trains on critic rows (``context_ids``,
    ``target``, ``weight``: a prepared batch's ``critic`` list) with a weighted squared
    error. Cheap enough to refit between collections; torch is imported on first use.
    """

    def __init__(
        self,
        *,
        buckets: int = 4096,
        ngram: int = 3,
        window: int = 64,
        hidden: int = 64,
        seed: int = 0,
        default: float = 0.0,
    ) -> None:
        from focus.extras import require

        require("train", "LocalCritic")
        if buckets < 1 or ngram < 1 or window < 1 or hidden < 1:
            raise ValueError("LocalCritic sizes must be positive")
        self.config: dict[str, Any] = {
            "buckets": buckets,
            "ngram": ngram,
            "window": window,
            "hidden": hidden,
            "seed": seed,
            "default": default,
        }
        self._model: Any = None
        self.fitted = False

    def _features(self, contexts: Sequence[Sequence[int]]) -> tuple[Any, Any]:
        """The contexts' features over the buckets any of them uses: ``(x, used)``, ``x``
        one row per context and one column per bucket in ``used`` (ascending). The
        other buckets are zero in every row, so the first layer needs only these
        columns of its weight (a batch touches a few hundred of the 4,096)."""
        import torch

        b, n, w = self.config["buckets"], self.config["ngram"], self.config["window"]
        rows: list[int] = []
        cols: list[int] = []
        for row, ctx in enumerate(contexts):
            tail = tuple(int(t) for t in ctx[-w:])
            for k in range(1, n + 1):
                for i in range(len(tail) - k + 1):
                    rows.append(row)
                    cols.append(hash((k, tail[i : i + k])) % b)
        used, where = torch.unique(torch.tensor(cols, dtype=torch.long), return_inverse=True)
        x = torch.zeros(len(contexts), len(used))
        if rows:
            x.index_put_((torch.tensor(rows), where), torch.ones(len(rows)), accumulate=True)
        return torch.log1p(x), used

    def _forward(self, x: Any, used: Any, cols: Any | None = None) -> Any:
        """The net on features ``(x, used)``: the first layer over the used buckets'
        columns (``cols``: those columns of its weight, if given; else read from it)."""
        import torch

        net = self._net()
        first = net[0]
        weight = first.weight[:, used] if cols is None else cols
        return net[2](torch.tanh(torch.nn.functional.linear(x, weight, first.bias))).squeeze(-1)

    def _net(self) -> Any:
        import torch

        if self._model is None:
            torch.manual_seed(self.config["seed"])
            self._model = torch.nn.Sequential(
                torch.nn.Linear(self.config["buckets"], self.config["hidden"]),
                torch.nn.Tanh(),
                torch.nn.Linear(self.config["hidden"], 1),
            )
            with torch.no_grad():
                self._model[2].bias.fill_(self.config["default"])
        return self._model

    def fit(self, rows: Sequence[Any], *, epochs: int = 200, lr: float = 3e-3, batch_size: int = 1024) -> float:
        """Fit on rows with ``context_ids``, ``target`` and ``weight``; returns the final
        weighted mean squared error on the rows. Rows of weight 0 are skipped; a target or
        weight that is not finite is a ``ValueError`` naming the row, and so is a fit that
        ends non-finite (float32 squares overflow past about 2e19), which is undone first:
        a NaN critic would otherwise be saved and found only by the next collection.
        ``epochs``, ``lr`` and ``batch_size`` that cannot train (``epochs=0`` marked the
        critic fitted without a step) are a ``ValueError`` too."""
        if not (isinstance(epochs, int) and epochs >= 1 and batch_size >= 1 and math.isfinite(lr) and lr > 0):
            raise ValueError(
                f"LocalCritic.fit needs epochs >= 1, batch_size >= 1 and a finite lr > 0, got epochs={epochs!r}, "
                f"batch_size={batch_size!r}, lr={lr!r}"
            )
        for i, r in enumerate(rows):
            if not (math.isfinite(float(r.target)) and math.isfinite(float(r.weight))):
                raise ValueError(
                    f"LocalCritic.fit: row {i} has target {float(r.target)!r} and weight {float(r.weight)!r}: "
                    "both must be finite numbers"
                )
        rows = [r for r in rows if float(r.weight) > 0]
        if not rows:
            raise ValueError("LocalCritic.fit needs rows with positive weight (context_ids, target, weight)")
        # a fit that ends non-finite (float32 squares overflow past 1.8e19) leaves NaN
        # weights that a later collection only finds as NaN predictions: undone here
        kept = (copy.deepcopy(self._model), self.fitted)
        with _torch_threads(1):
            mse = self._fit(rows, epochs, lr, batch_size)
        if not math.isfinite(mse):
            self._model, self.fitted = kept
            targets = [float(r.target) for r in rows]
            raise ValueError(
                f"LocalCritic.fit diverged (weighted squared error {mse!r}) on targets from {min(targets):g} to "
                f"{max(targets):g}; the critic is as it was: it computes in float32, scale the rewards down"
            )
        return mse

    def _fit(self, rows: Sequence[Any], epochs: int, lr: float, batch_size: int) -> float:
        import torch

        x, used = self._features([r.context_ids for r in rows])
        y = torch.tensor([float(r.target) for r in rows])
        w = torch.tensor([float(r.weight) for r in rows])
        w = w / w.mean()
        net = self._net()
        first = net[0]
        # Only the used buckets' columns of the first layer are trained: the others get
        # zero gradients, and Adam (a new one per fit, its moments at zero) leaves such
        # a weight where it is, so this is the full update at a fraction of its work.
        cols = torch.nn.Parameter(first.weight.detach()[:, used].clone())
        opt = torch.optim.Adam([cols, first.bias, *net[2].parameters()], lr=lr)
        gen = torch.Generator().manual_seed(self.config["seed"])
        for _ in range(epochs):
            for idx in torch.randperm(len(rows), generator=gen).split(batch_size):
                loss = (w[idx] * (self._forward(x[idx], used, cols) - y[idx]) ** 2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
        with torch.no_grad():
            first.weight[:, used] = cols
        self.fitted = True
        with torch.no_grad():
            return float((w * (self._forward(x, used) - y) ** 2).mean() / w.mean())

    async def predict(self, contexts: Sequence[Sequence[int]]) -> list[float]:
        import torch

        if not contexts:
            return []
        if not self.fitted:
            return [float(self.config["default"])] * len(contexts)
        with _torch_threads(1), torch.no_grad():
            # through the whole first layer, as before the fit learnt to skip unused
            # columns: a critic's predictions (and so its identity digest, which a
            # resume checks) stay those of its weights, bit for bit
            x, used = self._features(contexts)
            dense = torch.zeros(len(contexts), self.config["buckets"])
            dense[:, used] = x
            return [float(v) for v in self._net()(dense).squeeze(-1)]

    def save(self, url: str) -> None:
        """Write config and weights to any fsspec URL."""
        import fsspec
        import torch

        with fsspec.open(url, "wb") as f:
            torch.save(
                {
                    "config": self.config,
                    "fitted": self.fitted,
                    "state": self._net().state_dict() if self.fitted else None,
                },
                f,
            )

    @classmethod
    def load(cls, url: str) -> LocalCritic:
        import fsspec
        import torch

        try:
            with fsspec.open(url, "rb") as f:
                blob = torch.load(f, weights_only=True)
        except FileNotFoundError:
            raise CriticError(f"no saved LocalCritic at {url}") from None
        if not isinstance(blob, dict) or "config" not in blob:
            raise CriticError(f"{url} is not a saved LocalCritic")
        critic = cls(**blob["config"])
        if blob["fitted"]:
            critic._net().load_state_dict(blob["state"])
            critic.fitted = True
        return critic

    def __getstate__(self) -> dict[str, Any]:
        state = {"config": self.config, "fitted": self.fitted, "weights": None}
        if self.fitted:
            state["weights"] = {k: v.clone() for k, v in self._net().state_dict().items()}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.config, self.fitted, self._model = state["config"], state["fitted"], None
        if state["weights"] is not None:
            self._net().load_state_dict(state["weights"])
