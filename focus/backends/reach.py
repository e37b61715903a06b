"""Whether a model service is there at all, asked once before a collection starts.

A client waits out a service that stops answering (:mod:`focus.backends.outage`): up to
``outage_wait_s`` (300 s by default) for a restart. A URL that nothing has answered in
this run is another matter: a typo, the wrong port or host, a server never started. It
got the same wait: ``focus collect --model-url http://127.0.0.1:<closed port>`` stopped
after 300 s. So the ``focus`` command asks each URL first (:func:`first_contact`): a
connection that cannot be made within a few seconds (refused, the host unknown, no
route, a certificate refused) is one line naming the URL, before anything starts. A
server that accepts the connection is there, whatever it answers (any status, or no
answer yet: vLLM takes connections while it loads its weights), and from then on an
outage is waited for as before.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Sequence

#: Seconds :func:`first_contact` tries to connect before it gives up on a URL: a server
#: whose port opens that late is still starting (SGLang listens once its weights are
#: loaded, minutes for a large model), which the command does not wait for.
FIRST_CONTACT_S = 5.0
#: Seconds between attempts, and the connect timeout of one.
RETRY_S = 0.5
CONNECT_S = 3.0


def _unknown_host(error: BaseException) -> bool:
    """Whether ``error`` (or what it was raised from) is a failed name lookup: the host
    does not exist, which no retry changes."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, socket.gaierror):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _connects(url: str) -> BaseException | None:
    """``None`` if a connection to ``url`` was made (whatever came back), else why not."""
    import httpx

    try:
        httpx.get(url, timeout=httpx.Timeout(CONNECT_S), trust_env=False)  # as the clients: no proxy
    except (httpx.ConnectError, httpx.ConnectTimeout, httpx.UnsupportedProtocol) as e:
        return e
    except httpx.HTTPError:
        return None  # connected: no answer yet (a server still loading), a protocol error
    return None


def first_contact(urls: Sequence[str], grace_s: float = FIRST_CONTACT_S) -> str | None:
    """One line saying that no connection could be made to any of ``urls`` within
    ``grace_s`` seconds; ``None`` as soon as one connects (a fleet goes on with the
    replicas that are there, as it does mid-run)."""
    deadline = time.monotonic() + grace_s
    errors: dict[str, BaseException] = {}
    while True:
        for url in urls:
            error = _connects(url)
            if error is None:
                return None
            errors[url] = error
        if all(_unknown_host(e) for e in errors.values()) or time.monotonic() + RETRY_S > deadline:
            break
        time.sleep(RETRY_S)
    url, error = next(iter(errors.items()))
    cause = f"{type(error).__name__}: {error}".rstrip(": ")
    where = f"the model service at {url}" if len(urls) == 1 else f"any of the {len(urls)} model services ({url}, ...)"
    tried = "its host name is not known" if _unknown_host(error) else f"no connection in {grace_s:g} s"
    return (
        f"cannot reach {where}: {tried} ({cause}); nothing has answered there in this run: check model.url "
        "(--model-url), its host and port, and that the server runs; a server still starting is not waited for (run "
        "again once it answers), one that stops answering after it answered is (model.http.outage_wait_s)"
    )
