"""Model servers FOCUS cannot sample from token-exactly, told apart by how they answer.

FOCUS sends every prompt as token ids and records the ids the server sampled with their
log-probs; a server that takes text re-tokenises the prompt (a continuation's ids are not
what the model saw), and one that returns text re-tokenises the answer. Some servers say
so in their first refusal, always the same way, whatever the prompt: a refusal that is a
setting to change, not a request's own fault, so the collection stops at once with one
line that names the server and what to run instead (:func:`refused_token_ids`), where it
failed every rollout as "rejected with status 422" and finished with an empty batch.

* HuggingFace TGI: ``/v1/completions`` takes a string (or strings) as ``prompt`` (axum's
  422 ``... did not match any variant of untagged enum PromptDeserializer``) and answers
  ``logprobs: null``; ``/generate`` takes ``inputs`` text only (422 ``missing field
  `inputs```, what ``model.kind = sglang`` gets).
* Ollama: ``/v1/completions`` and ``/api/generate`` take ``prompt`` as a string (400
  ``json: cannot unmarshal array into Go struct field ... prompt of type string``) and
  give log-probs of token texts, no ids.
* An OpenAI-compatible proxy or hosted API whose request model wants a string prompt
  (pydantic's ``Input should be a valid string`` naming ``prompt``, OpenAI's ``... is not
  of type 'string'``).

:func:`endpoint_in_url` refuses a ``model.url`` that names an endpoint instead of the
server root (vLLM's chat endpoint given by mistake).
"""

from __future__ import annotations

import re

#: (pattern of a refusal's body, the server, what it lacks).
_TEXT_ONLY = (
    (
        re.compile(r"PromptDeserializer|missing field `inputs`"),
        "HuggingFace TGI",
        "takes text prompts only (its /v1/completions answers no log-probs, its /generate takes 'inputs' text)",
    ),
    (
        re.compile(r"cannot unmarshal array into Go struct field \w*Request\.prompt of type string"),
        "Ollama",
        "takes text prompts only and names sampled tokens by their text",
    ),
    (
        re.compile(
            r"prompt\W[^\n]{0,200}?(?:Input should be a valid string|is not of type 'string'|must be a string)"
            r"|(?:Input should be a valid string|must be a string)[^\n]{0,80}?prompt",
            re.IGNORECASE,
        ),
        "a server (or a proxy in front of one)",
        "wants the prompt as text",
    ),
)

#: What to run instead, in every line.
INSTEAD = (
    "FOCUS sends prompts as token ids and never re-tokenises text: serve the model with vLLM (model.kind = openai), "
    "SGLang (sglang) or llama.cpp's llama-server (llamacpp), and point model.url at that server itself"
)


def refused_token_ids(url: str, status: int, body: str) -> str | None:
    """The line for a refusal (``status``, ``body``) of a prompt of token ids by the
    server at ``url``, or None when the refusal is not one of the known kinds."""
    if status not in (400, 415, 422):
        return None
    for pattern, server, lacks in _TEXT_ONLY:
        if pattern.search(body):
            said = " ".join(body.split())[:160]
            return (
                f"the model server at {url} refused a prompt of token ids (status {status}: {said}): "
                f"it looks like {server}, which {lacks}; {INSTEAD}"
            )
    return None


#: Endpoint paths a ``model.url`` may end in by mistake: the clients add their own.
_ENDPOINTS = (
    "/v1/chat/completions",
    "/chat/completions",
    "/v1/completions",
    "/completions",
    "/completion",
    "/generate",
    "/api/generate",
    "/api/chat",
)


def endpoint_in_url(url: str | None) -> str | None:
    """Why ``url`` cannot be a model server's root (it ends in an endpoint path), or None.

    The clients add their endpoint to the root (``/v1/completions``, ``/generate``,
    ``/completion``): a URL that already names one made every request go to
    ``.../v1/chat/completions/v1/completions``, refused with 404 as a wrong path at the
    first wave. The chat endpoint would not do either: it takes messages, renders the
    chat template as text and tokenises it again."""
    if not url:
        return None
    path = url.split("://", 1)[-1].rstrip("/")
    root, sep, rest = path.partition("/")
    rest = f"/{rest}" if sep else ""
    for end in sorted(_ENDPOINTS, key=len, reverse=True):
        if rest == end or rest.endswith(end):
            base = url[: len(url.rstrip("/")) - len(end)]
            chat = "chat" in end
            why = (
                "the chat endpoint takes messages and tokenises the chat template's text again, "
                if chat
                else "the client adds its own endpoint, "
            )
            return (
                f"model.url {url!r} names the endpoint {end}, not the server root: {why}while FOCUS posts token ids "
                f"to the root's completions endpoint; set model.url = {base!r}"
            )
    return None
