"""Stored Responses on the wire, without a model: a continuation's history goes before the new
input with only the new instructions, the response echoes ``previous_response_id`` and
``store``, ``input_items`` pages as OpenAI's list, and what is refused is refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.core.gateway.response_store import ResponseStore, StoredResponse
from app.errors import InvalidRequest, NotFound
from app.server.protocols.base import Context
from app.server.protocols.responses import parse, render, stored

TURN1 = [
    {"id": "msg_1", "type": "message", "role": "user", "content": "Hi, I am Ada."},
    {
        "id": "msg_2",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "Hello Ada!", "annotations": []}],
    },
    {"id": "rs_3", "type": "reasoning", "summary": [], "content": []},
    {"id": "fc_4", "type": "function_call", "call_id": "call_4", "name": "f", "arguments": "{}"},
    {"id": "fco_5", "type": "function_call_output", "call_id": "call_4", "output": "42"},
]


def test_history_goes_first_and_only_this_requests_instructions_apply() -> None:
    body = {"model": "m", "input": "And now?", "instructions": "Be brief.", "store": False}
    p = parse.parse_request(body, TURN1)
    roles = [(m.role, m.content) for m in p.request.messages]
    assert roles == [
        ("system", "Be brief."),
        ("user", "Hi, I am Ada."),
        ("assistant", "Hello Ada!"),
        ("assistant", ""),  # the function call's turn (the reasoning item is not sent)
        ("tool", "42"),
        ("user", "And now?"),
    ]
    assert p.request.messages[3].tool_calls[0].name == "f"
    assert p.echo.store is False and p.echo.previous_response_id is None
    assert [i["type"] for i in p.items] == ["message"] and p.items[0]["id"].startswith("msg_")
    alone = parse.parse_request({"model": "m", "input": "And now?"})
    assert alone.request.messages[-1] == p.request.messages[-1]  # a string is one user message


def test_the_response_echoes_what_it_continued() -> None:
    p = parse.parse_request({"model": "m", "input": "x", "previous_response_id": "resp_1"})
    body = render.response_object(Context("m"), p.echo, "completed", [], None)
    assert body["previous_response_id"] == "resp_1" and body["store"] is True


def test_background_and_conversation_are_refused_by_name() -> None:
    for field, value in (("background", True), ("conversation", "conv_1")):
        with pytest.raises(InvalidRequest) as ei:
            parse.parse_request({"model": "m", "input": "x", field: value})
        assert ei.value.param == field
    parse.parse_request({"model": "m", "input": "x", "background": False})


def test_an_id_the_caller_did_not_keep_is_not_found(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path / "r.sqlite")
    store.put("a", StoredResponse("resp_1", {"id": "resp_1", "output": [TURN1[1]]}, TURN1[:1]))
    assert [i["id"] for i in stored.history(store, "a", {"previous_response_id": "resp_1"})] == [
        "msg_1",
        "msg_2",
    ]
    assert stored.history(store, "a", {}) == []
    with pytest.raises(InvalidRequest) as ei:
        stored.history(store, "b", {"previous_response_id": "resp_1"})
    assert ei.value.code == "previous_response_not_found"
    assert ei.value.param == "previous_response_id" and ei.value.status == 400
    with pytest.raises(NotFound):
        stored.find(store, "b", "resp_1")
    with pytest.raises(NotFound):
        stored.find(None, "a", "resp_1")  # nothing is kept where no store is wired


def test_input_items_page_as_openai_lists_them() -> None:
    entry = StoredResponse("resp_9", {"id": "resp_9", "output": []}, TURN1)
    page = stored.input_items_page(entry, {})
    assert page["object"] == "list" and page["has_more"] is False
    assert [i["id"] for i in page["data"]] == ["fco_5", "fc_4", "rs_3", "msg_2", "msg_1"]
    assert page["first_id"] == "fco_5" and page["last_id"] == "msg_1"
    page = stored.input_items_page(entry, {"order": "asc", "limit": "2"})
    assert [i["id"] for i in page["data"]] == ["msg_1", "msg_2"] and page["has_more"]
    page = stored.input_items_page(entry, {"order": "asc", "after": "msg_2", "limit": "2"})
    assert [i["id"] for i in page["data"]] == ["rs_3", "fc_4"] and page["has_more"]
    page = stored.input_items_page(entry, {"order": "asc", "before": "rs_3"})
    assert [i["id"] for i in page["data"]] == ["msg_1", "msg_2"]
    for query, param in (
        ({"limit": "0"}, "limit"),
        ({"limit": "x"}, "limit"),
        ({"order": "up"}, "order"),
        ({"after": "nope"}, "after"),
    ):
        with pytest.raises(InvalidRequest) as ei:
            stored.input_items_page(entry, query)
        assert ei.value.param == param
    with pytest.raises(InvalidRequest) as ei:
        stored.reject_stream({"stream": "true"})
    assert ei.value.param == "stream"
    stored.reject_stream({"stream": "false"})
    assert stored.deleted("resp_9") == {"id": "resp_9", "object": "response", "deleted": True}


def test_a_stream_hands_its_finished_response_over_before_the_last_event() -> None:
    from app.core.types import Delta, Usage

    kept: list[dict] = []
    p = parse.parse_request({"model": "m", "input": "x"})
    s = render.ResponseStream(p.echo, Context("m"), on_done=kept.append)
    s.open()
    s.delta(0, Delta(text="Hi"))
    final = Delta(finish_reason="stop", usage=Usage(3, 1))
    s.end_choice(0, final)
    frames = s.close([final])
    assert kept and frames[-1].data["response"] == kept[0]
    assert kept[0]["output"][0]["content"][0]["text"] == "Hi"
