"""Tool calling on the real server and model: forced calls are always valid; deltas per contract."""

from __future__ import annotations

import json

import anthropic
import openai
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from app.core.inference.generation import Choices, Generation
from app.core.inference.tools import ToolCallParser
from app.core.requests import ChatRequest
from app.core.types import Delta, Usage
from app.server.app import STATE, ServerState
from app.server.protocols.anthropic.render import MessageStream, message_response
from app.server.protocols.base import Context
from app.server.streaming import respond
from app.settings import ServerSettings
from tests.conftest import Served

pytestmark = pytest.mark.model

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {"name": "get_time", "description": "The time now", "parameters": {}},
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def client(s: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=s.base_url, api_key="x", max_retries=0, timeout=120)


def test_required_gives_a_valid_call(served: Served) -> None:
    r = client(served).chat.completions.create(
        model=served.model_id,
        messages=ASK,
        tools=[WEATHER, TIME],
        tool_choice="required",
        max_tokens=80,
        temperature=0,
        parallel_tool_calls=False,
    )
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls"
    assert ch.message.content is None
    (call,) = ch.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name in ("get_weather", "get_time")
    assert isinstance(json.loads(call.function.arguments), dict)


def test_named_function_and_streamed_deltas(served: Served) -> None:
    c = client(served)
    chunks = list(
        c.chat.completions.create(
            model=served.model_id,
            messages=ASK,
            tools=[WEATHER, TIME],
            max_tokens=80,
            temperature=0,
            stream=True,
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            parallel_tool_calls=False,
        )
    )
    deltas = [tc for ch in chunks for tc in (ch.choices[0].delta.tool_calls or [])]
    first, rest = deltas[0], deltas[1:]
    assert first.index == 0 and first.id and first.type == "function"
    assert first.function.name == "get_weather" and first.function.arguments == ""
    assert len(rest) >= 3 and all(
        d.id is None and d.function.name is None and d.index == 0 for d in rest
    )
    assert isinstance(json.loads("".join(d.function.arguments for d in rest)), dict)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert chunks[0].choices[0].delta.role == "assistant"


NAMED = {"type": "function", "function": {"name": "get_weather"}}


def test_named_choice_is_exactly_one_call_then_the_end(served: Served) -> None:
    """parallel_tool_calls left at its default (true): SmolLM2 used to write a second call (and
    a third, cut by max_tokens) with content deltas "\n" between, ending on "length"."""
    c = client(served)
    ask = {"model": served.model_id, "messages": ASK, "tools": [WEATHER, TIME], "max_tokens": 80}
    chunks = list(
        c.chat.completions.create(
            **ask,
            temperature=0,
            tool_choice=NAMED,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    choices = [ch.choices[0] for ch in chunks if ch.choices]
    assert [ch.delta.content for ch in choices if ch.delta.content] == []
    deltas = [tc for ch in choices for tc in ch.delta.tool_calls or []]
    assert {d.index for d in deltas} == {0}
    assert [d.function.name for d in deltas if d.id] == ["get_weather"]
    args = json.loads("".join(d.function.arguments or "" for d in deltas))
    assert isinstance(args, dict)
    assert [ch.finish_reason for ch in choices if ch.finish_reason] == ["tool_calls"]
    assert choices[-1].finish_reason == "tool_calls"
    usage = chunks[-1].usage
    assert usage is not None and 0 < usage.completion_tokens < 80

    r = c.chat.completions.create(**ask, temperature=0, tool_choice=NAMED)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls" and ch.message.content is None
    (call,) = ch.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == args
    assert r.usage is not None and 0 < r.usage.completion_tokens < 80


NOTE_PARAMS = {
    "type": "object",
    "properties": {"title": {"type": "string"}, "body": {"type": "string"}},
    "required": ["title", "body"],
}
NOTE_ASK = [
    {"role": "user", "content": "Save a note about the history of Paris, with a long body."}
]


def assert_streamed_in_pieces(parts: list[str]) -> None:
    """One fragment per few tokens, not one blob at the end, whatever the model wrote.

    Even ``{"title": "", "body": ""}`` comes as four pieces (brace, each member, brace); no
    piece holds most of the arguments.
    """
    whole = "".join(parts)
    assert len(parts) >= 4, parts
    assert max(len(p) for p in parts) <= len(whole) // 2, parts


def test_arguments_stream_token_by_token_and_stay_valid_when_cut(served: Served) -> None:
    """Arguments arrive as the model writes them; max_tokens cuts the call, which still parses."""
    note = {
        "type": "function",
        "function": {"name": "save_note", "description": "Save a note", "parameters": NOTE_PARAMS},
    }
    chunks = list(
        client(served).chat.completions.create(
            model=served.model_id,
            messages=NOTE_ASK,
            tools=[note],
            tool_choice="required",
            parallel_tool_calls=False,
            max_tokens=40,
            temperature=0,
            stream=True,
        )
    )
    pieces = [
        tc.function.arguments
        for ch in chunks
        for tc in (ch.choices[0].delta.tool_calls or [])
        if tc.function.arguments
    ]
    assert_streamed_in_pieces(pieces)
    args = "".join(pieces)
    assert isinstance(json.loads(args), dict)

    a = anthropic.Anthropic(base_url=served.root, api_key="x", max_retries=0, timeout=120)
    tools = [{"name": "save_note", "description": "Save a note", "input_schema": NOTE_PARAMS}]
    with a.messages.stream(
        model=served.model_id,
        max_tokens=40,
        extra_body={"temperature": 0},  # this SDK no longer takes sampling parameters
        messages=NOTE_ASK,
        tools=tools,
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
    ) as stream:
        parts = [
            e.delta.partial_json
            for e in stream
            if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
        ]
        final = stream.get_final_message()
    assert_streamed_in_pieces(parts)
    (use,) = [b for b in final.content if b.type == "tool_use"]
    assert use.name == "save_note" and use.input == json.loads("".join(parts))


def test_history_with_tool_results_and_none(served: Served) -> None:
    c = client(served)
    history = ASK + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 18, "sky": "cloudy"}'},
    ]
    r = c.chat.completions.create(
        model=served.model_id,
        messages=history,
        tools=[WEATHER],
        tool_choice="none",
        max_tokens=30,
        temperature=0,
    )
    assert r.choices[0].message.tool_calls is None and r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools[0]"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
    ],
)
def test_bad_tools_400(served: Served, extra: dict, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as ei:
        client(served).chat.completions.create(
            model=served.model_id, messages=ASK, max_tokens=5, **extra
        )
    assert ei.value.body["param"] == param


def test_langchain_bind_tools(served: Served) -> None:
    lc = pytest.importorskip("langchain_openai", reason="langchain-openai is part of the dev extra")
    from langchain_core.tools import tool

    @tool
    def get_weather(city: str) -> str:
        """Current weather for a city."""
        return "sunny"

    llm = lc.ChatOpenAI(
        base_url=served.base_url,
        api_key="x",
        model=served.model_id,
        temperature=0,
        max_tokens=80,
        max_retries=0,
    )
    msg = llm.bind_tools([get_weather], tool_choice="get_weather").invoke("Weather in Paris?")
    assert msg.tool_calls and msg.tool_calls[0]["name"] == "get_weather"
    assert isinstance(msg.tool_calls[0]["args"], dict)


class _Pieces:
    """A model's output in set pieces: the real parser and Generation run on it, no model needed."""

    def __init__(self, pieces: list[str]) -> None:
        self.pieces = pieces

    async def __aiter__(self):  # type: ignore[no-untyped-def]
        for p in self.pieces:
            yield Delta(text=p, token_count=1)
        yield Delta(
            finish_reason="stop", usage=Usage(prompt_tokens=3, completion_tokens=len(self.pieces))
        )

    def cancel(self) -> None:
        pass


async def test_anthropic_stream_keeps_blocks_in_order() -> None:
    """One delta can carry text and start a call, or end a call and start the next: every block
    still gets its deltas while it is the open one. Text after a call is not content."""
    pieces = [
        'Let me check.<tool_call>{"name": "a", "arguments": {"x": [1, ',
        '2]}}</tool_call>\nNow b.<tool_call>{"name": "b", "arguments": {"y"',
        ': "z"}}</tool_call>',
    ]

    async def handler(request: web.Request) -> web.StreamResponse:
        gen = Generation("m", 3, _Pieces(pieces), tools=ToolCallParser("hermes"))
        req, ctx = ChatRequest("m", ()), Context("m")
        return await respond(
            request,
            Choices([gen]),
            stream=True,
            model="m",
            whole=lambda results: message_response(req, results, ctx),
            renderer=lambda: MessageStream(req, ctx, gen.prompt_tokens),
        )

    app = web.Application()
    app[STATE] = ServerState(ServerSettings(), (), "127.0.0.1")
    app.router.add_post("/v1/messages", handler)
    async with TestServer(app) as server:
        a = anthropic.AsyncAnthropic(base_url=str(server.make_url("")), api_key="x", max_retries=0)
        async with a.messages.stream(
            model="m", max_tokens=9, messages=[{"role": "user", "content": "?"}]
        ) as s:
            events = [e async for e in s]
            final = await s.get_final_message()
    open_block = None
    for e in events:
        if e.type == "content_block_start":
            assert open_block is None
            open_block = e.index
        elif e.type == "content_block_delta":
            assert e.index == open_block
        elif e.type == "content_block_stop":
            assert e.index == open_block
            open_block = None
    assert [(b.type, b.text if b.type == "text" else (b.name, b.input)) for b in final.content] == [
        ("text", "Let me check."),
        ("tool_use", ("a", {"x": [1, 2]})),
        ("tool_use", ("b", {"y": "z"})),
    ]
    assert final.stop_reason == "tool_use"
