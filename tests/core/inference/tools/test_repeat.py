"""Forced tool calls end at the first call that repeats an earlier one (same name, same arguments
as parsed JSON); the repeat is never announced, at any split of the model's output."""

from __future__ import annotations

import json

import pytest

from app.core.inference.tools import ToolCallParser

CALL = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>'
)
# the same call again, its arguments spaced and ordered differently
SAME = '<tool_call>\n{"name":"get_weather","arguments":{"days":2,"city":"Paris"}}\n</tool_call>'
OTHER = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "days": 2}}\n</tool_call>'
)

# (family, output that loops, the calls that come out before the repeat)
LOOPS = [
    (
        "hermes",
        "\n".join([CALL, CALL, CALL, CALL]),
        [("get_weather", {"city": "Paris", "days": 2})],
    ),
    ("hermes", f"{CALL}\n{SAME}\n{CALL}", [("get_weather", {"city": "Paris", "days": 2})]),
    (
        "hermes",
        f"{CALL}\n{OTHER}\n{SAME}\n{OTHER}",
        [
            ("get_weather", {"city": "Paris", "days": 2}),
            ("get_weather", {"city": "Rome", "days": 2}),
        ],
    ),
    (
        "mistral",
        '[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}}, {"name": "f", "arguments": {"a": 1}}]',
        [("f", {"a": 1})],
    ),
    (
        "qwen3coder",
        "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>\n"
        * 3,
        [("f", {"a": 1})],
    ),
    (
        "harmony",
        '<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"a": 1}<|call|>'
        '<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{ "a":1 }<|call|>',
        [("f", {"a": 1})],
    ),
]


def collect(family: str, pieces: list[str], *, end_on_repeat: bool) -> tuple[list, ToolCallParser]:
    """The calls as announced (name, parsed arguments); every fragment follows its call's start."""
    p = ToolCallParser(family, end_on_repeat=end_on_repeat)
    names: dict[int, str] = {}
    args: dict[int, str] = {}
    for ev in [*(p.feed(x) for x in pieces), p.flush()]:
        for c in ev.started:
            assert c.index == len(names)
            names[c.index] = c.name
        for i, frag in ev.arguments:
            assert i in names
            args[i] = args.get(i, "") + frag
    return [(names[i], json.loads(args[i])) for i in sorted(names)], p


def splits(raw: str) -> list[list[str]]:
    return [[raw[:cut], raw[cut:]] for cut in range(len(raw) + 1)] + [list(raw)]


@pytest.mark.parametrize(("family", "raw", "calls"), LOOPS)
def test_a_repeated_call_ends_the_calls_and_is_never_announced(
    family: str, raw: str, calls: list
) -> None:
    for pieces in splits(raw):
        got, p = collect(family, pieces, end_on_repeat=True)
        assert got == calls
        assert p.repeated and p.exhausted and p.closed == len(calls)


@pytest.mark.parametrize(("family", "raw", "calls"), LOOPS)
def test_without_end_on_repeat_every_call_comes_out(family: str, raw: str, calls: list) -> None:
    got, p = collect(family, [raw], end_on_repeat=False)
    assert len(got) > len(calls) and not p.repeated


def test_a_call_under_a_new_name_streams_at_once() -> None:
    raw = CALL + '\n<tool_call>\n{"name": "now", "arguments": {"tz": "Europe/Paris"}}\n</tool_call>'
    p = ToolCallParser("hermes", end_on_repeat=True)
    first = p.feed(raw[: raw.index('"Europe')])
    assert [c.name for c in first.started] == ["get_weather", "now"]
    assert first.arguments[-1][0] == 1  # the second call's arguments flow before it closes
    assert not p.flush().started and not p.repeated


def test_a_call_under_an_earlier_name_is_held_until_it_is_known_new() -> None:
    raw = f"{CALL}\n{OTHER}"
    p = ToolCallParser("hermes", end_on_repeat=True)
    assert [c.index for c in p.feed(CALL).started] == [0]
    held = p.feed(raw[len(CALL) : raw.index("Rome") + 4])
    assert not held.started and not held.arguments
    rest = p.feed(raw[raw.index("Rome") + 4 :])
    assert [(c.index, c.name) for c in rest.started] == [(1, "get_weather")]
    assert json.loads("".join(f for i, f in rest.arguments if i == 1)) == {
        "city": "Rome",
        "days": 2,
    }
    assert not p.repeated


def test_the_text_after_a_repeat_is_not_content() -> None:
    p = ToolCallParser("hermes", end_on_repeat=True)
    ev = p.feed(f"{CALL}\n{CALL}\nI keep calling.")
    assert ev.text == "" and p.repeated
    assert [c.name for c in ev.started] == ["get_weather"]
