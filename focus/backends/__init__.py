"""Model clients: policy backends for model services, and the embedded local model.

* :class:`OpenAICompatPolicy` - OpenAI-compatible ``/v1/completions`` as vLLM serves it.
* :class:`SGLangPolicy` - SGLang's native ``/generate``.
* :class:`TinkerPolicy` - a Tinker ``SamplingClient``.
* :class:`LocalModelServer` - the tiny torch model served on loopback.
* :class:`HttpConfig` - timeouts, retries and concurrency of the HTTP backends.

Names load on first use: importing this package imports neither torch nor tinker.
"""

from __future__ import annotations

from focus._lazy import lazy_exports

_EXPORTS = {
    "HttpConfig": "focus.backends.http",
    "HttpClient": "focus.backends.http",
    "OpenAICompatPolicy": "focus.backends.openai_compat",
    "SGLangPolicy": "focus.backends.sglang",
    "TinkerPolicy": "focus.backends.tinker_backend",
    "LocalModelServer": "focus.backends.local",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
