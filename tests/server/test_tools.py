"""Tool calling on the real server and model: forced calls are always valid; deltas per contract."""

from __future__ import annotations

import json

import openai
import pytest

from tests.conftest import Served

pytestmark = pytest.mark.model

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The time now", "parameters": {}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def client(s: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=s.base_url, api_key="x", max_retries=0, timeout=120)


def test_required_gives_a_valid_call(served: Served) -> None:
    r = client(served).chat.completions.create(model=served.model_id, messages=ASK, tools=[WEATHER, TIME],
                                               tool_choice="required", max_tokens=80, temperature=0,
                                               parallel_tool_calls=False)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls"
    assert ch.message.content is None
    (call,) = ch.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name in ("get_weather", "get_time")
    assert isinstance(json.loads(call.function.arguments), dict)


def test_named_function_and_streamed_deltas(served: Served) -> None:
    c = client(served)
    chunks = list(c.chat.completions.create(
        model=served.model_id, messages=ASK, tools=[WEATHER, TIME], max_tokens=80, temperature=0, stream=True,
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, parallel_tool_calls=False,
    ))
    deltas = [tc for ch in chunks for tc in (ch.choices[0].delta.tool_calls or [])]
    first, rest = deltas[0], deltas[1:]
    assert first.index == 0 and first.id and first.type == "function"
    assert first.function.name == "get_weather" and first.function.arguments == ""
    assert rest and all(d.id is None and d.function.name is None and d.index == 0 for d in rest)
    assert isinstance(json.loads("".join(d.function.arguments for d in rest)), dict)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert chunks[0].choices[0].delta.role == "assistant"


def test_history_with_tool_results_and_none(served: Served) -> None:
    c = client(served)
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 18, "sky": "cloudy"}'},
    ]
    r = c.chat.completions.create(model=served.model_id, messages=history, tools=[WEATHER], tool_choice="none",
                                  max_tokens=30, temperature=0)
    assert r.choices[0].message.tool_calls is None and r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools[0]"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
    ],
)
def test_bad_tools_400(served: Served, extra: dict, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as ei:
        client(served).chat.completions.create(model=served.model_id, messages=ASK, max_tokens=5, **extra)
    assert ei.value.body["param"] == param


def test_langchain_bind_tools(served: Served) -> None:
    lc = pytest.importorskip("langchain_openai", reason="langchain-openai is part of the dev extra")
    from langchain_core.tools import tool

    @tool
    def get_weather(city: str) -> str:
        """Current weather for a city."""
        return "sunny"

    llm = lc.ChatOpenAI(base_url=served.base_url, api_key="x", model=served.model_id, temperature=0,
                        max_tokens=80, max_retries=0)
    msg = llm.bind_tools([get_weather], tool_choice="get_weather").invoke("Weather in Paris?")
    assert msg.tool_calls and msg.tool_calls[0]["name"] == "get_weather"
    assert isinstance(msg.tool_calls[0]["args"], dict)
