"""The OpenAI adapter on recorded delta sequences: no model, no server. The deltas are what the
core produces for a generation (text, think text, tool-call fragments split anywhere, the final
delta with usage), and the assertions are on the exact wire objects."""

from __future__ import annotations

import json

import pytest

from app.core.inference.generation import Completion
from app.core.requests import ChatRequest, CompletionRequest
from app.core.types import ChatMessage, Delta, TokenLogprob, ToolCallDelta, Usage
from app.errors import GenerationTimeout, InvalidRequest
from app.server.protocols.base import Context
from app.server.protocols.openai.fields import StreamOptions
from app.server.protocols.openai.parse import parse_chat
from app.server.protocols.openai.render import ChatStream, CompletionStream, chat_response

CTX = Context("smol", created=1700000000, id="abc")
REQ = ChatRequest("smol", (ChatMessage("user", "hi"),))
FINAL = Delta(finish_reason="stop", usage=Usage(prompt_tokens=7, completion_tokens=3))


def _chunks(renderer: ChatStream, deltas: list[Delta]) -> list[object]:
    frames = list(renderer.open())
    for d in deltas:
        if d.finish_reason is None:
            frames += renderer.delta(0, d)
        else:
            if d.text or d.tool_calls or d.reasoning:
                frames += renderer.delta(0, d)
            frames += renderer.end_choice(0, d)
    frames += renderer.close([deltas[-1]])
    return [f.data for f in frames]


def test_text_stream_is_role_then_content_then_finish_then_usage_then_done() -> None:
    r = ChatStream(REQ, StreamOptions(True, True), CTX)
    out = _chunks(r, [Delta(text="Hel"), Delta(text="lo"), FINAL])
    assert out[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [c["choices"][0]["delta"].get("content") for c in out[1:3]] == ["Hel", "lo"]
    assert out[3]["choices"][0] == {
        "index": 0,
        "delta": {},
        "logprobs": None,
        "finish_reason": "stop",
    }
    assert all(c["usage"] is None for c in out[:4]), "include_usage: null until the last chunk"
    assert out[4]["choices"] == [] and out[4]["usage"]["total_tokens"] == 10
    assert out[5] == "[DONE]"
    assert {c["id"] for c in out[:5]} == {"chatcmpl-abc"}


@pytest.mark.parametrize("cut", range(1, 16))
def test_tool_call_fragments_split_anywhere_join_to_the_arguments(cut: int) -> None:
    args = '{"city": "Paris"}'
    deltas = [
        Delta(tool_calls=(ToolCallDelta(0, "call_1", "get_weather"),)),
        Delta(tool_calls=(ToolCallDelta(0, arguments=args[:cut]),)),
        Delta(tool_calls=(ToolCallDelta(0, arguments=args[cut:]),)),
        Delta(finish_reason="tool_calls", usage=Usage(5, 9)),
    ]
    out = _chunks(ChatStream(REQ, StreamOptions(True, False), CTX), deltas)
    calls = [
        tc for c in out[:-1] for ch in c["choices"] for tc in ch["delta"].get("tool_calls", [])
    ]
    assert calls[0] == {
        "index": 0,
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": ""},
    }
    assert all(set(c) == {"index", "function"} for c in calls[1:])
    assert json.loads("".join(c["function"]["arguments"] for c in calls[1:])) == {"city": "Paris"}
    assert out[-2]["choices"][0]["finish_reason"] == "tool_calls" and out[-1] == "[DONE]"
    assert not any(ch["delta"].get("content") for c in out[1:-1] for ch in c["choices"])


def test_reasoning_goes_out_as_reasoning_content_and_optionally_reasoning() -> None:
    both = Context("smol", reasoning_also=True)
    out = _chunks(
        ChatStream(REQ, StreamOptions(True, False), both),
        [Delta(reasoning="hmm"), Delta(text="ok"), FINAL],
    )
    assert out[1]["choices"][0]["delta"] == {"reasoning_content": "hmm", "reasoning": "hmm"}
    res = Completion(text="ok", reasoning="hmm", final=FINAL)
    msg = chat_response(REQ, [res], CTX)["choices"][0]["message"]
    assert msg["reasoning_content"] == "hmm" and "reasoning" not in msg


def test_an_error_mid_stream_is_one_error_event_and_no_done() -> None:
    r = ChatStream(REQ, StreamOptions(True, True), CTX)
    frames = [*r.open(), *r.delta(0, Delta(text="par")), *r.error(GenerationTimeout("late"))]
    data = [f.data for f in frames]
    assert data[-1] == {
        "error": {"message": "late", "type": "server_error", "param": None, "code": "timeout"}
    }
    assert "[DONE]" not in data


def test_whole_answer_with_only_tool_calls_has_null_content() -> None:
    from app.core.types import ToolCall

    res = Completion(
        text="\n",
        tool_calls=[ToolCall("call_1", "f", "{}")],
        final=Delta(finish_reason="tool_calls", usage=Usage(2, 3)),
    )
    body = chat_response(REQ, [res], CTX)
    msg = body["choices"][0]["message"]
    assert msg["content"] is None
    assert msg["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    ]
    assert (
        body["usage"]["total_tokens"] == 5 and body["choices"][0]["finish_reason"] == "tool_calls"
    )


def test_completion_logprob_offsets_run_on_across_deltas() -> None:
    req = CompletionRequest("smol", ("x",), logprobs=0)
    r = CompletionStream(req, StreamOptions(True, False), CTX)
    lp = lambda t: TokenLogprob(t, -0.5, tuple(t.encode()))  # noqa: E731
    a = r.delta(0, Delta(text="ab", logprobs=(lp("a"), lp("b"))))[0].data
    b = r.delta(0, Delta(text="c", logprobs=(lp("c"),)))[0].data
    assert a["choices"][0]["logprobs"]["text_offset"] == [0, 1]
    assert b["choices"][0]["logprobs"]["text_offset"] == [2]


def test_parse_chat_maps_openai_names_onto_the_request() -> None:
    p = parse_chat(
        {
            "model": "m",
            "messages": [
                {"role": "developer", "content": "be brief"},
                {"role": "user", "content": "x"},
            ],
            "max_completion_tokens": 5,
            "stop": "END",
            "n": 2,
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": {"type": "function", "function": {"name": "f"}},
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    r = p.request
    assert r.messages[0].role == "system" and r.max_tokens == 5 and r.stop == ("END",)
    assert r.n == 2 and r.tool_choice.mode == "named" and r.tool_choice.name == "f"
    assert not r.tool_choice.parallel, "a named choice is exactly one call"
    assert p.stream.stream and p.stream.include_usage
    with pytest.raises(InvalidRequest) as ei:
        parse_chat(
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "stop": ["s"] * 17}
        )
    assert ei.value.param == "stop"
    with pytest.raises(InvalidRequest) as ei:
        parse_chat(
            {
                "model": "m",
                "messages": [{"role": "user", "content": "x"}],
                "tools": [{"type": "function", "function": {"name": "f"}}],
                "tool_choice": {"type": "function", "function": {"name": "g"}},
            }
        )
    assert ei.value.param == "tool_choice"


def test_priority_is_vllms_integer_on_chat_and_completions() -> None:
    """``priority``: lower is served first, default 0, any integer within int32's range; it
    reaches the request (the worker orders its queue by it)."""
    from app.server.protocols.openai.parse import parse_completion

    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert parse_chat(chat).request.priority == 0
    assert parse_chat({**chat, "priority": -5}).request.priority == -5
    done = parse_completion({"model": "m", "prompt": "def f(", "priority": 3})
    assert done.request.priority == 3
    for bad in ("high", 1.5, True, 1 << 31):
        with pytest.raises(InvalidRequest) as ei:
            parse_chat({**chat, "priority": bad})
        assert ei.value.param == "priority"
