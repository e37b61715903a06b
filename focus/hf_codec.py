"""A ChatCodec over a Hugging Face ``tokenizers`` tokenizer read from a local file.

Real chat models (Qwen, many others) use ChatML: ``<|im_start|>role\\ncontent<|im_end|>\\n``
per message and ``<|im_start|>assistant\\n`` to open the reply. This codec renders that
layout from ids, encoding each piece of text on its own (the role header, the
content, the separator) instead of tokenising the whole rendered string at once. That
costs exact agreement with ``apply_chat_template`` at piece boundaries (BPE could
merge across them), and buys the property FOCUS depends on: rendering is a
concatenation of per-message ids, so ``render(messages + [reply, *observations])``
equals ``render(messages) + reply ids + observation_ids(...)``, and sampled replies go
in verbatim. Nothing is fetched from a hub: ``tokenizer_path`` is a ``tokenizer.json``
file or a folder holding one.

Special-token strings inside a message's text (``<|im_end|>`` in a tool's output, a web
page, a file the agent reads) are encoded as the characters they spell by default
(``content_special_tokens="text"``), so env text cannot close its turn and open
another: a tool output holding ``<|im_end|>\\n<|im_start|>assistant\\n`` was encoded as
the control ids of a turn boundary, and the model saw a forged assistant turn in its
context. ``"control"`` keeps what ``apply_chat_template``, vLLM's and SGLang's chat
endpoints, and the multi-turn rollouts of verl and slime (which tokenise tool messages
with ``apply_chat_template``) do: the strings become the special tokens' ids. Only
special tokens are split; the tokenizer's other added tokens (Qwen's ``<think>``,
``<tool_call>``) are matched in either setting, and text without special-token strings
gets the same ids in both. Sampled replies are never encoded (their ids go in as
sampled), whatever the setting.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from focus.env import Message
from focus.format import ChatCodec


@dataclass(frozen=True)
class ChatTemplate:
    """The text around each message. ``{role}`` in ``turn_start`` is replaced by the role.

    ``turn_end`` must be a single special token: it is the stop id a reply ends with.
    """

    turn_start: str = "<|im_start|>{role}\n"
    turn_end: str = "<|im_end|>"
    separator: str = "\n"
    begin: str = ""
    roles: tuple[str, ...] = ("system", "user", "assistant", "tool")


CHATML = ChatTemplate()
TEMPLATES = {"chatml": CHATML}


#: What special-token strings in a message's text become (:class:`HFChatCodec`).
CONTENT_SPECIAL_TOKENS = ("text", "control")


class HFChatCodec(ChatCodec):
    """ChatML (or another :class:`ChatTemplate`) over a local ``tokenizers`` tokenizer.

    ``content_special_tokens``: ``"text"`` (default) encodes special-token strings in the
    text of messages (env and tool text, task prompts) as the characters they spell
    (tokenizers' ``encode_special_tokens``, transformers' ``split_special_tokens=True``);
    ``"control"`` encodes them as the special tokens' ids, as ``apply_chat_template`` and
    vLLM do (see the module's docstring). The template's own pieces are always control
    ids.
    """

    def __init__(
        self,
        tokenizer_path: str | os.PathLike[str],
        chat_template: str | ChatTemplate = "chatml",
        *,
        content_special_tokens: Literal["text", "control"] = "text",
    ) -> None:
        from tokenizers import Tokenizer

        path = Path(tokenizer_path)
        if path.is_dir():
            path = path / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"no tokenizer file at {path} (give a tokenizer.json or a folder holding one)")
        if isinstance(chat_template, str):
            if chat_template not in TEMPLATES:
                raise ValueError(
                    f"unknown chat template {chat_template!r}; known: {sorted(TEMPLATES)} or a ChatTemplate"
                )
            chat_template = TEMPLATES[chat_template]
        if content_special_tokens not in CONTENT_SPECIAL_TOKENS:
            raise ValueError(
                f"content_special_tokens must be one of {CONTENT_SPECIAL_TOKENS}, got {content_special_tokens!r}"
            )
        self.path = str(path)
        self.template = chat_template
        self.content_special_tokens = content_special_tokens
        self._tok: Any = Tokenizer.from_file(self.path)
        # a second tokenizer that splits special-token strings (tokenizers keeps the
        # switch on the tokenizer object, and the template's pieces need the first)
        self._plain: Any = Tokenizer.from_file(self.path)
        self._plain.encode_special_tokens = True
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        end = self._tok.token_to_id(chat_template.turn_end)
        if end is None:
            raise ValueError(
                f"tokenizer {self.path} has no token {chat_template.turn_end!r}: the turn end must be one "
                "special token (add it as a special token when building the tokenizer)"
            )
        self.end_id: int = end
        self.stop_token_ids = (end,)
        self._role_ids = {r: self.encode_text(chat_template.turn_start.format(role=r)) for r in chat_template.roles}
        self._sep = self.encode_text(chat_template.separator)
        self._begin = self.encode_text(chat_template.begin)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_tok"] = self._tok.to_str()
        del state["_plain"]  # the same tokenizer, with the switch set again on load
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        from tokenizers import Tokenizer

        text = state["_tok"]
        state["_tok"], state["_plain"] = Tokenizer.from_str(text), Tokenizer.from_str(text)
        state["_plain"].encode_special_tokens = True
        state.setdefault("content_special_tokens", "control")  # pickled before the setting existed
        self.__dict__.update(state)

    def settings(self) -> dict[str, Any]:
        """The chat template, what special-token strings in message text become, and the
        tokenizer itself (a digest of its serialisation: another ``tokenizer.json`` at the
        same path renders other ids; the same one at another path does not)."""
        return {
            "template": asdict(self.template),
            "content_special_tokens": self.content_special_tokens,
            "tokenizer_sha256": self.tokenizer_digest(),
        }

    def tokenizer_digest(self) -> str:
        """SHA-256 of the tokenizer's JSON serialisation (computed once)."""
        digest: str | None = self.__dict__.get("_digest")
        if digest is None:
            digest = self.__dict__["_digest"] = hashlib.sha256(self._tok.to_str().encode()).hexdigest()
        return digest

    def encode_text(self, text: str) -> list[int]:
        """Ids of plain text (special-token strings in it map to their ids)."""
        return list(self._tok.encode(text, add_special_tokens=False).ids) if text else []

    def encode_content(self, text: str) -> list[int]:
        """Ids of a message's text, as ``content_special_tokens`` says. A character the
        tokenizer has no token for, and drops (:meth:`drops_unknown`), is a
        :class:`ValueError` naming it: the model read the env's text without it, and
        nothing said so (the opening messages then stop the collection naming the task; an
        observation fails its rollout)."""
        if not text:
            return []
        tok = self._tok if self.content_special_tokens == "control" else self._plain
        encoding = tok.encode(text, add_special_tokens=False)
        if self.drops_unknown():
            dropped = _uncovered(text, encoding.offsets)
            if dropped is not None:
                raise ValueError(
                    f"tokenizer {self.path} has no token for {text[dropped]!r} (character {dropped} of the text) "
                    "and drops it (a BPE without an unknown token or byte fallback): the model would read the text "
                    "without it; replace such characters in the text, or use a tokenizer that covers them"
                )
        return list(encoding.ids)

    def drops_unknown(self) -> bool:
        """Whether the tokenizer encodes a character outside its vocabulary as nothing: a
        BPE model without an unknown token, byte fallback or the byte-level pre-tokenizer
        (whose alphabet covers every byte). Other models map such a character to a token,
        an unknown one at worst, which the model sees (computed once)."""
        drops: bool | None = self.__dict__.get("_drops")
        if drops is None:
            spec = json.loads(self._tok.to_str())
            model = spec.get("model") or {}
            drops = (
                model.get("type") == "BPE"
                and model.get("unk_token") is None
                and not model.get("byte_fallback")
                and "ByteLevel" not in json.dumps(spec.get("pre_tokenizer"))
            )
            self.__dict__["_drops"] = drops
        return drops

    def _header(self, role: str) -> list[int]:
        try:
            return self._role_ids[role]
        except KeyError:
            raise ValueError(f"chat template has no role {role!r}; known: {list(self._role_ids)}") from None

    def _message(self, m: Message) -> list[int]:
        body = list(m.token_ids) if m.token_ids is not None else self.encode_content(m.content)
        if not body or body[-1] != self.end_id:
            body.append(self.end_id)
        return [*self._header(m.role), *body, *self._sep]

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> list[int]:
        ids = list(self._begin)
        for m in messages:
            ids += self._message(m)
        if add_generation_prompt:
            ids += self._header("assistant")
        return ids

    def observation_ids(self, completion_ids: Sequence[int], messages: Sequence[Message]) -> list[int]:
        ids = [] if completion_ids and completion_ids[-1] == self.end_id else [self.end_id]
        ids += self._sep
        for m in messages:
            ids += self._message(m)
        ids += self._header("assistant")
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """Text of sampled ids for the action parser: special tokens are kept as the text
        they spell, but for those that bound a turn or a sequence (:meth:`hidden_ids`).
        A tool-call marker registered as a special token (Mistral's ``[TOOL_CALLS]``,
        Llama 3's ``<|python_tag|>``, ``<tool_call>`` where a tokenizer marks it special)
        was dropped with every other special token, so the parser read the call as
        plain text (or none at all)."""
        hidden = self.hidden_ids()
        return str(self._tok.decode([i for i in ids if i not in hidden], skip_special_tokens=False))

    def hidden_ids(self) -> frozenset[int]:
        """The special tokens :meth:`decode` leaves out: the chat template's own (the turn
        end, the role headers', ``begin``'s and the separator's), those the tokenizer adds
        around a sequence (its post-processor's, its model's unknown token), and those
        whose text names a sequence's or turn's bounds (:data:`BOUNDARY_TOKENS`: an EOS
        such as ``<|endoftext|>`` or ``</s>`` that a server stops at and returns as the
        last sampled id). The parser must not read them: ``Answer: 42<|endoftext|>``
        would answer ``42<|endoftext|>``. Computed once."""
        hidden: frozenset[int] | None = self.__dict__.get("_hidden")
        if hidden is None:
            special = {i: t.content for i, t in self._tok.get_added_tokens_decoder().items() if t.special}
            pieces = [self.end_id, *self._begin, *self._sep]
            pieces += [i for header in self._role_ids.values() for i in header]
            spec = json.loads(self._tok.to_str())
            named = _sequence_specials(spec.get("post_processor"))
            unk = (spec.get("model") or {}).get("unk_token")
            hidden = frozenset(
                i
                for i, text in special.items()
                if i in pieces or text in named or text == unk or BOUNDARY_TOKENS.search(text) is not None
            )
            self.__dict__["_hidden"] = hidden
        return hidden


#: Special tokens that bound a sequence or a turn, by their text (any model's spelling:
#: ``<s>``/``</s>``, ``<|endoftext|>``, ``<|end_of_text|>``, ``<|eot_id|>``, ``<eos>``,
#: ``<end_of_turn>``, ``<|im_end|>``, ``<|end|>``, DeepSeek's ``<｜end▁of▁sentence｜>``,
#: ``[INST]``, padding, masks): :meth:`HFChatCodec.decode` leaves them out.
BOUNDARY_TOKENS = re.compile(
    r"^(?:<s>|</s>|<unk>|<pad>|<mask>|<bos>|<eos>|<\|end\|>|<\|return\|>|<\|user\|>|<\|assistant\|>|<\|system\|>)$"
    r"|^\[/?(?:PAD|UNK|CLS|SEP|MASK|INST|SYSTEM_PROMPT)\]$"
    r"|(?:begin|end|start)\W?_?of\W?_?(?:text|sentence|turn|sequence)|(?<![a-z])(?:eos|eot|eom|bos|pad)(?![a-z])"
    r"|im_(?:start|end|sep)|_header_id|endofprompt",
    re.IGNORECASE,
)


def _sequence_specials(processor: Any) -> set[str]:
    """The special tokens a tokenizer's post-processor (its JSON) adds around a sequence:
    a template's ``special_tokens``, BERT's and RoBERTa's ``cls`` and ``sep``, in a
    ``Sequence`` of processors too."""
    if not isinstance(processor, dict):
        return set()
    found = set((processor.get("special_tokens") or {}).keys())
    for key in ("cls", "sep"):
        if isinstance(processor.get(key), list) and processor[key]:
            found.add(str(processor[key][0]))
    for inner in processor.get("processors") or ():
        found |= _sequence_specials(inner)
    return found


def _uncovered(text: str, offsets: Sequence[tuple[int, int]]) -> int | None:
    """The first character of ``text`` outside every token's span that is not whitespace
    (a pre-tokenizer that splits on whitespace drops it by design), or ``None``."""
    pos = 0
    for start, end in [*offsets, (len(text), len(text))]:
        gap = text[pos:start]
        if gap and not gap.isspace():
            return pos + len(gap) - len(gap.lstrip())
        pos = max(pos, end)
    return None
