"""How a policy talks to an env: a codec renders token ids, a parser reads actions.

:class:`ChatCodec` turns messages into token ids. Messages that carry ``token_ids``
(sampled turns, summaries) are emitted verbatim, so generated text is never
re-tokenised. :meth:`ChatCodec.observation_ids` gives the exact ids to append after a
sampled completion to add observation turns and open the next assistant turn - this is
what lets a context grow by appending only.

:class:`ActionParser` turns the decoded text of a response into an env
:class:`~focus.env.Action`, or a :class:`ParseError` whose message becomes the next
observation. A malformed response never raises.
"""

from __future__ import annotations

import abc
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from focus.env import Action, Message


class ChatCodec(abc.ABC):
    """Messages <-> token ids for one model family."""

    #: Number of token ids the model knows; ids outside [0, vocab_size) are invalid.
    vocab_size: int
    #: Ids that end an assistant turn; sent as stop ids with every request.
    stop_token_ids: tuple[int, ...] = ()

    @abc.abstractmethod
    def render(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> list[int]:
        """Ids of a conversation, ending with an open assistant turn if asked."""

    @abc.abstractmethod
    def observation_ids(self, completion_ids: Sequence[int], messages: Sequence[Message]) -> list[int]:
        """Ids to append after ``completion_ids``: close the turn if the completion did
        not, render ``messages`` and open the next assistant turn."""

    @abc.abstractmethod
    def decode(self, ids: Sequence[int]) -> str:
        """Text of sampled ids, for parsing only: without the tokens that bound a turn or
        a sequence (the stop id, an EOS), with any marker the parser reads (a tool-call
        marker that is a special token: :meth:`focus.hf_codec.HFChatCodec.decode`)."""

    def settings(self) -> dict[str, Any]:
        """What of this codec, beyond its class, decides the ids it renders (JSON values;
        none by default). The pipeline keeps them with a collection's configuration and
        refuses a resume whose codec differs in them (``tasks.fingerprint``): the codec
        comes from the env factory's code, so no configuration field says so."""
        return {}


class ByteCodec(ChatCodec):
    """Byte-level codec of the embedded tiny model: 256 byte ids plus role markers.

    Layout: ``<bos>`` then per message ``<role> bytes <eot>``; an open assistant turn is
    ``<assistant>``. Ids: bytes 0-255, then BOS, EOT, SYSTEM, USER, ASSISTANT, TOOL, PAD.
    """

    BOS, EOT, SYSTEM, USER, ASSISTANT, TOOL, PAD = range(256, 263)
    vocab_size = 263
    stop_token_ids = (EOT,)
    _ROLES = {"system": SYSTEM, "user": USER, "assistant": ASSISTANT, "tool": TOOL}

    def _role(self, role: str) -> int:
        try:
            return self._ROLES[role]
        except KeyError:
            raise ValueError(f"ByteCodec has no role {role!r}; known: {sorted(self._ROLES)}") from None

    def _message(self, m: Message) -> list[int]:
        body = list(m.token_ids) if m.token_ids is not None else list(m.content.encode())
        if body and body[-1] == self.EOT:
            return [self._role(m.role), *body]
        return [self._role(m.role), *body, self.EOT]

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> list[int]:
        ids = [self.BOS]
        for m in messages:
            ids += self._message(m)
        if add_generation_prompt:
            ids.append(self.ASSISTANT)
        return ids

    def observation_ids(self, completion_ids: Sequence[int], messages: Sequence[Message]) -> list[int]:
        ids = [] if completion_ids and completion_ids[-1] == self.EOT else [self.EOT]
        for m in messages:
            ids += self._message(m)
        ids.append(self.ASSISTANT)
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """Text of the byte ids; role markers are skipped. An id outside the vocabulary
        raises :class:`ValueError` naming it, never dropped: it means the model behind
        the policy is not this codec's (an agent's check of each answer catches it
        first: ``Policy.check_completion``, against this ``vocab_size`` where the policy
        knows none)."""
        if ids and (min(ids) < 0 or max(ids) >= self.vocab_size):
            bad = next(i for i in ids if not 0 <= i < self.vocab_size)
            raise ValueError(f"ByteCodec cannot decode token id {bad}: outside its vocabulary [0, {self.vocab_size})")
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def encode_text(self, text: str) -> list[int]:
        """Plain bytes of ``text`` (for prompts and training targets, never for samples)."""
        return list(text.encode())


@dataclass(frozen=True)
class ParseError:
    """Why a response is not a valid action; the message is shown to the model."""

    message: str


class ActionParser(abc.ABC):
    """Text of one response -> an Action, or a ParseError. Must not raise."""

    @abc.abstractmethod
    def parse(self, text: str) -> Action | ParseError: ...


_ANSWER_PATTERNS = (
    re.compile(r"<answer>(.*?)</answer>", re.S),
    re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}"),
    re.compile(r"(?:^|\n)\s*(?:final answer|answer)\s*[:=]\s*(.+?)\s*$", re.I | re.S),
)


def find_answer(text: str) -> str | None:
    """The final answer in ``text`` (``<answer>``, ``\\boxed{}``, ``Answer: ...``) or None."""
    for pattern in _ANSWER_PATTERNS:
        matches = pattern.findall(text)
        if matches:
            return matches[-1].strip()
    return None


class FinalAnswerParser(ActionParser):
    """Single-turn tasks: the response must contain a final answer.

    With ``require_marker=False`` the whole response counts as the answer when no
    marker is found.
    """

    def __init__(self, require_marker: bool = True) -> None:
        self.require_marker = require_marker

    def parse(self, text: str) -> Action | ParseError:
        answer = find_answer(text)
        if answer is None and not self.require_marker:
            answer = text.strip()
        if not answer:
            return ParseError("No final answer found. End with 'Answer: <value>'.")
        return Action("answer", text=answer)


def _tool_action(obj: object, where: str) -> Action | ParseError:
    if not isinstance(obj, dict):
        return ParseError(f"The {where} must be a JSON object with 'name' and 'arguments'.")
    name = obj.get("name", obj.get("tool"))
    args = obj.get("arguments", obj.get("args", {}))
    if not isinstance(name, str) or not name:
        return ParseError(f"The {where} has no tool 'name'.")
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError as e:
            return ParseError(f"The 'arguments' of the {where} are not valid JSON: {e.msg}.")
    if not isinstance(args, dict):
        return ParseError(f"The 'arguments' of the {where} must be a JSON object.")
    return Action("tool", name=name, arguments=args)


class JsonToolCallParser(ActionParser):
    """A bare JSON object ``{"name": ..., "arguments": {...}}`` is a tool call;
    ``{"answer": ...}`` or an answer marker is the final answer."""

    def parse(self, text: str) -> Action | ParseError:
        start = text.find("{")
        if start >= 0:
            try:
                obj, _ = json.JSONDecoder().raw_decode(text[start:])
            except json.JSONDecodeError as e:
                if find_answer(text) is None:
                    return ParseError(f"The tool call is not valid JSON: {e.msg} at position {e.pos}.")
            else:
                if isinstance(obj, dict) and "answer" in obj and "name" not in obj:
                    return Action("answer", text=str(obj["answer"]))
                return _tool_action(obj, "tool call")
        answer = find_answer(text)
        if answer is not None:
            return Action("answer", text=answer)
        return ParseError('Reply with a JSON tool call {"name": ..., "arguments": {...}} or a final answer.')


class XmlToolCallParser(ActionParser):
    """Hermes/Qwen style: ``<tool_call>{json}</tool_call>`` or ``<answer>...</answer>``."""

    _CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)

    def parse(self, text: str) -> Action | ParseError:
        calls = self._CALL.findall(text)
        if calls:
            try:
                obj = json.loads(calls[0])
            except json.JSONDecodeError as e:
                return ParseError(f"The <tool_call> body is not valid JSON: {e.msg} at position {e.pos}.")
            return _tool_action(obj, "<tool_call> body")
        if "<tool_call>" in text:
            return ParseError("The <tool_call> tag is not closed with </tool_call>.")
        answer = find_answer(text)
        if answer is not None:
            return Action("answer", text=answer)
        return ParseError("Call a tool with <tool_call>{...}</tool_call> or answer with <answer>...</answer>.")


@dataclass(frozen=True)
class PolicyFormat:
    """A codec (model input) paired with a parser (model output -> env action)."""

    codec: ChatCodec
    parser: ActionParser
