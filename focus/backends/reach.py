"""Whether a model service is there at all, asked once before a collection starts.

A client waits out a service that stops answering (:mod:`focus.backends.outage`): up to
``outage_wait_s`` (300 s by default) for a restart. A URL that nothing has answered in
this run is another matter: a typo, the wrong port or host, a server never started. It
got the same wait: ``focus collect --model-url http://127.0.0.1:<closed port>`` stopped
after 300 s. So the ``focus`` command asks each URL first (:func:`first_contact`): a
connection that cannot be made within ``model.http.first_contact_s`` (5 s by default;
refused, the host unknown, no route) is one line naming the URL, before anything starts. A server that accepts the
connection is there, whatever it answers (any status, a TLS handshake this check's trust
store refuses, or no answer yet: vLLM takes connections while it loads its weights), and from then on an
outage is waited for as before. A Dask scheduler address is asked the same way
(:func:`scheduler_contact`): Dask retried a refused port for its whole connect timeout.
"""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Callable, Sequence

#: Seconds :func:`first_contact` tries to connect before it gives up on a URL, unless
#: told otherwise: the default of ``model.http.first_contact_s`` (``critic.http`` too).
from focus.backends.retry import FIRST_CONTACT_S

#: Seconds between attempts, and the connect timeout of one.
RETRY_S = 0.5
CONNECT_S = 3.0


def _raised_from(error: BaseException, kind: type[BaseException]) -> bool:
    """Whether ``error``, or an error it was raised from, is a ``kind``."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, kind):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _unknown_host(error: BaseException) -> bool:
    """Whether ``error`` is a failed name lookup: the host does not exist, which no
    retry changes."""
    return _raised_from(error, socket.gaierror)


def _tls_refused(error: BaseException) -> bool:
    """Whether ``error`` is the TLS handshake's: a server answered on the port."""
    return _raised_from(error, ssl.SSLError)


def _connects(url: str) -> BaseException | None:
    """``None`` if a connection to ``url`` was made (whatever came back), else why not.

    A TLS handshake that fails is a connection made: whether the server's certificate is
    trusted is the model client's to say, with its own trust store (the system's), where
    this check's httpx reads certifi's; a server behind a private CA was refused here
    after 5 s as "no connection"."""
    import httpx

    try:
        httpx.get(url, timeout=httpx.Timeout(CONNECT_S), trust_env=False)  # as the clients: no proxy
    except (httpx.ConnectError, httpx.ConnectTimeout, httpx.UnsupportedProtocol) as e:
        if _tls_refused(e):
            return None
        return e
    except httpx.HTTPError:
        return None  # connected: no answer yet (a server still loading), a protocol error
    return None


def _tcp_connects(address: str) -> BaseException | None:
    """``None`` if a TCP connection to ``address`` (``tcp://host:port``, ``tls://...``
    or ``host:port``) was made, else why not."""
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_S):
            return None
    except (OSError, ValueError) as e:
        return e


def _first(
    targets: Sequence[str], connects: Callable[[str], BaseException | None], grace_s: float
) -> tuple[str, BaseException] | None:
    """``None`` as soon as one of ``targets`` connects within ``grace_s`` seconds, else
    the last target tried and why it did not (an unknown host is not tried again)."""
    deadline = time.monotonic() + grace_s
    errors: dict[str, BaseException] = {}
    while True:
        for target in targets:
            error = connects(target)
            if error is None:
                return None
            errors[target] = error
        if all(_unknown_host(e) for e in errors.values()) or time.monotonic() + RETRY_S > deadline:
            return next(iter(errors.items()))
        time.sleep(RETRY_S)


def _why(error: BaseException, grace_s: float) -> str:
    cause = f"{type(error).__name__}: {error}".rstrip(": ")
    return f"{'its host name is not known' if _unknown_host(error) else f'no connection in {grace_s:g} s'} ({cause})"


def first_contact(
    urls: Sequence[str], grace_s: float = FIRST_CONTACT_S, field: str = "model.url", service: str = "model"
) -> str | None:
    """One line saying that no connection could be made to any of ``urls`` within
    ``grace_s`` seconds; ``None`` as soon as one connects (a fleet goes on with the
    replicas that are there, as it does mid-run). ``field``: the setting the line tells
    the reader to check, named as they set it (the ``focus`` command's flag, a flow run's
    parameter): a deployment's run said ``--model-url``, a flag its user never saw.
    ``service``: ``model`` or ``critic`` (an HTTP critic's URL is asked the same way), the
    section whose ``http.outage_wait_s`` the line names."""
    failed = _first(urls, _connects, grace_s)
    if failed is None:
        return None
    url, error = failed
    where = (
        f"the {service} service at {url}"
        if len(urls) == 1
        else f"any of the {len(urls)} {service} services ({url}, ...)"
    )
    return (
        f"cannot reach {where}: {_why(error, grace_s)}; nothing has answered there in this run: check {field}, "
        "its host and port, and that the server runs; a server still starting is waited for only that long (run "
        f"again once it answers, or wait longer: {service}.http.first_contact_s), one that stops answering after "
        f"it answered is ({service}.http.outage_wait_s)"
    )


def scheduler_contact(
    address: str,
    grace_s: float = FIRST_CONTACT_S,
    field: str = "execution.address",
    unset: str = "leave it out to run rollouts in-process",
) -> str | None:
    """One line saying that no TCP connection could be made to the Dask scheduler at
    ``address`` within ``grace_s`` seconds (``None`` if one was, or the address is not
    TCP: ``inproc://``, ``ucx://``). Dask retries a refused connection for its whole
    connect timeout (30 s by default), after the model server has started: a wrong port
    cost 31 s and ended as ``RuntimeError: cannot reach the Dask scheduler ...``. ``field``
    and ``unset`` name the setting and how to run without it as the reader set it
    (:func:`first_contact`)."""
    if "://" in address and not address.startswith(("tcp://", "tls://")):
        return None
    failed = _first([address], _tcp_connects, grace_s)
    if failed is None:
        return None
    return (
        f"cannot reach the Dask scheduler at {address!r}: {_why(failed[1], grace_s)}; check {field}: the address "
        f"the scheduler prints at its start (tcp://host:8786 by default), and that it runs; or {unset}"
    )


#: Statuses of a probe ``POST`` that say no generation endpoint is at the path, whatever
#: the request holds: 404 (no such route), 405 and 501 (no ``POST`` there: a plain web
#: server, ``python -m http.server``), a redirect (the clients follow none). A model
#: server answers a probe without a prompt 400 or 422; one that wants a key, 401 or 403
#: (its first call says which key).
NO_ENDPOINT_STATUSES = frozenset({301, 302, 303, 307, 308, 404, 405, 501})


def no_generation_endpoint(
    root: str,
    path: str,
    *,
    headers: dict[str, str] | None = None,
    field: str = "model.url",
    kind: str | None = "openai",
) -> str | None:
    """One line if the server at ``root`` answers HTTP but has no generation endpoint at
    ``path`` (the one the ``kind`` client posts to; ``kind=None``: a client of one kind,
    and the line names no ``model.kind``); ``None`` when it has one, or does not
    say (no answer in a few seconds, a 5xx of a server still starting, a refused key).

    :func:`first_contact` takes any answer for a server: a plain web server or another
    JSON API on the port passed it, and the first wave's every rollout was refused (each
    one a progress line) before the run stopped with "refused every request". The probe
    is a ``POST`` of ``{}``: a model server refuses it as a request without a prompt (400,
    422) and samples nothing."""
    import httpx

    url = f"{root.rstrip('/')}{path}"
    try:
        answer = httpx.post(url, json={}, headers=headers or {}, timeout=CONNECT_S, trust_env=False)
    except httpx.HTTPError:
        return None
    if answer.status_code not in NO_ENDPOINT_STATUSES:
        return None
    if answer.is_redirect:
        said = f"a redirect to {answer.headers.get('location', '(nowhere)')!r}, which the client does not follow"
    else:
        said = _page(answer.text) or "an empty body"
    head = (
        f"the server at {root} ({field.split()[0]}) answers HTTP but not as a model server: POST {path} was "
        f"answered with status {answer.status_code} ({said})"
    )
    if kind is None:  # a client of one kind (the examples': OpenAI-compatible)
        return f"{head}: check {field}, the root of an OpenAI-compatible model server (vLLM): its host and port"
    return (
        f"{head}; model.kind {kind!r} posts its requests there: check {field}, the model server's root (its host "
        "and port), and model.kind (openai: vLLM's /v1/completions, sglang: /generate, llamacpp: llama-server's "
        "/completion)"
    )


def _page(text: str, n: int = 160) -> str:
    """An answer's body as one short line: an HTML page's text without its tags."""
    import re

    words = " ".join(re.sub(r"<[^>]*>", " ", text).split())
    return words if len(words) <= n else words[:n] + "..."
