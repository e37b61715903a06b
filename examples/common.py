"""Helpers the example runs share: which model server to talk to, a solve rate, a
progress line for long runs, and the result each run prints (and records)."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn, TextIO

from focus.backends import OpenAICompatPolicy
from focus.format import ByteCodec, ChatCodec
from focus.policy import Completion, SamplingParams
from focus.tree import Tree


def command(main: Callable[[], object]) -> None:
    """``main()`` as a command line runs it: an error is one line on standard error naming
    its cause (``flows.errors.one_line``, as the ``focus`` command words it), exit 2 for a
    setting to change and 1 otherwise; ``--debug`` shows the traceback instead. A URL
    that is no model server ended the run with a traceback of forty lines."""
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as e:
        if "--debug" in sys.argv[1:]:
            raise
        from flows.errors import exit_code, one_line

        print(f"error: {one_line(e)}", file=sys.stderr, flush=True)
        sys.exit(exit_code(e))


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, whose errors are one line and exit 2, as the ``focus`` command's:
    ``error: argument --questions: expected a whole number of at least 1, got '0';
    python -m examples.browse.run -h lists the options``. argparse printed its usage first
    (three to six lines) above the error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message}; {self.prog} -h lists the options\n")


def count(least: int = 1) -> Callable[[str], int]:
    """An argparse ``type=`` for a whole number of at least ``least``: ``--questions 0``
    collected on no question and ended in ``Collector needs at least one task`` after the
    corpus was built, ``--questions -3`` sliced the questions from the end and collected
    on 37 of them."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = least - 1
        if value < least:
            raise argparse.ArgumentTypeError(f"expected a whole number of at least {least}, got {text!r}")
        return value

    parse.__name__ = f"count_from_{least}"
    return parse


def positive(text: str) -> float:
    """An argparse ``type=`` for a number above 0 (a learning rate): ``--lr -1`` was refused
    by the trainer's configuration only after the toy batch was collected."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number above 0, got {text!r}")
    return value


def add_debug_option(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--debug", action="store_true", help="print the full traceback of an error (see command)")


def check_model_url(ap: argparse.ArgumentParser, url: str | None) -> None:
    """Stop with one line, exit 2, when nothing takes a connection at ``--model-url``
    (``focus.backends.reach.first_contact``, as ``focus collect`` asks): a wrong port
    waited ``outage_wait_s`` (300 s) as for a restart, one progress line every 10 s; or
    when the server there has no ``/v1/completions`` (a plain web server, another API:
    ``no_generation_endpoint``), which refused every rollout of the first wave."""
    from focus.backends.reach import first_contact, no_generation_endpoint

    if not url:
        return
    root = url.rstrip("/")
    root = root[: -len("/v1")] if root.endswith("/v1") else root
    path = OpenAICompatPolicy.path
    if line := first_contact([url], field="--model-url") or no_generation_endpoint(
        root, path, field="--model-url", kind=None
    ):
        ap.exit(2, f"error: {line}\n")


def check_out(ap: argparse.ArgumentParser, out: str) -> None:
    """Stop with one line when the store ``--out`` names cannot be written (a read-only
    file system, a full disk, a file in the way: ``flows.preflight.check_root``, as
    ``focus collect`` asks of ``--store``), before anything runs: a read-only ``--out``
    failed as the batch was written, after the whole collection, and said to rerun with
    the same collection id to resume, which an example does not."""
    from flows.errors import exit_code, one_line
    from flows.preflight import check_root

    try:
        check_root(out, give="give --out a folder you can write")
    except Exception as e:  # noqa: BLE001 - every cause is one line
        ap.exit(exit_code(e), f"error: {one_line(e)}\n")


@contextlib.contextmanager
def model_server(url: str | None, progress: Progress | None = None) -> Iterator[str]:
    """``url`` when given; otherwise the embedded tiny model, started for the block
    (``progress`` says so while it starts)."""
    if url:
        yield url
        return
    from focus.backends import LocalModelServer

    if progress is not None:
        progress.doing = "starting the embedded model server"
    with LocalModelServer() as server:
        if progress is not None:
            progress.doing = None
        yield server.url


def make_codec(tokenizer: str | None) -> ChatCodec:
    """ChatML over a local ``tokenizer.json`` when given, else the tiny model's byte codec."""
    if tokenizer:
        from focus.hf_codec import HFChatCodec

        return HFChatCodec(tokenizer)
    return ByteCodec()


def solve_rate(trees: list[Tree]) -> float:
    """Share of finished rollouts (non-failed leaves) whose path earned a reward."""
    leaves = [(t, n) for t in trees for n in t.leaves() if n.kind != "failed"]
    if not leaves:
        return 0.0
    solved = sum(1 for t, n in leaves if any(r > 0 for e in t.path_to(n.id) for r in e.rewards))
    return solved / len(leaves)


class Progress:
    """One line on standard error every ``every_s`` seconds while a long example runs,
    so that slow can be told from hung: the time so far and the counts it has (added
    with :meth:`add`, or read by ``poll`` at each line), and a last line at the end.
    Standard output keeps the run's result alone."""

    def __init__(
        self,
        what: str,
        every_s: float = 10.0,
        poll: Callable[[], dict[str, int]] | None = None,
        stream: TextIO | None = None,
    ) -> None:
        self.what, self.every_s, self.poll = what, every_s, poll
        self.stream = stream if stream is not None else sys.stderr
        self.counts: dict[str, int] = {}
        #: what the run is doing now, shown first on each line (``None``: nothing said)
        self.doing: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tick, daemon=True, name="example-progress")
        self._t0 = time.monotonic()

    def add(self, **counts: int) -> None:
        with self._lock:
            for k, n in counts.items():
                self.counts[k] = self.counts.get(k, 0) + n

    def line(self, done: bool = False) -> str:
        with self._lock:
            counts = dict(self.counts)
        if self.poll is not None:
            counts |= self.poll()
        took = time.monotonic() - self._t0
        parts = [f"{'done in ' if done else ''}{took:.0f} s"]
        if self.doing and not done:
            parts.append(self.doing)
        parts += [f"{n:,} {k}" for k, n in counts.items()]
        return f"{self.what}: " + ", ".join(parts)

    def _tick(self) -> None:
        while not self._stop.wait(self.every_s):
            print(self.line(), file=self.stream, flush=True)

    def __enter__(self) -> Progress:
        self._t0 = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        print(self.line(done=exc[0] is None), file=self.stream, flush=True)


class CountingPolicy(OpenAICompatPolicy):
    """The OpenAI-compatible client, counting answers and sampled tokens into a :class:`Progress`."""

    def __init__(self, *args: Any, progress: Progress, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.progress = progress

    async def sample(self, prompt_ids: Sequence[int], params: SamplingParams) -> Completion:
        out = await super().sample(prompt_ids, params)
        self.progress.add(**{"model answers": 1, "tokens sampled": len(out.token_ids)})
        return out

    async def _send_siblings(self, prompt_ids: Sequence[int], params: SamplingParams, n: int) -> list[Completion]:
        """The request with ``n`` samples that answers sibling rollouts' first calls
        together (``Policy.sample_siblings``), which does not go through :meth:`sample`."""
        out = await super()._send_siblings(prompt_ids, params, n)
        self.progress.add(**{"model answers": len(out), "tokens sampled": sum(len(c.token_ids) for c in out)})
        return out


def add_json_option(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--json", dest="json_path", metavar="PATH", help="also write the result to this file")


def emit(result: dict[str, Any], json_path: str | None) -> None:
    """The run's result as JSON on standard output and, with ``--json``, in that file
    (what ``python -m examples.records`` keeps as the example's record)."""
    text = json.dumps(result, indent=2, default=str)
    print(text, flush=True)
    if json_path:
        Path(json_path).write_text(text + "\n")
