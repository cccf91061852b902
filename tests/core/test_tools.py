"""Tool-call parsing on raw outputs in each family's documented format, split everywhere."""

from __future__ import annotations

import json

import pytest

from app.core.tools import Tool, ToolCallParser, detect_family, tool_call_constraint

W = '{"city": "Paris", "unit": "°C"}'
FIXTURES = [
    ("hermes", f'Let me check.<tool_call>\n{{"name": "get_weather", "arguments": {W}}}\n</tool_call>',
     "Let me check.", [("get_weather", W)]),
    ("hermes", f'<tool_call>{{"name": "a", "arguments": {{}}}}</tool_call>\n<tool_call>{{"name": "b", "arguments": {W}}}</tool_call>',
     "\n", [("a", "{}"), ("b", W)]),
    ("llama3", f'{{"name": "get_weather", "parameters": {W}}}', "", [("get_weather", W)]),
    ("llama3", '<|python_tag|>brave_search.call(query="paris weather")', "",
     [("brave_search.call", '{"query": "paris weather"}')]),
    ("mistral", f'[TOOL_CALLS][{{"name": "get_weather", "arguments": {W}}}]', "", [("get_weather", W)]),
    ("qwen3coder", "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
     "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>", "", [("get_weather", '{"city": "Paris", "days": 3}')]),
    ("harmony", f"<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{W}<|call|>", "",
     [("get_weather", W)]),
    ("deepseek", f"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{W}\n```"
     "<｜tool▁call▁end｜><｜tool▁calls▁end｜>", "<｜tool▁calls▁begin｜><｜tool▁calls▁end｜>", [("get_weather", W)]),
    ("hermes", "No tools needed: 2 < 3 and <tool is not a tag.", "No tools needed: 2 < 3 and <tool is not a tag.", []),
    ("hermes", "<tool_call>not json</tool_call>", "<tool_call>not json</tool_call>", []),
]


def run(family: str, text: str, step: int) -> tuple[str, list[tuple[str, str]], list[str]]:
    p = ToolCallParser(family)
    out, names, args, ids = [], {}, {}, []
    for i in range(0, len(text), step):
        ev = p.feed(text[i : i + step])
        out.append(ev.text)
        for c in ev.started:
            names[c.index] = c.name
            ids.append(c.id)
        for idx, frag in ev.arguments:
            args[idx] = args.get(idx, "") + frag
    ev = p.flush()
    out.append(ev.text)
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
    [("{{ '<tool_call>' }}", "hermes"), ("<|python_tag|>{{ x }}", "llama3"), ("[TOOL_CALLS]", "mistral"),
     ("<function=x><parameter=y>", "qwen3coder"), ("<|channel|>", "harmony"), ("<｜tool▁call▁begin｜>", "deepseek"),
     (None, "hermes")],
)
def test_detect_family(template: str | None, family: str) -> None:
    assert detect_family(template) == family


def test_forced_call_schema_has_one_alternative_per_tool() -> None:
    params = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    kind, spec = tool_call_constraint([Tool("get_weather", "", params), Tool("now", "", {})], parallel=True)
    spec = json.loads(spec)
    assert kind == "tool_call" and spec["parallel"] is True
    alts = spec["schema"]["oneOf"]
    assert [a["properties"]["name"]["const"] for a in alts] == ["get_weather", "now"]
    assert alts[0]["properties"]["arguments"] == params
    assert alts[1]["properties"]["arguments"]["additionalProperties"] is False
