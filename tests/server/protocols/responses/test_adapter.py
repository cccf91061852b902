"""The Responses adapter on recorded deltas: exact events with a reasoning item, tool calls split
at every point, logprobs, errors mid-stream and cut streams, usage, and the request bounds."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.core.types import Delta, ToolCallDelta, Usage
from app.errors import GenerationTimeout, InvalidRequest, UnsupportedParameter
from app.server.protocols.base import Context
from app.server.protocols.responses.parse import Echo, parse_request
from app.server.protocols.responses.render import ResponseStream, response_body
from app.server.streaming import StreamBroken

from ..replay import completion, deltas, events, lp, lp_json, render

ECHO = Echo()
THINK_TOOL = (
    'Hmm, 2+2.</think>\n\nIt is 4.<tool_call>{"name": "add", "arguments": {"a": [2, 2]}}'
    "</tool_call>"
)


def ctx() -> Context:
    return Context("m", id="ID", created=1.0)


def stream(ds: list[Delta], **kw: Any) -> list[tuple[str | None, Any]]:
    evs = events(render(ResponseStream(ECHO, ctx()), ds, **kw))
    assert [d["sequence_number"] for _, d in evs] == list(range(len(evs)))
    assert all(k == d["type"] for k, d in evs)
    return [
        (k, {x: v for x, v in d.items() if x not in ("type", "sequence_number")}) for k, d in evs
    ]


def test_reasoning_text_and_a_call_exact_events() -> None:
    ds = [
        Delta(reasoning="Let me"),
        Delta(reasoning=" think."),
        Delta(text="Sure."),
        Delta(tool_calls=(ToolCallDelta(0, "call_1", "add"),)),
        Delta(tool_calls=(ToolCallDelta(0, arguments='{"a": 1}'),)),
        Delta(finish_reason="tool_calls", usage=Usage(7, 5, reasoning_tokens=2)),
    ]
    evs = stream(ds)
    rs = {"item_id": "rs_ID", "output_index": 0, "content_index": 0}
    msg = {"item_id": "msg_ID", "output_index": 1, "content_index": 0}
    reasoning_done = {
        "type": "reasoning",
        "id": "rs_ID",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": "Let me think."}],
        "status": "completed",
    }
    message_done = {
        "type": "message",
        "id": "msg_ID",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "Sure.", "annotations": [], "logprobs": []}],
    }
    call_done = {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "call_1",
        "name": "add",
        "arguments": '{"a": 1}',
        "status": "completed",
    }
    assert [k for k, _ in evs[:2]] == ["response.created", "response.in_progress"]
    assert evs[0][1]["response"]["status"] == "in_progress"
    assert evs[2:-1] == [
        (
            "response.output_item.added",
            {
                "output_index": 0,
                "item": {
                    "type": "reasoning",
                    "id": "rs_ID",
                    "summary": [],
                    "content": [],
                    "status": "in_progress",
                },
            },
        ),
        ("response.content_part.added", {**rs, "part": {"type": "reasoning_text", "text": ""}}),
        ("response.reasoning_text.delta", {**rs, "delta": "Let me"}),
        ("response.reasoning_text.delta", {**rs, "delta": " think."}),
        ("response.reasoning_text.done", {**rs, "text": "Let me think."}),
        (
            "response.content_part.done",
            {**rs, "part": {"type": "reasoning_text", "text": "Let me think."}},
        ),
        ("response.output_item.done", {"output_index": 0, "item": reasoning_done}),
        (
            "response.output_item.added",
            {
                "output_index": 1,
                "item": {
                    "type": "message",
                    "id": "msg_ID",
                    "status": "in_progress",
                    "role": "assistant",
                    "content": [],
                },
            },
        ),
        (
            "response.content_part.added",
            {**msg, "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}},
        ),
        ("response.output_text.delta", {**msg, "delta": "Sure.", "logprobs": []}),
        (
            "response.output_item.added",
            {"output_index": 2, "item": {**call_done, "arguments": "", "status": "in_progress"}},
        ),
        (
            "response.function_call_arguments.delta",
            {"item_id": "fc_1", "output_index": 2, "delta": '{"a": 1}'},
        ),
        ("response.output_text.done", {**msg, "text": "Sure.", "logprobs": []}),
        (
            "response.content_part.done",
            {
                **msg,
                "part": {"type": "output_text", "text": "Sure.", "annotations": [], "logprobs": []},
            },
        ),
        ("response.output_item.done", {"output_index": 1, "item": message_done}),
        (
            "response.function_call_arguments.done",
            {"item_id": "fc_1", "output_index": 2, "arguments": '{"a": 1}'},
        ),
        ("response.output_item.done", {"output_index": 2, "item": call_done}),
    ]
    kind, done = evs[-1]
    assert kind == "response.completed"
    assert done["response"]["output"] == [reasoning_done, message_done, call_done]
    assert done["response"]["usage"] == {
        "input_tokens": 7,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": 2},
        "total_tokens": 12,
    }
    whole = response_body(ECHO, [completion(ds)], ctx())
    assert whole["output"] == done["response"]["output"]
    assert whole["status"] == "completed"


@pytest.mark.parametrize("k", range(1, len(THINK_TOOL)))
def test_split_at_every_point_gives_the_whole_answer(k: int) -> None:
    for pieces in ([THINK_TOOL[:k], THINK_TOOL[k:]], list(THINK_TOOL[:k]) + [THINK_TOOL[k:]]):
        ds = deltas(pieces, think=True, tools=True)
        evs = stream(ds)
        reasoning = "".join(d["delta"] for e, d in evs if e == "response.reasoning_text.delta")
        text = "".join(d["delta"] for e, d in evs if e == "response.output_text.delta")
        args = "".join(d["delta"] for e, d in evs if e == "response.function_call_arguments.delta")
        assert (reasoning, text, json.loads(args)) == ("Hmm, 2+2.", "It is 4.", {"a": [2, 2]})
        added = [d["output_index"] for e, d in evs if e == "response.output_item.added"]
        finished = [d["output_index"] for e, d in evs if e == "response.output_item.done"]
        assert added == [0, 1, 2] and sorted(finished) == [0, 1, 2], pieces
        final = evs[-1][1]["response"]
        assert [o["type"] for o in final["output"]] == ["reasoning", "message", "function_call"]
        whole = response_body(ECHO, [completion(ds)], ctx())
        assert whole["output"] == final["output"]


def test_logprobs_go_with_the_text_they_wrote_and_whole_in_the_done_events() -> None:
    ds = [
        Delta(text="It", logprobs=(lp("It", -0.5, ("It", -0.5), ("This", -1.5)),)),
        # a token whose text is held back (a stop string's start): its logprobs wait for the
        # next text delta
        Delta(logprobs=(lp(" is", -0.25, (" is", -0.25), ("'s", -2.0)),)),
        Delta(text=" is 4", logprobs=(lp(" 4", -0.125, (" 4", -0.125), (" four", -3.0)),)),
        Delta(finish_reason="stop", usage=Usage(7, 3)),
    ]
    evs = stream(ds)
    every = [
        lp_json("It", -0.5, ("It", -0.5), ("This", -1.5)),
        lp_json(" is", -0.25, (" is", -0.25), ("'s", -2.0)),
        lp_json(" 4", -0.125, (" 4", -0.125), (" four", -3.0)),
    ]
    msg = {"item_id": "msg_ID", "output_index": 0, "content_index": 0}
    assert [d for k, d in evs if k == "response.output_text.delta"] == [
        {**msg, "delta": "It", "logprobs": every[:1]},
        {**msg, "delta": " is 4", "logprobs": every[1:]},
    ]
    part = {"type": "output_text", "text": "It is 4", "annotations": [], "logprobs": every}
    assert [d for k, d in evs if k == "response.output_text.done"] == [
        {**msg, "text": "It is 4", "logprobs": every}
    ]
    assert [d for k, d in evs if k == "response.content_part.done"] == [{**msg, "part": part}]
    (item,) = [d["item"] for k, d in evs if k == "response.output_item.done"]
    assert item["content"] == [part]
    final = evs[-1][1]["response"]
    assert final["output"] == [item]
    assert response_body(ECHO, [completion(ds)], ctx())["output"] == [item]


def test_logprobs_are_asked_for_with_include_and_counted_by_top_logprobs() -> None:
    inc = ["message.output_text.logprobs"]

    def asked(**kw: Any) -> tuple[int | None, int | None]:
        p = parse_request(_body(**kw))
        return p.request.logprobs, p.echo.top_logprobs

    assert asked() == (None, None)
    assert asked(include=inc) == (0, None)
    assert asked(include=inc, top_logprobs=5) == (5, 5)
    assert asked(include=["reasoning.encrypted_content", *inc], top_logprobs=20) == (20, 20)
    # as OpenAI: top_logprobs alone asks for none (the count is echoed back)
    assert asked(top_logprobs=5) == (None, 5)
    assert asked(include=["reasoning.encrypted_content"], top_logprobs=5) == (None, 5)
    echoed = response_body(
        parse_request(_body(top_logprobs=3)).echo,
        [completion([Delta(text="a"), Delta(finish_reason="stop")])],
        ctx(),
    )
    assert echoed["top_logprobs"] == 3
    assert echoed["output"][0]["content"][0]["logprobs"] == []


def test_an_error_mid_stream_is_the_last_event() -> None:
    err = GenerationTimeout("the request ran over the server's time limit (2s)")
    evs = stream([Delta(reasoning="Hmm"), Delta(text="It is")], error=err)
    assert evs[-1] == ("error", {"code": "timeout", "message": err.message, "param": None})
    assert not any(k in ("response.completed", "response.incomplete") for k, _ in evs)


def test_a_cut_stream_ends_with_an_error() -> None:
    evs = stream([Delta(text="It")], error=StreamBroken("the generation ended without a result"))
    assert evs[-1][0] == "error" and evs[-1][1]["code"] == "generation_error"


def test_max_output_tokens_is_incomplete_with_usage() -> None:
    ds = [Delta(text="a"), Delta(finish_reason="length", usage=Usage(7, 1))]
    evs = stream(ds)
    assert evs[-1][0] == "response.incomplete"
    r = evs[-1][1]["response"]
    assert r["incomplete_details"] == {"reason": "max_output_tokens"}
    assert r["usage"]["output_tokens"] == 1
    assert [o["type"] for o in r["output"]] == ["message"]  # no reasoning: no reasoning item


def _body(**kw: Any) -> dict[str, Any]:
    return {"model": "m", "input": "x", **kw}


SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}}}


def _fn(name: str, **kw: Any) -> dict[str, Any]:
    return {"type": "function", "name": name, "parameters": SCHEMA, **kw}


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [_fn(f"t{i}") for i in range(129)]}, "tools"),
        ({"tools": [_fn("bad name!")]}, "tools[0]"),
        ({"tools": [_fn("t", description=3)]}, "tools[0]"),
        (
            {"tools": [_fn("t", parameters={"type": "object", "x": "y" * 70_000})]},
            "tools[0].parameters",
        ),
        ({"tools": [_fn("t")], "tool_choice": 3}, "tool_choice"),
        ({"tools": [_fn("t")], "tool_choice": ["auto"]}, "tool_choice"),
        ({"tools": [_fn("t")], "tool_choice": {"type": "function", "name": "u"}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"text": "json"}, "text"),
        ({"top_logprobs": 21}, "top_logprobs"),
        ({"top_logprobs": -1, "include": ["message.output_text.logprobs"]}, "top_logprobs"),
        ({"top_logprobs": "5"}, "top_logprobs"),
        ({"include": "message.output_text.logprobs"}, "include"),
        ({"include": [1]}, "include"),
    ],
)
def test_bounds_shared_with_chat_completions(extra: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as ei:
        parse_request(_body(**extra))
    assert ei.value.param == param


def test_tool_choice_and_items() -> None:
    p = parse_request(
        _body(tools=[_fn("a"), _fn("b")], tool_choice={"type": "function", "name": "b"})
    )
    assert (p.request.tool_choice.mode, p.request.tool_choice.name) == ("named", "b")
    p = parse_request(_body(tools=[_fn("a")], parallel_tool_calls=False))
    assert (p.request.tool_choice.mode, p.request.tool_choice.parallel) == ("auto", False)
    with pytest.raises(UnsupportedParameter):
        parse_request(_body(tools=[{"type": "teleport"}]))
    # a reasoning item handed back from an earlier response is skipped, as on chat routes
    items = [
        {"role": "user", "content": "2+2?"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": []},
        {"role": "assistant", "content": [{"type": "output_text", "text": "4"}]},
    ]
    p = parse_request(_body(input=items))
    assert [(m.role, m.content) for m in p.request.messages] == [
        ("user", "2+2?"),
        ("assistant", "4"),
    ]


def test_codex_s_tools_namespaces_are_flattened_and_hosted_ones_left_out() -> None:
    """Codex 0.171 sends function tools, a ``namespace`` of function tools and ``web_search``
    in every request (seen against a real server): refusing either made every Codex request a
    400. A namespace's functions are offered as tools, and a call of one names its namespace
    again (the client dispatches on both); a hosted tool has nothing to run it here, so the
    model is not offered it."""
    ns = {
        "type": "namespace",
        "name": "multi_agent_v1",
        "description": "sub-agents",
        "tools": [_fn("close_agent"), {"type": "web_search"}, _fn("spawn_agent")],
    }
    body = _body(
        tools=[_fn("exec_command"), ns, {"type": "web_search", "external_web_access": False}],
        tool_choice="auto",
        reasoning={"summary": "auto"},
        include=["reasoning.encrypted_content"],
        store=False,
        prompt_cache_key="k",
        client_metadata={"turn_id": "t"},
    )
    p = parse_request(body)
    assert [t.name for t in p.request.tools] == ["exec_command", "close_agent", "spawn_agent"]
    assert p.echo.namespaces == {"close_agent": "multi_agent_v1", "spawn_agent": "multi_agent_v1"}
    calls = [
        Delta(tool_calls=(ToolCallDelta(0, "call_1", "spawn_agent"),)),
        Delta(tool_calls=(ToolCallDelta(0, arguments='{"a": "x"}'),)),
        Delta(tool_calls=(ToolCallDelta(1, "call_2", "exec_command", '{"a": "ls"}'),)),
        Delta(finish_reason="tool_calls", usage=Usage(3, 2)),
    ]
    whole = response_body(p.echo, [completion(calls)], ctx())
    fcs = [o for o in whole["output"] if o["type"] == "function_call"]
    assert [(f["name"], f.get("namespace")) for f in fcs] == [
        ("spawn_agent", "multi_agent_v1"),
        ("exec_command", None),
    ]
    evs = events(render(ResponseStream(p.echo, ctx()), calls))
    done = [d["item"] for k, d in evs if k == "response.output_item.done"]
    added = [d["item"] for k, d in evs if k == "response.output_item.added"]
    for items in (done, [a for a in added if a["type"] == "function_call"]):
        got = [(i["name"], i.get("namespace")) for i in items if i["type"] == "function_call"]
        assert got == [("spawn_agent", "multi_agent_v1"), ("exec_command", None)]


def test_a_namespace_is_bounded_and_checked_as_tools_are() -> None:
    many = {"type": "namespace", "name": "n", "tools": [_fn(f"t{i}") for i in range(100)]}
    with pytest.raises(InvalidRequest) as ei:
        parse_request(_body(tools=[many, {**many, "name": "m"}]))
    assert ei.value.param == "tools"
    with pytest.raises(InvalidRequest) as ei:
        parse_request(_body(tools=[{"type": "namespace", "name": "n"}]))
    assert ei.value.param == "tools[0]"
    with pytest.raises(InvalidRequest) as ei:
        parse_request(_body(tools=[{"type": "namespace", "name": "n", "tools": [_fn("a b")]}]))
    assert ei.value.param == "tools[0].tools[0]"
