"""Codecs emit sampled ids verbatim; parsers turn malformed output into messages."""

from __future__ import annotations

from focus.env import Action, Message
from focus.format import ByteCodec, FinalAnswerParser, JsonToolCallParser, ParseError, XmlToolCallParser


def test_byte_codec_appending_equals_rendering():
    c = ByteCodec()
    opening = [Message("system", "sys"), Message("user", "q")]
    completion = [*b"hi there", c.EOT]
    obs = [Message("tool", "result")]
    prefix = c.render(opening)
    appended = prefix + completion + c.observation_ids(completion, obs)
    assert appended == c.render([*opening, Message("assistant", "hi there", tuple(completion)), *obs])
    # a completion cut by max_tokens (no EOT) gets its turn closed
    cut = list(b"hi")
    assert c.observation_ids(cut, obs)[0] == c.EOT


def test_byte_codec_keeps_invalid_utf8_ids_verbatim():
    c = ByteCodec()
    ids = (0xFF, 0xFE, c.EOT)
    rendered = c.render([Message("assistant", c.decode(ids), ids)], add_generation_prompt=False)
    assert rendered[-4:] == [c.ASSISTANT, 0xFF, 0xFE, c.EOT]


def test_xml_parser():
    p = XmlToolCallParser()
    assert p.parse('x <tool_call>{"name": "s", "arguments": {"q": "a"}}</tool_call>') == Action(
        "tool", name="s", arguments={"q": "a"}
    )
    assert p.parse("<answer> 42 </answer>") == Action("answer", text="42")
    for bad, why in [
        ("<tool_call>{nope</tool_call>", "not valid JSON"),
        ("<tool_call>{}", "not closed"),
        ('<tool_call>{"arguments": {}}</tool_call>', "no tool 'name'"),
        ("hmm", "Call a tool"),
    ]:
        out = p.parse(bad)
        assert isinstance(out, ParseError) and why in out.message, (bad, out)


def test_json_parser():
    p = JsonToolCallParser()
    assert p.parse('{"name": "f", "arguments": "{\\"a\\": 1}"}') == Action("tool", name="f", arguments={"a": 1})
    assert p.parse('{"answer": 3}') == Action("answer", text="3")
    assert isinstance(p.parse('{"name": "f", "arguments": [1]}'), ParseError)
    assert isinstance(p.parse("{broken"), ParseError)


def test_final_answer_parser():
    p = FinalAnswerParser()
    assert p.parse("so \\boxed{\\frac{1}{2}}") == Action("answer", text="\\frac{1}{2}")
    assert p.parse("work...\nAnswer: 12") == Action("answer", text="12")
    assert isinstance(p.parse("no idea"), ParseError)
    assert FinalAnswerParser(require_marker=False).parse(" 7 ") == Action("answer", text="7")
