"""Standard output and standard error that outlive their reader.

A long command's console can go away while it works: ``focus collect 2>&1 | tee log``
whose ``tee`` is killed, ``| head -1``, a log shipper that restarts, a terminal closed
under ``nohup``-less ``tmux`` kill. Writing to it then fails (``EPIPE`` into a pipe,
``EIO`` on a terminal that hung up). rich answers a broken pipe by raising
``SystemExit(1)`` from whatever frame printed, so a progress line ended a collection in
the middle of its evidence, silently and with exit 1, without a word in the log file;
a finished collection whose result could not be printed exited 1 too.

:func:`install` wraps ``sys.stdout`` and ``sys.stderr``: the first write that fails
turns the stream into a sink (its descriptor points at ``/dev/null``, so subprocesses
that share it and the interpreter's last flush do not fail either), one warning goes to
the log file, and the command carries on; its exit status is its work's. What it would
have printed is in the log file (progress, warnings, errors), and a rerun of a finished
collection prints its result again.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, TextIO

log = logging.getLogger("focus.console")


class SurvivingStream:
    """A text stream that drops what it cannot write once its reader is gone."""

    def __init__(self, stream: TextIO, name: str) -> None:
        self._stream = stream
        self._name = name
        #: Why the stream was given up (``None`` while it works).
        self.gone: str | None = None

    def write(self, text: str) -> int:
        if self.gone is None:
            try:
                return self._stream.write(text)
            except OSError as e:
                self._give_up(e)
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if self.gone is None:
            try:
                self._stream.flush()
            except OSError as e:
                self._give_up(e)

    def isatty(self) -> bool:
        if self.gone is not None:
            return False
        try:
            return self._stream.isatty()
        except (OSError, ValueError):
            return False

    def _give_up(self, error: OSError) -> None:
        self.gone = error.strerror or type(error).__name__
        try:  # the descriptor too: what is buffered, and children that write to it
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, self._stream.fileno())
            finally:
                os.close(devnull)
            self._stream.flush()
        except (OSError, ValueError):
            pass
        note = (
            f"the console's {self._name} was closed ({self.gone}): the command goes on; what it "
            "prints is dropped, its log goes on in this file"
        )
        record = log.makeRecord(log.name, logging.WARNING, __file__, 0, note, (), None)
        # to the log file alone: the console's handler would write to this stream again
        for handler in logging.getLogger().handlers:
            if isinstance(handler, logging.FileHandler):
                handler.handle(record)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def install() -> None:
    """Wrap ``sys.stdout`` and ``sys.stderr`` (once)."""
    for attr, name in (("stdout", "standard output"), ("stderr", "standard error")):
        stream = getattr(sys, attr)
        if stream is not None and not isinstance(stream, SurvivingStream):
            setattr(sys, attr, SurvivingStream(stream, name))
