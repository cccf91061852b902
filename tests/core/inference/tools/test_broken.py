"""A tool call the model starts but does not finish correctly comes back as the text it wrote,
with the reason, at every split of the output; nothing of it is dropped."""

from __future__ import annotations

import json

import pytest

from app.core.inference.tools import ToolCallParser

GOOD = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
# (family, output, reason, where the broken call's block starts, the whole calls before it)
BROKEN = [
    # arguments that stop being JSON
    (
        "hermes",
        '<tool_call>{"name": "f", "arguments": {"a": 1, "b": 2 3}}</tool_call>after',
        "malformed_arguments",
    ),
    (
        "hermes",
        '<tool_call>{"name": "f", "arguments": {"a": "x", "b": tru }}</tool_call>',
        "malformed_arguments",
    ),
    (
        "hermes",
        '<tool_call>{"name": "f", "arguments": {"a": [1, {"b": "c\\q"}]}}</tool_call>',
        "malformed_arguments",
    ),
    (
        "hermes",
        '<tool_call>{"name": "f", "arguments": {"a": 1,}}</tool_call>',
        "malformed_arguments",
    ),
    (
        "harmony",
        '<|channel|>commentary to=functions.f <|message|>{"a": {"b": 1}, "c": oops}<|call|>',
        "malformed_arguments",
    ),
    (
        "deepseek",
        '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{"a": nope}\n```'
        "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        "malformed_arguments",
    ),
    # the output ends mid-call (max_tokens, a stop string)
    ("hermes", '<tool_call>{"name": "f", "arguments": {"a": "hel', "incomplete"),
    ("hermes", '<tool_call>{"name": "f", "arguments": {"a": 12', "incomplete"),
    ("hermes", '<tool_call>{"name": "f", "arguments": {"a": 1, "b": 1.5e', "incomplete"),
    ("hermes", 'Checking. <tool_call>{"name": "f"', "incomplete"),
    ("mistral", '[TOOL_CALLS][{"name": "f", "arguments": {"a": [1, 2', "incomplete"),
    ("llama3", '{"name": "f", "parameters": {"q": "par', "incomplete"),
    (
        "qwen3coder",
        "<tool_call><function=f><parameter=a>1</parameter><parameter=b>unfinished",
        "incomplete",
    ),
    (
        "harmony",
        '<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"a": [',
        "incomplete",
    ),
    # the block closes before the call is whole
    ("hermes", '<tool_call>{"name": "f", "arguments": {"a": 1</tool_call> so', "incomplete"),
    (
        "qwen3coder",
        "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</tool_call>",
        "incomplete",
    ),
]
OPENERS = ("<tool_call>", "<|channel|>", "<｜tool▁calls▁begin｜>", "[TOOL_CALLS]", "{")


def run(family: str, pieces: list[str]) -> tuple[str, str, dict[int, str], ToolCallParser]:
    """(content text, broken text, announced calls' arguments by index, the parser)."""
    p = ToolCallParser(family)
    text, broken, args = "", "", {}
    for ev in [*(p.feed(x) for x in pieces), p.flush()]:
        text += ev.text
        broken += ev.broken
        assert not ev.trailing.strip()  # only the space between calls is not content
        for c in ev.started:
            args[c.index] = ""
        for i, frag in ev.arguments:
            args[i] += frag
    return text, broken, args, p


def splits(raw: str) -> list[list[str]]:
    return [[raw[:cut], raw[cut:]] for cut in range(len(raw) + 1)] + [list(raw)]


@pytest.mark.parametrize(("family", "raw", "reason"), BROKEN)
def test_a_broken_call_is_its_text_with_the_reason(family: str, raw: str, reason: str) -> None:
    at = min(i for i in (raw.find(o) for o in OPENERS) if i >= 0)
    for pieces in splits(raw):
        text, broken, args, p = run(family, pieces)
        assert (text, broken) == (raw[:at], raw[at:])
        assert p.broken == reason and p.exhausted
        # announced before the break was known: its arguments still end as an object
        assert p.broken_index in (None, *args)
        assert all(isinstance(json.loads(a), dict) for a in args.values())


@pytest.mark.parametrize(("family", "raw", "reason"), BROKEN[:3] + BROKEN[6:8])
def test_calls_before_a_broken_one_stand(family: str, raw: str, reason: str) -> None:
    if family != "hermes":
        pytest.skip("two blocks of the same family")
    out = GOOD + raw
    for pieces in splits(out):
        text, broken, args, p = run(family, pieces)
        assert text == "" and broken == raw and p.broken == reason
        assert json.loads(args[0]) == {"city": "Paris"} and p.broken_index == 1


def test_a_held_call_that_breaks_is_never_announced() -> None:
    """Under end_on_repeat a call under an earlier name is held; broken, it is text only."""
    out = GOOD + '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa'
    p = ToolCallParser("hermes", end_on_repeat=True)
    evs = [p.feed(out), p.flush()]
    assert [c.index for ev in evs for c in ev.started] == [0]
    assert "".join(ev.broken for ev in evs) == out[len(GOOD) :]
    assert p.broken == "incomplete" and p.broken_index is None and len(p.calls) == 1


def test_a_block_cut_before_its_call_is_named_is_text_with_the_reason() -> None:
    for family, raw in [
        ("hermes", '<tool_call>\n{"name": "get'),
        ("harmony", "<|channel|>commentary to=functions.get_wea"),
        ("qwen3coder", "<tool_call>\n<function=get_"),
    ]:
        for pieces in splits(raw):
            text, broken, args, p = run(family, pieces)
            assert (text, broken, args) == (raw, "", {}) and p.broken == "incomplete"
    *_, p = run("llama3", ['{"answer": 4'])  # a JSON answer, not a call block
    assert p.broken is None


def test_whole_calls_are_not_broken() -> None:
    for family, raw in [
        ("hermes", GOOD),
        ("hermes", '<tool_call>{"name": "f", "arguments": {"a": 1}} trailing</tool_call>'),
        ("mistral", '[TOOL_CALLS][{"name": "f", "arguments": {}}]'),
        ("qwen3coder", "<tool_call>\n<function=f>\n</function>\n</tool_call>"),
    ]:
        *_, p = run(family, [raw])
        assert p.broken is None and p.calls, raw
