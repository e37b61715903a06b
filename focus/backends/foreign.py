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
server root (vLLM's chat endpoint given by mistake); :func:`url_problem` one no request
could reach (no host, a port that is no number, two URLs in one) or that carries
credentials; :func:`listed_twice` a ``model.urls`` naming one server twice.
"""

from __future__ import annotations

import json
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


def endpoint_in_url(url: str | None, name: str = "model.url") -> str | None:
    """Why ``url`` (the setting ``name``) cannot be a model server's root (it ends in an
    endpoint path), or None.

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
                f"{name} {url!r} names the endpoint {end}, not the server root: {why}while FOCUS posts token ids "
                f"to the root's completions endpoint; "
                + (f"list {base!r} in {name} instead" if name.endswith("urls") else f"set {name} = {base!r}")
            )
    return None


def url_problem(url: object, name: str = "model.url") -> str | None:
    """Why ``url`` (the setting ``name``) cannot be a model server's root, or None: what
    the client would otherwise meet only at its first request, as a connection error
    retried into an outage (``http://gpu0:80OO``, ``http://``, two URLs in one string) or
    not at all. Credentials in it (``http://user:key@host``) are refused: the URL is
    written in the collection's configuration record, in log lines and in the failure
    causes a batch keeps, where an API key never is (``HttpConfig.api_key``)."""
    from urllib.parse import urlsplit

    if isinstance(url, (list, tuple)):
        return (
            f"{name} is one server's URL, not {len(url)}: for replicas of one model, one policy each in a "
            "FleetPolicy (focus.backends.fleet.one_or_fleet(urls, make), model.urls in a configuration)"
        )
    if not isinstance(url, str):
        return f"{name} must be a URL (a string), not {type(url).__name__}"
    if not url.startswith(("http://", "https://")):
        return f"{name} {url!r} must start with http:// or https://"
    if any(c.isspace() or c == "," for c in url):
        return f"{name} {url!r} holds a space or a comma: one server's URL per entry (model.urls lists several)"
    parts = urlsplit(url)
    if parts.username is not None or parts.password is not None:
        shown = f"{parts.scheme}://***@{parts.netloc.rpartition('@')[2]}{parts.path}"
        return (
            f"{name} {shown!r} carries credentials, which every log line and failure cause naming the server "
            "would show, and a collection's configuration record would keep: remove them from the URL and give the key "
            "as model.api_key_env (sent as Authorization: Bearer; HttpConfig.api_key or headers in the library)"
        )
    if not parts.hostname:
        return f"{name} {url!r} names no host"
    try:
        port = parts.port
    except ValueError:  # not a number, or past 65535
        port = -1
    if port is not None and not 0 < port < 65536:
        return f"{name} {url!r} has a port that is not a number from 1 to 65535"
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        return f"{name} {url!r} has a query or fragment: give the server root (the client adds its endpoint's path)"
    return None


def server_key(url: str) -> tuple[str, str, int | None, str]:
    """What tells two URLs of one server apart from two servers': scheme, host (lower
    case), port (the scheme's default when none is written) and path, without its
    trailing slashes. ``http://gpu0:80/`` and ``http://GPU0`` are one server."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    default = {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme, (parts.hostname or "").lower(), port or default, parts.path.rstrip("/")


def listed_twice(urls: list[str], *, strip_v1: bool) -> str | None:
    """Why ``model.urls`` cannot be a fleet's replicas: two entries name one server
    (:func:`server_key`; ``strip_v1``: ``/v1`` names the root too, as for the openai
    client), or None. The fleet took them for two replicas, so that server got twice its
    share of the calls and was counted, and failed over, as two."""
    seen: dict[tuple[str, str, int | None, str], str] = {}
    for u in urls:
        key = server_key(u)
        if strip_v1 and key[3].endswith("/v1"):
            key = (*key[:3], key[3][: -len("/v1")])
        if key in seen:
            same = f"{u!r} twice" if seen[key] == u else f"{seen[key]!r} and {u!r}, which name one server"
            return f"model.urls lists {same}: list each replica once"
        seen[key] = u
    return None


def urls_as_one_string(value: str) -> str:
    """The line for ``model.urls`` given one string (``--set model.urls=http://a,http://b``),
    which pydantic refused as ``Input should be a valid list``: how to write the list."""
    listed = json.dumps([u.strip() for u in value.split(",") if u.strip()] or ["http://gpu0:8000"])
    return (
        f"takes a list of URLs, not the string {value!r}: write model.urls = {listed} "
        f"(with --set, as JSON: --set 'model.urls={listed}')"
    )
