"""Model clients: policy backends for model services, and the embedded local model.

* :class:`OpenAICompatPolicy` - OpenAI-compatible ``/v1/completions`` as vLLM serves it.
* :class:`SGLangPolicy` - SGLang's native ``/generate``.
* :class:`LlamaCppPolicy` - llama.cpp's ``llama-server`` native ``/completion``.
* :class:`TinkerPolicy` - a Tinker ``SamplingClient``.
* :class:`FleetPolicy` - several replicas of one model, calls routed by the search tree.
* :class:`LocalModelServer` - the embedded tiny model served on loopback (numpy, no torch).
* :class:`RetryPolicy` - timeouts, retries, deadline and hedging of every HTTP client;
  :class:`HttpConfig` adds concurrency and headers.

Names load on first use: importing this package imports neither torch nor tinker.
"""

from __future__ import annotations

from focus._lazy import lazy_exports

_EXPORTS = {
    "HttpConfig": "focus.backends.retry",
    "RetryPolicy": "focus.backends.retry",
    "HttpClient": "focus.backends.http",
    "OpenAICompatPolicy": "focus.backends.openai_compat",
    "SGLangPolicy": "focus.backends.sglang",
    "LlamaCppPolicy": "focus.backends.llamacpp",
    "TinkerPolicy": "focus.backends.tinker_backend",
    "FleetPolicy": "focus.backends.fleet",
    "LocalModelServer": "focus.backends.local",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
