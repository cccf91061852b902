"""The Responses API with openai-python and the Messages API with the anthropic SDK, on SmolLM2."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from tests.conftest import Served

pytestmark = pytest.mark.model
anthropic = pytest.importorskip("anthropic", reason="the anthropic SDK is part of the dev extra")


def test_responses_create_and_stream(served: Served) -> None:
    c = openai.OpenAI(base_url=served.base_url, api_key="x", max_retries=0, timeout=120)
    r = c.responses.create(
        model=served.model_id,
        input="Say hello.",
        instructions="Be brief.",
        max_output_tokens=12,
        temperature=0,
    )
    assert r.object == "response" and r.output_text
    assert r.usage.output_tokens <= 12 and r.usage.input_tokens > 0
    items = c.responses.create(
        model=served.model_id,
        input=[{"role": "user", "content": [{"type": "input_text", "text": "Say hello."}]}],
        instructions="Be brief.",
        max_output_tokens=12,
        temperature=0,
    )
    # a string input is the same message as an item: the same prompt, wholly reused from the
    # first request's cache but for its last token (whose logits are needed). The answers may
    # differ at a near-tie: that token was read alone here, in a batch of the whole prompt there
    assert items.usage.input_tokens == r.usage.input_tokens
    assert items.usage.input_tokens_details.cached_tokens == r.usage.input_tokens - 1
    events = list(
        c.responses.create(
            model=served.model_id,
            input="Say hello.",
            instructions="Be brief.",
            max_output_tokens=12,
            temperature=0,
            stream=True,
        )
    )
    seqs = [e.sequence_number for e in events]
    assert seqs == list(range(len(events))), "sequence_number counts every event"
    assert events[0].type == "response.created" and events[-1].type in (
        "response.completed",
        "response.incomplete",
    )
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == items.output_text  # read from the cache the same way as the second
    with c.responses.stream(
        model=served.model_id,
        input="Say hello.",
        instructions="Be brief.",
        max_output_tokens=200,
        temperature=0,
    ) as stream:
        final = stream.get_final_response()
    assert final.status == "completed" and final.output_text.startswith(items.output_text)
    with pytest.raises(openai.BadRequestError) as ei:
        c.responses.create(model=served.model_id, input="x", previous_response_id="resp_123")
    assert ei.value.body["param"] == "previous_response_id"


def test_responses_json_schema(served: Served) -> None:
    c = openai.OpenAI(base_url=served.base_url, api_key="x", max_retries=0, timeout=120)
    schema = {
        "type": "object",
        "properties": {"color": {"type": "string", "enum": ["red", "blue"]}},
        "required": ["color"],
        "additionalProperties": False,
    }
    r = c.responses.create(
        model=served.model_id,
        input="What color is the sky?",
        max_output_tokens=40,
        temperature=0,
        text={"format": {"type": "json_schema", "name": "c", "schema": schema}},
    )
    assert json.loads(r.output_text)["color"] in ("red", "blue")


def test_a_schemas_strings_hold_no_raw_control_characters(served: Served) -> None:
    """A raw newline or tab inside a JSON string is invalid JSON. The model is pushed hard
    towards both (logit_bias), so only the grammar keeps them out (escaped, or not at all)."""
    c = openai.OpenAI(base_url=served.base_url, api_key="x", max_retries=0, timeout=120)
    ask = {"model": served.model_id, "prompt": "\n\t", "add_special_tokens": False}
    ids = httpx.post(f"{served.root}/tokenize", json=ask, timeout=60).json()["tokens"]
    bounded = {"type": "string", "maxLength": 24}
    schema = {
        "type": "object",
        "properties": {"a": bounded, "b": bounded},
        "required": ["a", "b"],
        "additionalProperties": False,
    }
    r = c.chat.completions.create(
        model=served.model_id,
        messages=[{"role": "user", "content": "Write two lines of a poem."}],
        max_tokens=200,  # more than the schema's longest answer: the grammar ends it
        temperature=0,
        logit_bias={str(i): 30 for i in ids},
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "p", "schema": schema, "strict": True},
        },
    )
    assert r.choices[0].finish_reason == "stop"
    # json.loads is strict by default: a control character inside a string raises
    assert set(json.loads(r.choices[0].message.content or "")) == {"a", "b"}


def test_anthropic_messages(served: Served) -> None:
    c = anthropic.Anthropic(base_url=served.root, api_key="unused", max_retries=0, timeout=120)
    m = c.messages.create(
        model=served.model_id,
        max_tokens=12,
        extra_body={"temperature": 0},
        system="Be brief.",
        messages=[{"role": "user", "content": [{"type": "text", "text": "Say hello."}]}],
    )
    assert m.role == "assistant" and m.content[0].type == "text" and m.content[0].text
    assert m.stop_reason in ("end_turn", "max_tokens") and m.usage.output_tokens <= 12
    with c.messages.stream(
        model=served.model_id,
        max_tokens=12,
        extra_body={"temperature": 0},
        system="Be brief.",
        messages=[{"role": "user", "content": "Say hello."}],
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == m.content[0].text == final.content[0].text
    words = text.split()
    if len(words) > 2:
        stop = " " + words[1]
        s = c.messages.create(
            model=served.model_id,
            max_tokens=12,
            extra_body={"temperature": 0},
            system="Be brief.",
            stop_sequences=[stop],
            messages=[{"role": "user", "content": "Say hello."}],
        )
        assert s.stop_reason == "stop_sequence" and s.stop_sequence == stop
        assert stop not in s.content[0].text
    with pytest.raises(anthropic.NotFoundError):
        c.messages.create(model="ghost", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    with pytest.raises(anthropic.BadRequestError) as ei:
        c.messages.create(
            model=served.model_id, max_tokens=5, messages=[{"role": "wizard", "content": "x"}]
        )
    assert (
        ei.value.body["type"] == "error"
        and ei.value.body["error"]["type"] == "invalid_request_error"
    )


def test_anthropic_tools(served: Served) -> None:
    c = anthropic.Anthropic(base_url=served.root, api_key="unused", max_retries=0, timeout=120)
    tools = [
        {
            "name": "get_weather",
            "description": "Weather for a city",
            "input_schema": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        }
    ]
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    m = c.messages.create(
        model=served.model_id,
        max_tokens=80,
        tools=tools,
        messages=ask,
        tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        extra_body={"temperature": 0},
    )
    assert m.stop_reason == "tool_use"
    use = next(b for b in m.content if b.type == "tool_use")
    assert use.name == "get_weather" and isinstance(use.input, dict) and use.id.startswith("toolu_")
    with c.messages.stream(
        model=served.model_id,
        max_tokens=80,
        tools=tools,
        messages=ask,
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        extra_body={"temperature": 0},
    ) as stream:
        final = stream.get_final_message()
    streamed = next(b for b in final.content if b.type == "tool_use")
    assert streamed.name == "get_weather" and streamed.input == use.input
    assert final.stop_reason == "tool_use"
    # the tool's result goes back in a user turn; the model answers in text
    follow = c.messages.create(
        model=served.model_id,
        max_tokens=20,
        tools=tools,
        extra_body={"temperature": 0},
        messages=ask
        + [
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": use.id, "name": use.name, "input": use.input}
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": use.id, "content": "18°C, cloudy"}
                ],
            },
        ],
        tool_choice={"type": "none"},
    )
    assert follow.content[0].type == "text" and follow.stop_reason in ("end_turn", "max_tokens")


def test_responses_function_tools(served: Served) -> None:
    c = openai.OpenAI(base_url=served.base_url, api_key="x", max_retries=0, timeout=120)
    tools = [
        {
            "type": "function",
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        }
    ]
    r = c.responses.create(
        model=served.model_id,
        input="What is the weather in Paris?",
        tools=tools,
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=80,
        temperature=0,
    )
    (call,) = [o for o in r.output if o.type == "function_call"]
    assert call.name == "get_weather" and isinstance(json.loads(call.arguments), dict)
    events = list(
        c.responses.create(
            model=served.model_id,
            input="What is the weather in Paris?",
            tools=tools,
            tool_choice="required",
            parallel_tool_calls=False,
            max_output_tokens=80,
            temperature=0,
            stream=True,
        )
    )
    assert [e.sequence_number for e in events] == list(range(len(events)))
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert json.loads(args) == json.loads(call.arguments)
    follow = c.responses.create(
        model=served.model_id,
        tools=tools,
        tool_choice="none",
        max_output_tokens=20,
        temperature=0,
        input=[
            {"role": "user", "content": "What is the weather in Paris?"},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": "18°C, cloudy"},
        ],
    )
    assert follow.output_text


def test_every_generation_route_logs_its_tokens_and_speed(served: Served) -> None:
    """The request log (Server page table and chart) gets tokens and tok/s from the Responses and
    Messages routes too, streamed and not, as from chat completions."""
    from app.core.events import RequestFinished

    seen: list[RequestFinished] = []

    def on(ev: object) -> None:
        if isinstance(ev, RequestFinished):
            seen.append(ev)

    unsubscribe = served.service.events.subscribe(on)  # type: ignore[attr-defined]
    try:
        oc = openai.OpenAI(base_url=served.base_url, api_key="x", max_retries=0, timeout=120)
        ac = anthropic.Anthropic(base_url=served.root, api_key="x", max_retries=0, timeout=120)
        msgs = [{"role": "user", "content": "Say hello."}]
        kw = dict(model=served.model_id, max_tokens=6, messages=msgs)
        oc.responses.create(model=served.model_id, input="Say hello.", max_output_tokens=6)
        list(
            oc.responses.create(
                model=served.model_id, input="Hi.", max_output_tokens=6, stream=True
            )
        )
        ac.messages.create(**kw)
        with ac.messages.stream(**kw) as s:
            s.get_final_message()
        deadline = time.monotonic() + 10  # the log entry is written as the response ends
        while time.monotonic() < deadline and sum(e.path == "/v1/messages" for e in seen) < 2:
            time.sleep(0.05)
    finally:
        unsubscribe()
    gens = [e for e in seen if e.path in ("/v1/responses", "/v1/messages")]
    assert [e.path for e in gens] == ["/v1/responses"] * 2 + ["/v1/messages"] * 2
    for e in gens:
        assert e.model == served.model_id and e.prompt_tokens > 0 and e.completion_tokens > 0, e
        assert e.tokens_per_second > 0 and e.prompt_tokens_per_second > 0, e
