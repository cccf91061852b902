"""The OpenAI wire as Hearth speaks it to an engine: request bodies from the internal requests,
and engines' stream chunks folded into deltas (app/runtimes/remote/codec.py)."""

from __future__ import annotations

import json

import pytest

from app.core.inference.tools import Tool
from app.core.requests import ChatRequest, CompletionRequest, Infill, ToolChoice
from app.core.types import ChatMessage, Constraint, SamplingParams, ToolCall
from app.errors import UnsupportedParameter
from app.runtimes.remote import codec

WEATHER = Tool(
    "weather", "the weather", {"type": "object", "properties": {"city": {"type": "string"}}}
)


def test_chat_body_carries_everything_the_request_asks() -> None:
    req = ChatRequest(
        model="lan/x",
        messages=(
            ChatMessage("system", "be brief"),
            ChatMessage("user", "weather?"),
            ChatMessage(
                "assistant", "", tool_calls=(ToolCall("c1", "weather", '{"city":"Oslo"}'),)
            ),
            ChatMessage("tool", "sunny", tool_call_id="c1"),
        ),
        sampling=SamplingParams(temperature=0.2, top_k=40, min_p=0.05, repeat_penalty=1.1, seed=7),
        max_tokens=16,
        stop=("\n\n",),
        tools=(WEATHER,),
        tool_choice=ToolChoice("named", "weather", parallel=False),
        constraint=Constraint("json_schema", json.dumps({"type": "object"})),
        logprobs=2,
    )
    b = codec.chat_body("vllm", "Qwen/Qwen3-8B", req)
    assert b["model"] == "Qwen/Qwen3-8B" and b["stream"] is True
    assert b["stream_options"] == {"include_usage": True}  # usage even when the client asked none
    assert b["messages"][2] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "weather", "arguments": '{"city":"Oslo"}'},
            }
        ],
    }
    assert b["messages"][3] == {"role": "tool", "content": "sunny", "tool_call_id": "c1"}
    assert b["tools"] == [WEATHER.as_openai()]
    assert b["tool_choice"] == {"type": "function", "function": {"name": "weather"}}
    assert b["parallel_tool_calls"] is False
    assert b["response_format"]["json_schema"]["schema"] == {"type": "object"}
    assert (b["logprobs"], b["top_logprobs"], b["max_tokens"], b["stop"]) == (True, 2, 16, ["\n\n"])
    assert (b["top_k"], b["min_p"], b["repetition_penalty"], b["seed"]) == (40, 0.05, 1.1, 7)
    # llama.cpp names it repeat_penalty; a plain OpenAI API gets only OpenAI's own fields
    assert codec.chat_body("llama.cpp", "m", req)["repeat_penalty"] == 1.1
    plain = codec.chat_body("openai", "gpt-4o-mini", req)
    assert not {"top_k", "min_p", "repeat_penalty", "repetition_penalty"} & set(plain)


def test_completion_body_keeps_token_prompts() -> None:
    req = CompletionRequest(
        "lan/x", ((1, 2, 3),), max_tokens=4, constraint=Constraint("json_object")
    )
    b = codec.completion_body("hearth", "x", req, (1, 2, 3))
    assert b["prompt"] == [1, 2, 3] and b["response_format"] == {"type": "json_object"}


def test_fill_in_the_middle_goes_on_as_openai_insert_mode() -> None:
    req = CompletionRequest("lan/x", ("def f(",), infill=Infill("):\n", cursor="x"))
    b = codec.completion_body("ollama", "x", req, "def f(")
    # the suffix passed on (an engine that cannot fill in refuses it itself); the cursor text
    # follows the prefix, as llama-server puts it
    assert b["prompt"] == "def f(x" and b["suffix"] == "):\n"
    files = CompletionRequest("lan/x", ("a",), infill=Infill("b", extra=(("f.py", "c"),)))
    with pytest.raises(UnsupportedParameter) as e:
        codec.completion_body("hearth", "x", files, "a")
    assert e.value.param == "input_extra"


def test_chunks_fold_into_deltas_and_the_usage_chunk_reaches_the_final_delta() -> None:
    r = codec.ChunkReader()
    assert r.feed({"choices": [{"delta": {"role": "assistant", "content": ""}}]}) is None
    assert not r.started  # a role-only chunk is no first token
    d = r.feed({"choices": [{"delta": {"reasoning_content": "hmm"}}]})
    assert d is not None and d.reasoning == "hmm" and r.started
    d = r.feed({"choices": [{"delta": {"tool_calls": [
        {"index": 0, "id": "call_a", "type": "function", "function": {"name": "weather", "arguments": ""}}
    ]}}]})  # fmt: skip
    assert d is not None and d.tool_calls[0].id == "call_a" and d.tool_calls[0].name == "weather"
    d = r.feed(
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"ci'}}]}}]}
    )
    assert d is not None and d.tool_calls[0].arguments == '{"ci' and d.tool_calls[0].name is None
    assert r.feed({"choices": [{"delta": {}, "finish_reason": "stop"}]}) is None
    assert r.feed({"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 5,
                                            "prompt_tokens_details": {"cached_tokens": 4}}}) is None  # fmt: skip
    final = r.final(0)
    # a call was made: "stop" is reported as tool_calls; the usage is the engine's own
    assert final.finish_reason == "tool_calls"
    assert final.usage is not None and (final.usage.prompt_tokens, final.usage.cached_tokens) == (
        12,
        4,
    )


def test_an_engine_that_sends_no_usage_still_gives_one() -> None:
    r = codec.ChunkReader(chat=False)
    for t in ("Once", " upon", " a"):
        r.feed({"choices": [{"text": t}]})
    r.feed({"choices": [{"text": "", "finish_reason": "length"}]})
    final = r.final(7)
    assert final.finish_reason == "length"
    assert final.usage is not None and (
        final.usage.prompt_tokens,
        final.usage.completion_tokens,
    ) == (7, 3)


def test_odd_chunks_never_raise() -> None:
    r = codec.ChunkReader()
    for odd in (None, [], "x", {"choices": "x"}, {"choices": [None]}, {"choices": [{"delta": []}]},
                {"choices": [{"delta": {"tool_calls": [None, {"function": "x"}]}}]},
                {"usage": {"prompt_tokens": -1}}):  # fmt: skip
        r.feed(odd)
    assert r.final(0).finish_reason in ("stop", "tool_calls")


def test_anthropic_count_body_splits_system_and_tool_blocks() -> None:
    req = ChatRequest(
        "lan/x",
        (
            ChatMessage("system", "sys"),
            ChatMessage("user", "hi"),
            ChatMessage(
                "assistant", "", tool_calls=(ToolCall("c1", "weather", '{"city":"Oslo"}'),)
            ),
            ChatMessage("tool", "sunny", tool_call_id="c1"),
        ),
        tools=(WEATHER,),
    )
    b = codec.anthropic_count_body("x", req)
    assert b["system"] == "sys" and b["tools"][0]["input_schema"] == WEATHER.parameters
    assert b["messages"][1]["content"][0] == {
        "type": "tool_use", "id": "c1", "name": "weather", "input": {"city": "Oslo"}
    }  # fmt: skip
    assert b["messages"][2]["content"][0]["type"] == "tool_result"
