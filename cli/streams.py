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

:func:`install` also keeps a console whose locale is not UTF-8 from stopping the command
with ``UnicodeEncodeError`` (:func:`encode_anything`): under ``LC_ALL=C`` with Python's
UTF-8 mode off (``PYTHONUTF8=0``) ``focus collect --help`` printed a 50-line traceback on
its first ``…``, and click rewrote an ASCII stream as UTF-8 with ``?`` for the bytes of a
folder name the locale could not decode, so the ``rerun or resume`` line named another store.
"""

from __future__ import annotations

import codecs
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


#: The error handler of the console's streams (see :func:`encode_anything`).
ENCODE_ERRORS = "focus-anything"


def encode_anything(error: UnicodeError) -> tuple[str | bytes, int]:
    """Encode what the encoding cannot: a surrogate U+DC80-U+DCFF as the byte it stands
    for (Python decodes a file name or argument the locale cannot read that way: written
    back, the user's folder is named as typed), any other character as a backslash escape
    (``\\xe9``, ``\\u2026``, as Python's standard error does): a line is never lost for one character."""
    if not isinstance(error, UnicodeEncodeError):
        raise error
    char = error.object[error.start]
    if "\udc80" <= char <= "\udcff":
        return bytes([ord(char) - 0xDC00]), error.start + 1
    return char.encode("ascii", "backslashreplace").decode("ascii"), error.start + 1


codecs.register_error(ENCODE_ERRORS, encode_anything)


def _encode_anything(stream: Any) -> None:
    """An ASCII console (the C or POSIX locale with UTF-8 mode off) is written in UTF-8, as
    Python's UTF-8 mode and click do there (click rewrote it with ``?`` for what it could not
    encode); another code page (Latin-1) keeps its encoding. Neither raises for a character
    it cannot encode (:func:`encode_anything`)."""
    try:
        name = codecs.lookup(stream.encoding).name
    except (AttributeError, LookupError, TypeError):
        return
    wanted = {"encoding": "utf-8", "errors": ENCODE_ERRORS} if name == "ascii" else {"errors": ENCODE_ERRORS}
    try:
        stream.reconfigure(**wanted)
    except (AttributeError, OSError, ValueError):  # not a TextIOWrapper (a test's capture)
        pass


def _closed_at_start() -> None:
    """Put the null device on a standard descriptor (0, 1, 2) the command was started
    without (``focus collect >&-``, ``2>&-``; cron and some service managers start jobs
    so), and give Python a stream on it where it has ``None``. Every command ended with an
    ``AttributeError: 'NoneType' object has no attribute 'flush'`` traceback and exit 1
    after its work was done; and the first file the command opened took the free number,
    so whatever wrote to "standard output" (a subprocess that inherits it, C code) wrote
    into that file instead. Written there, it is dropped, as for a console that went away."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)  # the lowest free number: ``fd`` itself
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    for attr, fd in (("stdout", 1), ("stderr", 2)):
        if getattr(sys, attr) is None:
            setattr(sys, attr, open(fd, "w", encoding="utf-8", errors=ENCODE_ERRORS, closefd=False))  # noqa: SIM115


def install() -> None:
    """Wrap ``sys.stdout`` and ``sys.stderr`` (once)."""
    _closed_at_start()
    for attr, name in (("stdout", "standard output"), ("stderr", "standard error")):
        stream = getattr(sys, attr)
        if stream is not None and not isinstance(stream, SurvivingStream):
            _encode_anything(stream)
            setattr(sys, attr, SurvivingStream(stream, name))
