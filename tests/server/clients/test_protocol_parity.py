"""The differential test: one greedy question through all four wire APIs, whole and streamed,
must come out as the same text with the same token counts on SmolLM2; one tool call must come
out the same from all four. Sampling is fixed explicitly (temperature 0, no penalties), because
Ollama's defaults differ from OpenAI's."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.conftest import Served

pytestmark = pytest.mark.model

SYSTEM = "You are a helpful assistant. Answer briefly."
QUESTION = "What is the capital of France?"
MAX = 24
WEATHER = {
    "name": "get_weather",
    "description": "Get the current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
TOOL_QUESTION = "What is the weather like in Paris right now?"


@dataclass
class Answer:
    text: str
    prompt_tokens: int
    completion_tokens: int
    calls: list[tuple[str, dict[str, Any]]]


def _sse(resp: httpx.Response) -> list[tuple[str | None, Any]]:
    events: list[tuple[str | None, Any]] = []
    name: str | None = None
    for line in resp.iter_lines():
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            data = line[6:]
            events.append((name, data if data == "[DONE]" else json.loads(data)))
            name = None
    return events


def _post(served: Served, path: str, body: dict[str, Any]) -> httpx.Response:
    r = httpx.post(served.base_url.removesuffix("/v1") + path, json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r


def _stream(served: Served, path: str, body: dict[str, Any]) -> list[Any]:
    url = served.base_url.removesuffix("/v1") + path
    with httpx.stream("POST", url, json=body, timeout=300) as r:
        assert r.status_code == 200, r.read()
        if path.startswith("/api/"):
            return [json.loads(line) for line in r.iter_lines() if line.strip()]
        return _sse(r)


# -- one function per protocol: the request, and the answer read back from the wire -----------
def openai_chat(served: Served, stream: bool, tools: bool = False) -> Answer:
    body: dict[str, Any] = {
        "model": served.model_id,
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": TOOL_QUESTION if tools else QUESTION},
        ],
        "temperature": 0,
        "max_tokens": MAX if not tools else 80,
        "frequency_penalty": 0,
        "presence_penalty": 0,
    }
    if tools:
        body["tools"] = [{"type": "function", "function": WEATHER}]
        body["tool_choice"] = {"type": "function", "function": {"name": "get_weather"}}
    if not stream:
        r = _post(served, "/v1/chat/completions", body).json()
        msg = r["choices"][0]["message"]
        calls = [
            (c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in msg.get("tool_calls") or []
        ]
        u = r["usage"]
        return Answer(msg["content"] or "", u["prompt_tokens"], u["completion_tokens"], calls)
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    text, usage, parts = "", None, {}
    for _, ev in _stream(served, "/v1/chat/completions", body):
        if ev == "[DONE]":
            continue
        if ev.get("usage"):
            usage = ev["usage"]
        for ch in ev["choices"]:
            text += ch["delta"].get("content") or ""
            for tc in ch["delta"].get("tool_calls") or []:
                p = parts.setdefault(tc["index"], ["", ""])
                p[0] += (tc.get("function") or {}).get("name") or ""
                p[1] += (tc.get("function") or {}).get("arguments") or ""
    calls = [(n, json.loads(a)) for n, a in (parts[i] for i in sorted(parts))]
    assert usage is not None
    return Answer(text, usage["prompt_tokens"], usage["completion_tokens"], calls)


def responses(served: Served, stream: bool, tools: bool = False) -> Answer:
    body: dict[str, Any] = {
        "model": served.model_id,
        "instructions": SYSTEM,
        "input": TOOL_QUESTION if tools else QUESTION,
        "temperature": 0,
        "max_output_tokens": MAX if not tools else 80,
    }
    if tools:
        body["tools"] = [{"type": "function", **WEATHER}]
        body["tool_choice"] = {"type": "function", "name": "get_weather"}
    if stream:
        body["stream"] = True
        evs = _stream(served, "/v1/responses", body)
        done = [
            ev
            for name, ev in evs
            if ev != "[DONE]"
            and ev.get("type")
            in (
                "response.completed",
                "response.incomplete",
            )
        ]
        assert done, evs[-3:]
        text = "".join(
            ev["delta"] for _, ev in evs if ev.get("type") == "response.output_text.delta"
        )
        r = done[-1]["response"]
        out_text = "".join(
            c["text"]
            for item in r["output"]
            if item["type"] == "message"
            for c in item["content"]
            if c["type"] == "output_text"
        )
        assert out_text == text, "the streamed deltas add up to the final response"
    else:
        r = _post(served, "/v1/responses", body).json()
        text = "".join(
            c["text"]
            for item in r["output"]
            if item["type"] == "message"
            for c in item["content"]
            if c["type"] == "output_text"
        )
    calls = [
        (item["name"], json.loads(item["arguments"]))
        for item in r["output"]
        if item["type"] == "function_call"
    ]
    u = r["usage"]
    return Answer(text, u["input_tokens"], u["output_tokens"], calls)


def anthropic(served: Served, stream: bool, tools: bool = False) -> Answer:
    body: dict[str, Any] = {
        "model": served.model_id,
        "system": SYSTEM,
        "messages": [{"role": "user", "content": TOOL_QUESTION if tools else QUESTION}],
        "temperature": 0,
        "max_tokens": MAX if not tools else 80,
    }
    if tools:
        body["tools"] = [
            {
                "name": WEATHER["name"],
                "description": WEATHER["description"],
                "input_schema": WEATHER["parameters"],
            }
        ]
        body["tool_choice"] = {"type": "tool", "name": "get_weather"}
    if not stream:
        r = _post(served, "/v1/messages", body).json()
        text = "".join(b["text"] for b in r["content"] if b["type"] == "text")
        calls = [(b["name"], b["input"]) for b in r["content"] if b["type"] == "tool_use"]
        u = r["usage"]
        return Answer(text, u["input_tokens"], u["output_tokens"], calls)
    body["stream"] = True
    text, prompt, completion = "", 0, 0
    blocks: dict[int, list[Any]] = {}
    for name, ev in _stream(served, "/v1/messages", body):
        if name == "message_start":
            prompt = ev["message"]["usage"]["input_tokens"]
        elif name == "content_block_start" and ev["content_block"]["type"] == "tool_use":
            blocks[ev["index"]] = [ev["content_block"]["name"], ""]
        elif name == "content_block_delta":
            d = ev["delta"]
            if d["type"] == "text_delta":
                text += d["text"]
            elif d["type"] == "input_json_delta":
                blocks[ev["index"]][1] += d["partial_json"]
        elif name == "message_delta":
            completion = ev["usage"]["output_tokens"]
    calls = [(n, json.loads(a or "{}")) for n, a in (blocks[i] for i in sorted(blocks))]
    return Answer(text, prompt, completion, calls)


def ollama(served: Served, stream: bool, tools: bool = False) -> Answer:
    body: dict[str, Any] = {
        "model": served.model_id,
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": TOOL_QUESTION if tools else QUESTION},
        ],
        "stream": stream,
        # Ollama's own defaults (top_k 40, top_p 0.9, repeat_penalty 1.1) are not OpenAI's
        "options": {
            "temperature": 0,
            "num_predict": MAX if not tools else 80,
            "repeat_penalty": 1.0,
            "top_k": 0,
            "top_p": 1.0,
        },
    }
    if tools:
        body["tools"] = [{"type": "function", "function": WEATHER}]
        # Hearth's extension: Ollama's API has no tool choice (OpenAI's spellings are taken)
        body["tool_choice"] = {"type": "function", "function": {"name": "get_weather"}}
    lines = (
        _stream(served, "/api/chat", body) if stream else [_post(served, "/api/chat", body).json()]
    )
    text = "".join(ln["message"].get("content") or "" for ln in lines if "message" in ln)
    calls = [
        (c["function"]["name"], c["function"]["arguments"])
        for ln in lines
        if "message" in ln
        for c in ln["message"].get("tool_calls") or []
    ]
    last = lines[-1]
    assert last["done"] is True
    return Answer(text, last["prompt_eval_count"], last["eval_count"], calls)


PROTOCOLS = {
    "openai": openai_chat,
    "responses": responses,
    "anthropic": anthropic,
    "ollama": ollama,
}


def test_one_greedy_question_is_the_same_answer_on_every_protocol(served: Served) -> None:
    answers = {
        (name, stream): fn(served, stream)
        for name, fn in PROTOCOLS.items()
        for stream in (False, True)
    }
    ref = answers[("openai", False)]
    assert ref.text.strip() and ref.completion_tokens > 0 and ref.prompt_tokens > 0
    for key, a in answers.items():
        assert (a.text, a.prompt_tokens, a.completion_tokens) == (
            ref.text,
            ref.prompt_tokens,
            ref.completion_tokens,
        ), key


def test_one_tool_call_is_the_same_on_every_protocol(served: Served) -> None:
    """One call of a named tool, asked for in each API's spelling (on Ollama through Hearth's
    ``tool_choice`` extension: SmolLM2 never calls on its own, so an auto choice would compare
    plain text): the same call, arguments and token counts from all four, whole and streamed."""
    answers = {
        (name, stream): fn(served, stream, tools=True)
        for name, fn in PROTOCOLS.items()
        for stream in (False, True)
    }
    ref = answers[("openai", False)]
    assert len(ref.calls) == 1 and ref.calls[0][0] == "get_weather", ref
    assert isinstance(ref.calls[0][1], dict)
    for key, a in answers.items():
        assert (a.calls, a.prompt_tokens, a.completion_tokens) == (
            ref.calls,
            ref.prompt_tokens,
            ref.completion_tokens,
        ), key
