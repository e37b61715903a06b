"""Tinker's sampling client as a FOCUS policy.

Wraps a ``tinker.SamplingClient``: the prompt goes as ``types.ModelInput.from_ints``
and the answer's ``SampledSequence`` carries the sampled ``tokens``, their
``logprobs`` and a ``stop_reason`` (``"stop"`` or ``"length"``). Tinker handles its
own retries; failures surface as PolicyError. ``tinker`` is imported only when a
policy is built, so ``focus.backends`` stays importable without it.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from typing import Any

from focus.policy import Completion, Policy, PolicyError, SamplingParams


class TinkerPolicy(Policy):
    """``sampling_client.sample(...)`` (awaited), one sequence per call.

    ``stop_token_ids`` of the sampling params go as Tinker's ``stop`` ids; stop strings
    are sent when there are no stop ids (Tinker takes one kind per request).
    """

    def __init__(self, sampling_client: Any, *, policy_version: str = "tinker", vocab_size: int | None = None) -> None:
        self.client = sampling_client
        self.policy_version = policy_version
        self.vocab_size = vocab_size

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
        prompt = types.ModelInput.from_ints(list(prompt_ids))
        try:
            out = self.client.sample(prompt=prompt, num_samples=1, sampling_params=self.sampling_params(params))
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
