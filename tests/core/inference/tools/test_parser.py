"""Tool-call parsing on raw outputs in each family's documented format, split everywhere."""

from __future__ import annotations

import json

import pytest

from app.core.inference.tools import (
    ParseEvent,
    Tool,
    ToolCallParser,
    detect_family,
    tool_call_constraint,
)

W = '{"city": "Paris", "unit": "°C"}'
FIXTURES = [
    (
        "hermes",
        f'Let me check.<tool_call>\n{{"name": "get_weather", "arguments": {W}}}\n</tool_call>',
        "Let me check.",
        [("get_weather", W)],
    ),
    (
        "hermes",
        f'<tool_call>{{"name": "a", "arguments": {{}}}}</tool_call>\n<tool_call>{{"name": "b", "arguments": {W}}}</tool_call>',
        "\n",
        [("a", "{}"), ("b", W)],
    ),
    ("llama3", f'{{"name": "get_weather", "parameters": {W}}}', "", [("get_weather", W)]),
    (
        "llama3",
        '<|python_tag|>brave_search.call(query="paris weather")',
        "",
        [("brave_search.call", '{"query": "paris weather"}')],
    ),
    (
        "mistral",
        f'[TOOL_CALLS][{{"name": "get_weather", "arguments": {W}}}]',
        "",
        [("get_weather", W)],
    ),
    (
        "qwen3coder",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
        "",
        [("get_weather", '{"city": "Paris", "days": 3}')],
    ),
    (
        "harmony",
        f"<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{W}<|call|>",
        "",
        [("get_weather", W)],
    ),
    (
        "deepseek",
        f"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{W}\n```"
        "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        "<｜tool▁calls▁end｜>",  # trailing: after the call, never content
        [("get_weather", W)],
    ),
    (
        "hermes",
        "No tools needed: 2 < 3 and <tool is not a tag.",
        "No tools needed: 2 < 3 and <tool is not a tag.",
        [],
    ),
    ("hermes", "<tool_call>not json</tool_call>", "<tool_call>not json</tool_call>", []),
]


def outside(p: ToolCallParser, ev: ParseEvent, called: bool) -> str:
    """The text outside calls in ``ev``: text until the first call started, trailing after."""
    assert not (called and ev.text), "text after a call is trailing, never content"
    assert not (ev.trailing and not p.calls)
    return ev.text + ev.trailing


def run(family: str, text: str, step: int) -> tuple[str, list[tuple[str, str]], list[str]]:
    p = ToolCallParser(family)
    out, names, args, ids = [], {}, {}, []
    for i in range(0, len(text), step):
        called = bool(p.calls)
        ev = p.feed(text[i : i + step])
        out.append(outside(p, ev, called))
        for c in ev.started:
            names[c.index] = c.name
            ids.append(c.id)
        for idx, frag in ev.arguments:
            args[idx] = args.get(idx, "") + frag
    called = bool(p.calls)
    ev = p.flush()
    out.append(outside(p, ev, called))
    for c in ev.started:
        names[c.index] = c.name
        ids.append(c.id)
    for idx, frag in ev.arguments:
        args[idx] = args.get(idx, "") + frag
    return "".join(out), [(names[i], args[i]) for i in sorted(names)], ids


@pytest.mark.parametrize(("family", "raw", "text", "calls"), FIXTURES)
@pytest.mark.parametrize("step", [1, 2, 3, 7, 10_000])
def test_fixture_in_every_split(family: str, raw: str, text: str, calls: list, step: int) -> None:
    got_text, got_calls, ids = run(family, raw, step)
    assert got_text == text
    assert [(n, json.loads(a)) for n, a in got_calls] == [(n, json.loads(a)) for n, a in calls]
    assert len(set(ids)) == len(ids) and all(i.startswith("call_") for i in ids)


def test_utf8_and_tag_cut_at_every_point() -> None:
    raw = f'Voilà 🌊 <tool_call>{{"name": "f", "arguments": {W}}}</tool_call>'
    for cut in range(len(raw) + 1):
        p = ToolCallParser("hermes")
        a, b, c = p.feed(raw[:cut]), p.feed(raw[cut:]), p.flush()
        assert a.text + b.text + c.text == "Voilà 🌊 "
        assert [x.name for x in a.started + b.started + c.started] == ["f"]


@pytest.mark.parametrize(
    ("template", "family"),
    [
        ("{{ '<tool_call>' }}", "hermes"),
        ("<|python_tag|>{{ x }}", "llama3"),
        ("[TOOL_CALLS]", "mistral"),
        ("<function=x><parameter=y>", "qwen3coder"),
        ("<|channel|>", "harmony"),
        ("<｜tool▁call▁begin｜>", "deepseek"),
        ("<tool_call>{{ name }}\n<arg_key>{{ k }}</arg_key><arg_value>", "glm"),
        ("<|tool_calls_section_begin|><|tool_call_begin|>functions.", "kimi"),
        ("<|start_of_role|>assistant<|end_of_role|><|tool_call|>", "granite"),
        (None, "hermes"),
    ],
)
def test_detect_family(template: str | None, family: str) -> None:
    assert detect_family(template) == family


def test_forced_call_schema_has_one_alternative_per_tool() -> None:
    params = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    kind, spec = tool_call_constraint(
        [Tool("get_weather", "", params), Tool("now", "", {})], parallel=True
    )
    spec = json.loads(spec)
    assert kind == "tool_call" and spec["parallel"] is True
    alts = spec["schema"]["oneOf"]
    assert [a["properties"]["name"]["const"] for a in alts] == ["get_weather", "now"]
    assert alts[0]["properties"]["arguments"] == params
    assert alts[1]["properties"]["arguments"]["additionalProperties"] is False


# --- arguments streamed as they are generated ---------------------------------------------------

LONG = {
    "text": "The quick brown fox jumps over the lazy dog. " * 3
    + 'Ünïcødé 🌊 "quoted" \\ back\nslash',
    "n": [1, -2.5e3, True, None, {}],
    "nested": {"a": {"b": []}, "c": "d"},
}
LONG_RAW = json.dumps(LONG, ensure_ascii=False, indent=1)  # raw UTF-8, newlines between tokens
LONG_ESC = json.dumps(LONG)  # \\u escapes, a surrogate pair among them
QWEN_PARAMS = "".join(
    f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v)}\n</parameter>\n"
    for k, v in LONG.items()
)
# (family, raw output, text, calls as (name, arguments), where the first call's name is complete)
STREAMED = [
    (
        "hermes",
        f'Sure.<tool_call>\n{{"name": "note", "arguments": {LONG_RAW}}}\n</tool_call>',
        "Sure.",
        [("note", LONG)],
        '"note"',
    ),
    (
        "hermes",
        f'<tool_call>{{"id": 1, "arguments": {LONG_ESC}, "name": "note"}}</tool_call>',
        "",
        [("note", LONG)],
        '"note"',
    ),
    (
        "hermes",
        f'<tool_call>{{"name": "note", "arguments": {json.dumps(LONG_RAW)}}}</tool_call>',
        "",
        [("note", LONG)],
        '"note"',
    ),
    (
        "mistral",
        f'[TOOL_CALLS][{{"name": "note", "arguments": {LONG_ESC}}}, {{"arguments": {{}}, "name": "now"}}]',
        "",
        [("note", LONG), ("now", {})],
        '"note"',
    ),
    ("llama3", f' {{"name": "note", "parameters": {LONG_RAW}}}', "", [("note", LONG)], '"note"'),
    (
        "llama3",
        f'<|python_tag|>{{"name": "note", "arguments": {LONG_ESC}}}; {{"name": "now", "parameters": {{}}}}',
        "",
        [("note", LONG), ("now", {})],
        '"note"',
    ),
    (
        "qwen3coder",
        f"<tool_call>\n<function=note>\n{QWEN_PARAMS}</function>\n</tool_call>",
        "",
        [("note", LONG)],
        "<function=note>",
    ),
    (
        "harmony",
        f"<|channel|>commentary to=functions.note <|constrain|>json<|message|>{LONG_RAW}<|call|>",
        "",
        [("note", LONG)],
        "<|message|>",
    ),
    (
        "deepseek",
        f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>note\n```json\n{LONG_ESC}\n```<｜tool▁call▁end｜>",
        "",
        [("note", LONG)],
        "```json\n",
    ),
]


def trace(family: str, pieces: list[str]) -> tuple[str, list[tuple[int, str, int, str]]]:
    """(text, events as (characters fed so far, "start" | "args", index, name or fragment))."""
    p = ToolCallParser(family)
    text, events, fed = [], [], 0
    for piece in [*pieces, None]:
        called = bool(p.calls)
        if piece is None:
            ev = p.flush()
        else:
            ev, fed = p.feed(piece), fed + len(piece)
        text.append(outside(p, ev, called))
        events += [(fed, "start", c.index, c.name) for c in ev.started]
        events += [(fed, "args", i, frag) for i, frag in ev.arguments]
    return "".join(text), events


def check_calls(events: list[tuple[int, str, int, str]]) -> list[tuple[str, str]]:
    """Each call starts once, before its fragments; (name, joined fragments) per call."""
    calls: dict[int, list[str]] = {}
    names: dict[int, str] = {}
    for _, kind, i, value in events:
        if kind == "start":
            assert i not in names and i == len(names)
            names[i], calls[i] = value, []
        else:
            assert i in names, "a fragment before its call started"
            assert value
            calls[i].append(value)
    return [(names[i], "".join(calls[i])) for i in sorted(names)]


@pytest.mark.parametrize(("family", "raw", "text", "calls", "named"), STREAMED)
def test_streamed_calls_split_at_every_point(
    family: str, raw: str, text: str, calls: list, named: str
) -> None:
    splits = [[raw[:cut], raw[cut:]] for cut in range(len(raw) + 1)] + [list(raw)]
    for pieces in splits:
        got_text, events = trace(family, pieces)
        assert got_text == text
        got = check_calls(events)
        assert [(n, json.loads(a)) for n, a in got] == calls
    # fed a character at a time, the first call's arguments come in many fragments (unless they
    # came before the name, and so were held until it)
    held = 0 <= raw.find('"arguments"') < raw.index(named)
    assert len([e for e in events if e[1:3] == ("args", 0)]) > (0 if held else len(LONG))


@pytest.mark.parametrize(("family", "raw", "text", "calls", "named"), STREAMED)
def test_arguments_arrive_while_generated(
    family: str, raw: str, text: str, calls: list, named: str
) -> None:
    pieces = [raw[i : i + 3] for i in range(0, len(raw), 3)]  # about a token each
    _, events = trace(family, pieces)
    started = [fed for fed, kind, i, _ in events if kind == "start" and i == 0]
    fragments = [fed for fed, kind, i, _ in events if kind == "args" and i == 0]
    assert started[0] <= raw.index(named) + len(named) + 2  # as soon as the name is complete
    if 0 <= raw.find('"arguments"') < raw.index(named):  # held until the name is known, then sent
        assert fragments[0] == started[0]
        return
    if family == "qwen3coder":  # a fragment per parameter as it closes, then the closing brace
        assert len(fragments) == len(LONG) + 1 and fragments[0] <= raw.index("<parameter=n>")
        return
    assert len([f for f in fragments if f < raw.index("nested")]) >= 5  # long before the end


@pytest.mark.parametrize(
    ("family", "raw", "text", "calls", "named"),
    STREAMED + [(f, r, t, c, "") for f, r, t, c in FIXTURES],
)
def test_cut_anywhere_calls_end_as_valid_json(
    family: str, raw: str, text: str, calls: list, named: str
) -> None:
    """A stream that stops mid-call (max_tokens) still ends every started call with an object."""
    for cut in range(len(raw) + 1):
        got_text, events = trace(family, [raw[:cut]])
        got = check_calls(events)
        assert all(isinstance(json.loads(a), dict) for _, a in got), raw[:cut]
        if not got:
            assert got_text.strip() == raw[:cut].strip() or family == "deepseek"


W_RAW = '{"city": "Paris", "unit": "°C"}'
MALFORMED = [
    # text after a call's whole object, inside its block: the call stands, the text is dropped
    (
        "hermes",
        '<tool_call>{"name": "f", "arguments": {"a": 1}} trailing words</tool_call>',
        "",
        [("f", {"a": 1})],
    ),
    # raw control characters in strings (models write them) are escaped on the way through
    (
        "hermes",
        '<tool_call>{"name": "f", "arguments": {"a": "x\ny\tz"}}</tool_call>',
        "",
        [("f", {"a": "x\ny\tz"})],
    ),
    # arguments that are not an object
    ("hermes", '<tool_call>{"name": "f", "arguments": "not json"}</tool_call>', "", [("f", {})]),
    ("hermes", '<tool_call>{"name": "f", "arguments": null}</tool_call>', "", [("f", {})]),
    ("hermes", '<tool_call>{"name": "f"}</tool_call>', "", [("f", {})]),
    # no call started yet: the block is text, as it was written
    (
        "hermes",
        '<tool_call>{"arguments": {"a": 1}}</tool_call> ok',
        '<tool_call>{"arguments": {"a": 1}}</tool_call> ok',
        [],
    ),
    ("hermes", '<tool_call>{"name": 5}</tool_call>', '<tool_call>{"name": 5}</tool_call>', []),
    ("hermes", "<tool_call></tool_call>", "<tool_call></tool_call>", []),
    ("hermes", '<tool_call>{"na', '<tool_call>{"na', []),
    (
        "hermes",
        f'<tool_call>oops <tool_call>{{"name": "f", "arguments": {W_RAW}}}</tool_call>',
        "<tool_call>oops ",
        [("f", json.loads(W_RAW))],
    ),
    (
        "llama3",
        '{"answer": 42} is the JSON you asked for',
        '{"answer": 42} is the JSON you asked for',
        [],
    ),
    ("mistral", "[TOOL_CALLS] sorry, no", "[TOOL_CALLS] sorry, no", []),
    (
        "harmony",
        "<|channel|>commentary to=functions.f <|message|",
        "<|channel|>commentary to=functions.f <|message|",
        [],
    ),
    # formats without an end marker: after the calls, the stream is text again
    (
        "mistral",
        f'[TOOL_CALLS][{{"name": "f", "arguments": {W_RAW}}}] Done.',
        " Done.",
        [("f", json.loads(W_RAW))],
    ),
    (
        "llama3",
        f'{{"name": "f", "parameters": {W_RAW}}}\nDone.',
        "\nDone.",
        [("f", json.loads(W_RAW))],
    ),
]


@pytest.mark.parametrize(("family", "raw", "text", "calls"), MALFORMED)
@pytest.mark.parametrize("step", [1, 4, 10_000])
def test_malformed_blocks(family: str, raw: str, text: str, calls: list, step: int) -> None:
    got_text, events = trace(family, [raw[i : i + step] for i in range(0, len(raw), step)])
    assert got_text == text
    assert [(n, json.loads(a)) for n, a in check_calls(events)] == calls


def content_and_calls(family: str, pieces: list[str], max_calls: int | None) -> tuple:
    p = ToolCallParser(family, max_calls=max_calls)
    content, names, args = "", [], {}
    for ev in [*(p.feed(x) for x in pieces), p.flush()]:
        content += ev.text
        names += [c.name for c in ev.started]
        for i, frag in ev.arguments:
            args[i] = args.get(i, "") + frag
    return content, [(n, json.loads(args[i])) for i, n in enumerate(names)], p


@pytest.mark.parametrize(
    ("family", "raw", "calls"),
    [(f, r, c) for f, r, _, c, _ in STREAMED] + [(f, r, c) for f, r, _, c in FIXTURES if c],
)
def test_max_calls_stops_after_the_last_allowed_call(family: str, raw: str, calls: list) -> None:
    """With max_calls=1 only the first call comes out, whole, at every split; the content (text
    before the first call) is the same as without a limit."""
    want = [(n, a if isinstance(a, dict) else json.loads(a)) for n, a in calls][:1]
    for pieces in [[raw[:cut], raw[cut:]] for cut in range(len(raw) + 1)] + [list(raw)]:
        content, got, p = content_and_calls(family, pieces, 1)
        assert got == want and p.exhausted and p.closed == 1
        assert content == content_and_calls(family, pieces, None)[0]


@pytest.mark.parametrize(
    "params",
    [
        {"anyOf": [{"type": "object", "properties": {"a": {"type": "string"}}}]},
        {"oneOf": [{"type": "object", "properties": {"a": {"type": "string"}}}]},
        {"allOf": [{"$ref": "#/$defs/A"}], "$defs": {"A": {"type": "object"}}},
        {"$ref": "#/$defs/A", "$defs": {"A": {"type": "object"}}},
        {"type": "object", "additionalProperties": {"type": "integer"}},
    ],
)
def test_a_forced_call_keeps_a_schema_without_root_properties(params: dict) -> None:
    _, spec = tool_call_constraint([Tool("f", "", params)], parallel=False)
    args = json.loads(spec)["schema"]["properties"]["arguments"]
    assert args != {"type": "object", "properties": {}, "additionalProperties": False}
    assert set(args) == set(params)


@pytest.mark.parametrize("params", [{}, {"type": "object"}, {"type": "object", "properties": {}}])
def test_a_tool_without_parameters_is_called_with_an_empty_object(params: dict) -> None:
    _, spec = tool_call_constraint([Tool("f", "", params)], parallel=False)
    args = json.loads(spec)["schema"]["properties"]["arguments"]
    assert args == {"type": "object", "properties": {}, "additionalProperties": False}
