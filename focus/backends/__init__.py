"""Model clients: policy backends for model services, and the embedded local model.

* :class:`OpenAICompatPolicy` - OpenAI-compatible ``/v1/completions`` as vLLM serves it.
* :class:`SGLangPolicy` - SGLang's native ``/generate``.
* :class:`TinkerPolicy` - a Tinker ``SamplingClient``.
* :class:`LocalModelServer` - the tiny torch model served on loopback.
* :class:`HttpConfig` - timeouts, retries and concurrency of the HTTP backends.

Names load on first use: importing this package imports neither torch nor tinker.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "HttpConfig": "focus.backends.http",
    "HttpClient": "focus.backends.http",
    "OpenAICompatPolicy": "focus.backends.openai_compat",
    "SGLangPolicy": "focus.backends.sglang",
    "TinkerPolicy": "focus.backends.tinker_backend",
    "LocalModelServer": "focus.backends.local",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'focus.backends' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
