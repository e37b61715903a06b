"""Tinker: its sampling client as a FOCUS policy, and a trainer step on its training API.

:class:`TinkerPolicy` wraps a ``tinker.SamplingClient``: the prompt goes as
``types.ModelInput.from_ints`` and the answer's ``SampledSequence`` carries the sampled
``tokens``, their ``logprobs`` and a ``stop_reason`` (``"stop"`` or ``"length"``).
Given a base model or a ``tinker://`` sampler path instead of a client, it creates the
client on first use in the process that samples (so the policy pickles to workers).

:class:`TinkerTrainer` is one training step of the train loop: a batch's sequences as
``tinker.Datum`` (:func:`focus.exporters.to_tinker_datums`), one ``forward_backward``
with a built-in RL loss and one ``optim_step``, then ``save_state`` (to resume) and
``save_weights_for_sampler``, whose ``tinker://`` path the next collection samples
from through a fresh sampling client. Each step starts its training client from the
previous step's saved state, so the loop holds no Tinker session between steps and a
rerun continues from the last recorded one. :func:`build_requests` builds every
request of a step with the SDK's own types, and :func:`check_requests` serialises and
checks them the way the SDK would send them: that is the dry run, which needs no
``TINKER_API_KEY``. ``tinker`` is imported only when used, so ``focus.backends`` stays
importable without it.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from focus.policy import Completion, Policy, PolicyError, SamplingParams


class TinkerPolicy(Policy):
    """``sampling_client.sample(...)`` (awaited), one sequence per call.

    Pass a ``sampling_client``, or ``base_model`` / ``model_path`` (a ``tinker://``
    sampler path) to have one created on first use with ``tinker.ServiceClient()``
    (which reads ``TINKER_API_KEY``). ``stop_token_ids`` of the sampling params go as
    Tinker's ``stop`` ids; stop strings are sent when there are no stop ids (Tinker
    takes one kind per request). ``policy_version`` defaults to the sampler path or
    the base model: what produced the samples.
    """

    def __init__(
        self,
        sampling_client: Any = None,
        *,
        base_model: str | None = None,
        model_path: str | None = None,
        policy_version: str | None = None,
        vocab_size: int | None = None,
    ) -> None:
        if sampling_client is None and not (base_model or model_path):
            raise ValueError("TinkerPolicy needs a sampling_client, a base_model or a model_path")
        self.client = sampling_client
        self._made_here = sampling_client is None
        self.base_model = base_model
        self.model_path = model_path
        self.policy_version = policy_version or model_path or base_model or "tinker"
        self.vocab_size = vocab_size
        self._lock: asyncio.Lock | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if self._made_here:  # a client we created is re-created where the policy lands
            state["client"] = None
        state["_lock"] = None
        return state

    def _create_client(self) -> Any:
        import tinker

        try:
            return (
                tinker.ServiceClient()
                .create_sampling_client(model_path=self.model_path, base_model=self.base_model)
                .result()
            )
        except Exception as e:  # noqa: BLE001 - any SDK failure, with its cause
            key = "" if os.environ.get("TINKER_API_KEY") else " (TINKER_API_KEY is not set)"
            raise PolicyError(
                f"tinker: cannot create a sampling client for {self.model_path or self.base_model!r}{key}: "
                f"{type(e).__name__}: {e}"
            ) from e

    async def sampling_client(self) -> Any:
        if self.client is None:
            self._lock = self._lock or asyncio.Lock()
            async with self._lock:
                if self.client is None:
                    self.client = await asyncio.to_thread(self._create_client)
        return self.client

    def sampling_params(self, params: SamplingParams) -> Any:
        from tinker import types

        stop: list[int] | list[str] | None = None
        if params.stop_token_ids:
            stop = list(params.stop_token_ids)
        elif params.stop:
            stop = list(params.stop)
        return types.SamplingParams(
            max_tokens=params.max_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            seed=params.seed,
            stop=stop,
        )

    async def sample(self, prompt_ids: Sequence[int], params: SamplingParams) -> Completion:
        from tinker import types

        self.check_prompt(prompt_ids)
        client = await self.sampling_client()
        prompt = types.ModelInput.from_ints(list(prompt_ids))
        try:
            out = client.sample(prompt=prompt, num_samples=1, sampling_params=self.sampling_params(params))
            if inspect.isawaitable(out):
                out = await out
            elif hasattr(out, "result"):  # a concurrent future from the sync API
                out = out.result()
        except PolicyError:
            raise
        except Exception as e:  # noqa: BLE001 - any SDK failure ends this call, with its cause
            raise PolicyError(f"tinker sample failed: {type(e).__name__}: {e}") from e
        return parse_sample_response(out)


def parse_sample_response(resp: Any) -> Completion:
    seqs = getattr(resp, "sequences", None)
    if not seqs:
        raise PolicyError("tinker returned no sequences")
    seq = seqs[0]
    tokens = [int(t) for t in seq.tokens]
    logprobs = seq.logprobs
    if logprobs is None:
        raise PolicyError("tinker returned no log-probs for the sampled tokens")
    if len(logprobs) != len(tokens):
        raise PolicyError(f"tinker returned {len(tokens)} tokens but {len(logprobs)} log-probs")
    if not all(math.isfinite(x) for x in logprobs):
        raise PolicyError("tinker returned a non-finite log-prob")
    finish = {"stop": "stop", "length": "length"}.get(str(seq.stop_reason))
    if finish is None:
        raise PolicyError(f"tinker returned an unknown stop_reason {seq.stop_reason!r}")
    cached = getattr(resp, "prompt_cache_hit_tokens", None)
    return Completion(tuple(tokens), tuple(float(x) for x in logprobs), finish, cached)


# --- training -------------------------------------------------------------------------------


class TinkerUpdateConfig(BaseModel):
    """One Tinker training step per loop iteration (the pipeline's ``train.tinker``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: Model to fine-tune (LoRA); empty: the config's ``model.model``.
    base_model: str | None = None
    #: LoRA rank of a new training run.
    lora_rank: int = Field(32, ge=1)
    #: Built-in RL loss: ``importance_sampling`` (REINFORCE with importance weights), ``ppo``,
    #: ``cispo`` or ``gspo`` (sequence-level ratio over the trained tokens); the datums carry
    #: exactly that loss's inputs (``focus.exporters.TINKER_LOSS_INPUTS``).
    loss_fn: Literal["importance_sampling", "ppo", "cispo", "gspo"] = "importance_sampling"
    #: Adam learning rate of ``optim_step``.
    learning_rate: float = Field(1e-5, gt=0.0)
    #: Seed of the LoRA initialisation (reproducible runs).
    seed: int | None = 0
    #: Lifetime of saved checkpoints in seconds (at least an hour); empty: kept.
    ttl_seconds: int | None = Field(None, ge=3600)
    #: Build and check every request, send none (also what happens without TINKER_API_KEY).
    dry_run: bool = False


@dataclass(frozen=True)
class TinkerRequests:
    """Every request one training step sends, as the SDK's own types."""

    start: Any  # CreateModelRequest (first step) or LoadWeightsRequest (from the last state)
    forward_backward: Any  # ForwardBackwardRequest
    optim_step: Any  # OptimStepRequest
    save_state: Any  # SaveWeightsRequest
    save_for_sampler: Any  # SaveWeightsForSamplerRequest


def adam_params(cfg: TinkerUpdateConfig) -> Any:
    import tinker

    return tinker.AdamParams(learning_rate=cfg.learning_rate)


def build_requests(
    datums: Sequence[Any],
    cfg: TinkerUpdateConfig,
    *,
    base_model: str,
    name: str,
    state_path: str | None = None,
    model_id: str = "dry-run",
    session_id: str = "dry-run",
) -> TinkerRequests:
    """The requests of one step (pydantic models validate their fields as they are built).

    ``model_id`` and ``session_id`` are placeholders: the service assigns them when the
    training client is created; everything else is what the step sends.
    """
    from tinker import types

    if state_path:
        start: Any = types.LoadWeightsRequest(
            session_id=session_id, model_seq_id=0, base_model=base_model, path=state_path, optimizer=True
        )
    else:
        start = types.CreateModelRequest(
            session_id=session_id,
            model_seq_id=0,
            base_model=base_model,
            lora_config=types.LoraConfig(rank=cfg.lora_rank, seed=cfg.seed),
        )
    fb = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=list(datums), loss_fn=cfg.loss_fn),
        model_id=model_id,
        seq_id=1,
    )
    return TinkerRequests(
        start=start,
        forward_backward=fb,
        optim_step=types.OptimStepRequest(adam_params=adam_params(cfg), model_id=model_id, seq_id=2),
        save_state=types.SaveWeightsRequest(model_id=model_id, path=name, ttl_seconds=cfg.ttl_seconds, seq_id=3),
        save_for_sampler=types.SaveWeightsForSamplerRequest(
            model_id=model_id, path=name, ttl_seconds=cfg.ttl_seconds, seq_id=4
        ),
    )


def check_requests(reqs: TinkerRequests) -> dict[str, Any]:
    """Serialise every request as the SDK does (protobuf for ``forward_backward``, JSON
    for the rest) and check the data: each datum's loss inputs are exactly the loss's,
    one per input token, targets are the inputs shifted by one. Returns what would be
    sent (counts, sizes); raises ``ValueError`` naming the first bad datum."""
    from tinker._compat import model_dump
    from tinker.proto.request_conv import forward_backward_request_to_proto

    from focus.exporters import tinker_loss_inputs

    loss_fn = reqs.forward_backward.forward_backward_input.loss_fn
    expected = tuple(sorted(tinker_loss_inputs(loss_fn)))
    data = reqs.forward_backward.forward_backward_input.data
    if not data:
        raise ValueError("the batch has no trainable sequences: nothing to send")
    lengths = []
    trained = 0
    for i, d in enumerate(data):
        n = d.model_input.length
        keys = tuple(sorted(d.loss_fn_inputs))
        if keys != expected:
            raise ValueError(f"datum {i}: loss inputs {keys}, Tinker's {loss_fn!r} loss takes exactly {expected}")
        for key, t in d.loss_fn_inputs.items():
            if list(t.shape) != [n]:
                raise ValueError(f"datum {i}: {key} has shape {t.shape}, model_input has {n} tokens")
        ids = d.model_input.to_ints()
        targets = d.loss_fn_inputs["target_tokens"].data
        if list(ids[1:]) != [int(t) for t in targets[:-1]]:
            raise ValueError(f"datum {i}: target_tokens are not model_input shifted by one token")
        if not all(math.isfinite(x) for x in d.loss_fn_inputs["logprobs"].data):
            raise ValueError(f"datum {i}: a behaviour log-prob is not finite")
        trained += sum(1 for a in d.loss_fn_inputs["advantages"].data if a != 0.0)
        lengths.append(n)
    body = forward_backward_request_to_proto(reqs.forward_backward).SerializeToString()
    json_bodies = {
        name: model_dump(getattr(reqs, name), exclude_unset=False, exclude_none=True, mode="json")
        for name in ("start", "optim_step", "save_state", "save_for_sampler")
    }
    return {
        "datums": len(data),
        "loss_fn": loss_fn,
        "loss_fn_inputs": list(expected),
        "tokens": sum(lengths),
        "tokens_with_advantage": trained,
        "max_len": max(lengths),
        "forward_backward_bytes": len(body),
        "requests": {"forward_backward": "ForwardBackwardRequest"}
        | {k: type(getattr(reqs, k)).__name__ for k in json_bodies},
        "optim_step": json_bodies["optim_step"],
    }


@dataclass(frozen=True)
class TinkerStep:
    """What one step produced: the sampler path the next collection samples from, the
    state path the next step starts from, and the service's metrics."""

    sampler_path: str
    state_path: str
    metrics: dict[str, float]


class TinkerTrainer:
    """One LoRA training step per call on the Tinker service (needs ``TINKER_API_KEY``)."""

    def __init__(self, cfg: TinkerUpdateConfig, base_model: str, service: Any = None) -> None:
        self.cfg = cfg
        self.base_model = base_model
        self._service = service

    def service(self) -> Any:
        if self._service is None:
            import tinker

            self._service = tinker.ServiceClient()
        return self._service

    def step(self, datums: Sequence[Any], name: str, state_path: str | None = None) -> TinkerStep:
        """``forward_backward`` + ``optim_step`` from ``state_path`` (or a new LoRA run),
        then ``save_state`` and ``save_weights_for_sampler`` under ``name``."""
        cfg = self.cfg
        svc = self.service()
        if state_path:
            client = svc.create_training_client_from_state_with_optimizer(state_path).result()
        else:
            client = svc.create_lora_training_client(self.base_model, rank=cfg.lora_rank, seed=cfg.seed).result()
        fb = client.forward_backward(list(datums), cfg.loss_fn)
        opt = client.optim_step(adam_params(cfg))
        out = fb.result()
        opt.result()
        state = client.save_state(name, ttl_seconds=cfg.ttl_seconds).result().path
        sampler = client.save_weights_for_sampler(name, ttl_seconds=cfg.ttl_seconds).result().path
        return TinkerStep(str(sampler), str(state), {k: float(v) for k, v in dict(out.metrics).items()})
