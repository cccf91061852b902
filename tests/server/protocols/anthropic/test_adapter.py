"""The Anthropic Messages adapter on recorded deltas: exact events, thinking blocks, tool calls
split at every point, errors mid-stream and cut streams, usage, and the request bounds."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.core.requests import ChatRequest
from app.core.types import Delta, ToolCallDelta, Usage
from app.errors import GenerationTimeout, InvalidRequest
from app.server.protocols.anthropic.parse import parse_request
from app.server.protocols.anthropic.render import MessageStream, message_response
from app.server.protocols.base import Context
from app.server.streaming import StreamBroken

from ..replay import completion, deltas, events, render

REQ = ChatRequest("m", ())
THINK_TOOL = (
    'Hmm, 2+2.</think>\n\nIt is 4.<tool_call>{"name": "add", "arguments": {"a": [2, 2]}}'
    "</tool_call>"
)


def ctx() -> Context:
    return Context("m", id="ID")


def stream(ds: list[Delta], **kw: Any) -> list[tuple[str | None, Any]]:
    return events(render(MessageStream(REQ, ctx(), 7), ds, **kw))


def test_thinking_text_and_a_tool_call_exact_events() -> None:
    ds = [
        Delta(reasoning="Let me"),
        Delta(reasoning=" think."),
        Delta(text="Sure."),
        Delta(tool_calls=(ToolCallDelta(0, "call_1", "add"),)),
        Delta(tool_calls=(ToolCallDelta(0, arguments='{"a":'),)),
        Delta(tool_calls=(ToolCallDelta(0, arguments=" 1}"),)),
        Delta(finish_reason="tool_calls", usage=Usage(7, 6)),
    ]

    def block(kind: str, index: int, **data: Any) -> tuple[str, Any]:
        return kind, {"type": kind, "index": index, **data}

    def delta(index: int, **d: Any) -> tuple[str, Any]:
        return block("content_block_delta", index, delta=d)

    assert stream(ds) == [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_ID",
                    "type": "message",
                    "role": "assistant",
                    "model": "m",
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {"input_tokens": 7, "output_tokens": 0},
                },
            },
        ),
        ("ping", {"type": "ping"}),
        block(
            "content_block_start",
            0,
            content_block={"type": "thinking", "thinking": "", "signature": ""},
        ),
        delta(0, type="thinking_delta", thinking="Let me"),
        delta(0, type="thinking_delta", thinking=" think."),
        delta(0, type="signature_delta", signature=""),
        block("content_block_stop", 0),
        block("content_block_start", 1, content_block={"type": "text", "text": ""}),
        delta(1, type="text_delta", text="Sure."),
        block("content_block_stop", 1),
        block(
            "content_block_start",
            2,
            content_block={"type": "tool_use", "id": "toolu_1", "name": "add", "input": {}},
        ),
        delta(2, type="input_json_delta", partial_json='{"a":'),
        delta(2, type="input_json_delta", partial_json=" 1}"),
        block("content_block_stop", 2),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                "usage": {"output_tokens": 6},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    whole = message_response(REQ, [completion(ds)], ctx())
    assert whole["content"] == [
        {"type": "thinking", "thinking": "Let me think.", "signature": ""},
        {"type": "text", "text": "Sure."},
        {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 1}},
    ]
    assert whole["stop_reason"] == "tool_use"
    assert whole["usage"] == {"input_tokens": 7, "output_tokens": 6}


def _fold(evs: list[tuple[str | None, Any]]) -> list[dict[str, Any]]:
    """The blocks a client assembles, checking that each delta goes to the one open block."""
    blocks: list[dict[str, Any]] = []
    open_index = None
    for kind, data in evs:
        if kind == "content_block_start":
            assert open_index is None and data["index"] == len(blocks)
            open_index = data["index"]
            blocks.append(dict(data["content_block"], partial=""))
        elif kind == "content_block_delta":
            assert data["index"] == open_index
            b, d = blocks[open_index], data["delta"]
            if d["type"] == "thinking_delta":
                b["thinking"] += d["thinking"]
            elif d["type"] == "text_delta":
                b["text"] += d["text"]
            elif d["type"] == "input_json_delta":
                b["partial"] += d["partial_json"]
            else:
                assert d == {"type": "signature_delta", "signature": ""}
        elif kind == "content_block_stop":
            assert data["index"] == open_index
            open_index = None
    assert open_index is None
    for b in blocks:
        partial = b.pop("partial")
        if b["type"] == "tool_use":
            b["input"] = json.loads(partial)
    return blocks


@pytest.mark.parametrize("k", range(1, len(THINK_TOOL)))
def test_split_at_every_point_gives_the_whole_answer(k: int) -> None:
    for pieces in ([THINK_TOOL[:k], THINK_TOOL[k:]], list(THINK_TOOL[:k]) + [THINK_TOOL[k:]]):
        ds = deltas(pieces, think=True, tools=True)
        evs = stream(ds)
        blocks = _fold(evs)
        assert [b["type"] for b in blocks] == ["thinking", "text", "tool_use"], pieces
        assert blocks[0]["thinking"] == "Hmm, 2+2." and blocks[1]["text"] == "It is 4."
        assert blocks[2]["name"] == "add" and blocks[2]["input"] == {"a": [2, 2]}
        assert evs[-2][1]["delta"]["stop_reason"] == "tool_use"
        whole = message_response(REQ, [completion(ds)], ctx())
        assert [b.get("thinking") or b.get("text") or b.get("input") for b in whole["content"]] == [
            "Hmm, 2+2.",
            "It is 4.",
            {"a": [2, 2]},
        ]


def test_an_error_mid_stream_is_the_last_event() -> None:
    ds = [Delta(reasoning="Hmm"), Delta(text="It is")]
    err = GenerationTimeout("the request ran over the server's time limit (2s)")
    evs = stream(ds, error=err)
    assert evs[-1] == (
        "error",
        {"type": "error", "error": {"type": "timeout_error", "message": err.message}},
    )
    kinds = [k for k, _ in evs]
    assert "message_stop" not in kinds and "message_delta" not in kinds
    assert kinds.count("content_block_stop") == 1  # the thinking block; the text block is cut


def test_a_cut_stream_ends_with_an_api_error() -> None:
    # the generation ended without a final delta: respond() raises StreamBroken
    evs = stream([Delta(text="It is")], error=StreamBroken("the generation ended without a result"))
    assert evs[-1][0] == "error" and evs[-1][1]["error"]["type"] == "api_error"
    assert all(k != "message_stop" for k, _ in evs)


def test_an_empty_answer_still_has_one_text_block_and_usage() -> None:
    evs = stream([Delta(finish_reason="length", usage=Usage(7, 0))])
    assert [k for k, _ in evs] == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert evs[4][1]["delta"]["stop_reason"] == "max_tokens"


def test_stop_sequence_named() -> None:
    req = ChatRequest("m", (), stop=(" end",))
    final = Delta(finish_reason="stop", stop_string=" end", usage=Usage(7, 2))
    r = message_response(req, [completion([Delta(text="a b"), final])], ctx())
    assert (r["stop_reason"], r["stop_sequence"]) == ("stop_sequence", " end")
    assert not any(b["type"] == "thinking" for b in r["content"])


def _body(**kw: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], **kw}


SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}}}


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"stop_sequences": ["s"] * 17}, "stop_sequences"),
        ({"stop_sequences": ["s" * 1025]}, "stop_sequences"),
        ({"stop_sequences": [1]}, "stop_sequences"),
        ({"tools": [{"name": f"t{i}", "input_schema": SCHEMA} for i in range(129)]}, "tools"),
        ({"tools": [{"name": "bad name!", "input_schema": SCHEMA}]}, "tools[0]"),
        ({"tools": [{"name": "t", "description": 3}]}, "tools[0]"),
        (
            {"tools": [{"name": "t", "input_schema": {"type": "object", "x": "y" * 70_000}}]},
            "tools[0].input_schema",
        ),
        ({"tools": [{"name": "t"}], "tool_choice": {"type": "tool", "name": "u"}}, "tool_choice"),
        ({"tool_choice": {"type": "any"}}, "tool_choice"),
        ({"tool_choice": {"type": "auto", "disable_parallel_tool_use": "yes"}}, None),
    ],
)
def test_bounds_shared_with_chat_completions(extra: dict[str, Any], param: str | None) -> None:
    with pytest.raises(InvalidRequest) as ei:
        parse_request(_body(**extra))
    if param is not None:
        assert ei.value.param == param


def test_tool_choice_mapping() -> None:
    tools = [{"name": "a", "input_schema": SCHEMA}, {"name": "b"}]
    cases = {
        "auto": ("auto", True),
        "any": ("required", True),
        "none": ("none", True),
    }
    for kind, (mode, parallel) in cases.items():
        tc = parse_request(_body(tools=tools, tool_choice={"type": kind})).request.tool_choice
        assert (tc.mode, tc.parallel) == (mode, parallel)
    tc = parse_request(
        _body(tools=tools, tool_choice={"type": "any", "disable_parallel_tool_use": True})
    ).request.tool_choice
    assert (tc.mode, tc.parallel) == ("required", False)
    tc = parse_request(
        _body(tools=tools, tool_choice={"type": "tool", "name": "b"})
    ).request.tool_choice
    assert (tc.mode, tc.name) == ("named", "b")
    assert parse_request(_body()).request.tool_choice.mode == "none"


def test_claude_code_s_request_shape_parses() -> None:
    """The shape Claude Code 2.1 sends (seen against a real server): a system message inside
    ``messages`` after the first turn, system blocks with cache_control, adaptive thinking,
    context_management, output_config and metadata.user_id. Refusing the system message (the
    old rule: user or assistant only) made every Claude Code request a 400."""
    body = _body(
        system=[
            {"type": "text", "text": "billing header"},
            {"type": "text", "text": "You are an agent.", "cache_control": {"type": "ephemeral"}},
        ],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "<system-reminder>ctx"}]},
            {"role": "system", "content": "Available agent types: claude, Explore"},
            {"role": "user", "content": [{"type": "text", "text": "Say hi"}]},
        ],
        tools=[{"name": "Bash", "input_schema": SCHEMA}],
        thinking={"type": "adaptive"},
        context_management={"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        output_config={"effort": "high"},
        metadata={"user_id": '{"device_id":"d","session_id":"s"}'},
        max_tokens=32000,
        stream=True,
    )
    msgs = parse_request(body).request.messages
    assert [(m.role, m.content) for m in msgs] == [
        ("system", "billing headerYou are an agent."),
        ("user", "<system-reminder>ctx"),
        ("system", "Available agent types: claude, Explore"),  # kept where it was sent
        ("user", "Say hi"),
    ]


def test_a_system_message_in_messages_takes_text_only() -> None:
    bad = [{"role": "system", "content": [{"type": "tool_use", "name": "t", "input": {}}]}]
    with pytest.raises(InvalidRequest) as ei:
        parse_request(_body(messages=[{"role": "user", "content": "x"}, *bad]))
    assert ei.value.param == "messages[1].content[0]"
    with pytest.raises(InvalidRequest, match="role user, assistant or system"):
        parse_request(_body(messages=[{"role": "tool", "content": "x"}]))
