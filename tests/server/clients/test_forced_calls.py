"""Forced tool calls on the real server and SmolLM2 end after the calls, on every protocol:
under ``required`` with the default ``parallel_tool_calls``, the tiny model loops on the same
call; the first repeat ends the turn, never sent, with the protocol's tool-call finish."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.conftest import Served

pytestmark = pytest.mark.model

PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Weather for a city", "parameters": PARAMS},
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
# room for a few calls: SmolLM2 writes one in about 25 tokens, and repeats it
MAX = 120


def distinct(calls: list[tuple[str, Any]]) -> None:
    """At least one call, and no call twice (name and parsed arguments)."""
    assert calls
    seen = [(n, json.dumps(a, sort_keys=True)) for n, a in calls]
    assert len(set(seen)) == len(seen), calls


def oai(s: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=s.base_url, api_key="x", max_retries=0, timeout=120)


def test_chat_completions_required_ends_at_a_repeat(served: Served) -> None:
    ask: dict[str, Any] = {
        "model": served.model_id,
        "messages": ASK,
        "tools": [WEATHER],
        "tool_choice": "required",
        "max_tokens": MAX,
        "temperature": 0,
    }
    r = oai(served).chat.completions.create(**ask)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls" and ch.message.content is None
    calls = ch.message.tool_calls or []
    distinct([(c.function.name, json.loads(c.function.arguments)) for c in calls])
    chunks = list(oai(served).chat.completions.create(**ask, stream=True))
    deltas = [tc for c in chunks for tc in c.choices[0].delta.tool_calls or []]
    names = {d.index: d.function.name for d in deltas if d.id}
    args = {i: "".join(d.function.arguments or "" for d in deltas if d.index == i) for i in names}
    distinct([(names[i], json.loads(args[i])) for i in sorted(names)])
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == [
        "tool_calls"
    ]


def test_responses_required_completes(served: Served) -> None:
    tool = {"type": "function", "name": "get_weather", "parameters": PARAMS}
    ask: dict[str, Any] = {
        "model": served.model_id,
        "input": ASK[0]["content"],
        "tools": [tool],
        "tool_choice": "required",
        "max_output_tokens": MAX,
        "temperature": 0,
    }
    r = oai(served).responses.create(**ask)
    assert r.status == "completed" and r.incomplete_details is None
    distinct([(o.name, json.loads(o.arguments)) for o in r.output if o.type == "function_call"])
    events = list(oai(served).responses.create(**ask, stream=True))
    (done,) = [e for e in events if e.type == "response.completed"]
    out = done.response.output
    distinct([(o.name, json.loads(o.arguments)) for o in out if o.type == "function_call"])
    assert not [e for e in events if e.type == "response.incomplete"]


def test_anthropic_any_and_named_tool_end_with_tool_use(served: Served) -> None:
    c = anthropic.Anthropic(base_url=served.root, api_key="x", max_retries=0, timeout=120)
    tool = {"name": "get_weather", "description": "Weather for a city", "input_schema": PARAMS}
    for choice in ({"type": "any"}, {"type": "tool", "name": "get_weather"}):
        ask: dict[str, Any] = {
            "model": served.model_id,
            "messages": ASK,
            "tools": [tool],
            "tool_choice": choice,
            "max_tokens": MAX,
            "extra_body": {"temperature": 0},
        }
        r = c.messages.create(**ask)
        assert r.stop_reason == "tool_use", choice
        distinct([(b.name, b.input) for b in r.content if b.type == "tool_use"])
        with c.messages.stream(**ask) as s:
            final = s.get_final_message()
        assert final.stop_reason == "tool_use", choice
        distinct([(b.name, b.input) for b in final.content if b.type == "tool_use"])


def test_ollama_chat_required_stops_after_the_calls(served: Served) -> None:
    body: dict[str, Any] = {
        "model": served.model_id,
        "messages": ASK,
        "tools": [WEATHER],
        "tool_choice": "required",
        "options": {"temperature": 0, "num_predict": MAX},
    }
    url = served.root + "/api/chat"
    r = httpx.post(url, json={**body, "stream": False}, timeout=120).json()
    assert r["done_reason"] == "stop"
    calls = r["message"]["tool_calls"]
    distinct([(c["function"]["name"], c["function"]["arguments"]) for c in calls])
    with httpx.stream("POST", url, json=body, timeout=120) as resp:
        lines = [json.loads(x) for x in resp.iter_lines() if x]
    streamed = [c for x in lines for c in x["message"].get("tool_calls") or []]
    distinct([(c["function"]["name"], c["function"]["arguments"]) for c in streamed])
    assert lines[-1]["done"] and lines[-1]["done_reason"] == "stop"


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_openai_agents_sdk_runs_a_required_tool(served: Served, api: str) -> None:
    agents = pytest.importorskip("agents", reason="openai-agents is part of the dev extra")
    agents.set_tracing_disabled(True)  # no trace upload attempts from a test

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Weather for a city."""
        return f"Sunny in {city}"

    async def run() -> Any:
        client = openai.AsyncOpenAI(base_url=served.base_url, api_key="x", max_retries=0)
        model = (
            agents.OpenAIChatCompletionsModel(model=served.model_id, openai_client=client)
            if api == "chat"
            else agents.OpenAIResponsesModel(model=served.model_id, openai_client=client)
        )
        agent = agents.Agent(
            name="weather",
            instructions="Answer with the weather tool.",
            tools=[get_weather],
            model=model,
            model_settings=agents.ModelSettings(
                tool_choice="required", temperature=0, max_tokens=MAX
            ),
            tool_use_behavior="stop_on_first_tool",
        )
        try:
            return await agents.Runner.run(agent, ASK[0]["content"], max_turns=2)
        finally:
            await client.close()

    result = asyncio.run(run())
    assert str(result.final_output).startswith("Sunny in ")


def test_a_call_cut_by_max_tokens_comes_back_as_text_with_the_reason(served: Served) -> None:
    """The forced call's grammar guarantees a call is started; a few tokens cut it short."""
    ask: dict[str, Any] = {
        "model": served.model_id,
        "messages": ASK,
        "tools": [WEATHER],
        "tool_choice": "required",
        "max_tokens": 18,
        "temperature": 0,
    }
    raw = oai(served).chat.completions.with_raw_response.create(**ask)
    assert raw.headers["x-hearth-tool-parse"] == "incomplete"
    body = json.loads(raw.text)["choices"][0]
    assert body["hearth_tool_parse"] == "incomplete" and body["finish_reason"] == "length"
    assert "tool_calls" not in body["message"]
    assert body["message"]["content"].startswith('<tool_call>\n{"name": "get_weather"')
    chunks = list(oai(served).chat.completions.create(**ask, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == body["message"]["content"]
    last = chunks[-1].choices[0]
    assert last.finish_reason == "length" and last.model_extra["hearth_tool_parse"] == "incomplete"
    ollama = httpx.post(
        served.root + "/api/chat",
        json={
            "model": served.model_id,
            "messages": ASK,
            "tools": [WEATHER],
            "tool_choice": "required",
            "options": {"temperature": 0, "num_predict": 18},
            "stream": False,
        },
        timeout=120,
    )
    assert ollama.headers["x-hearth-tool-parse"] == "incomplete"
    assert ollama.json()["message"]["content"].startswith('<tool_call>\n{"name": "get_weather"')
    assert not ollama.json()["message"].get("tool_calls")


def test_the_reason_is_on_every_protocols_body(served: Served) -> None:
    """Responses (the response object, in response.incomplete too), Anthropic (the message, its
    message_delta) and Ollama (beside done_reason, whole and on the last streamed line)."""
    cut = 18  # the forced call is started, then cut short
    tool = {"type": "function", "name": "get_weather", "parameters": PARAMS}
    ask: dict[str, Any] = {
        "model": served.model_id,
        "input": ASK[0]["content"],
        "tools": [tool],
        "tool_choice": "required",
        "max_output_tokens": cut,
        "temperature": 0,
    }
    url = served.root + "/v1/responses"
    whole = httpx.post(url, json=ask, timeout=120)
    assert whole.headers["x-hearth-tool-parse"] == "incomplete"
    assert whole.json()["hearth_tool_parse"] == "incomplete"
    assert not [o for o in whole.json()["output"] if o["type"] == "function_call"]
    events = list(oai(served).responses.create(**ask, stream=True))
    last = events[-1].response
    assert events[-1].type == "response.incomplete" and last.model_extra["hearth_tool_parse"] == (
        "incomplete"
    )

    c = anthropic.Anthropic(base_url=served.root, api_key="x", max_retries=0, timeout=120)
    msg: dict[str, Any] = {
        "model": served.model_id,
        "messages": ASK,
        "tools": [{"name": "get_weather", "input_schema": PARAMS}],
        "tool_choice": {"type": "any"},
        "max_tokens": cut,
        "extra_body": {"temperature": 0},
    }
    r = c.messages.create(**msg)
    assert r.stop_reason == "max_tokens" and r.model_extra["hearth_tool_parse"] == "incomplete"
    assert not [b for b in r.content if b.type == "tool_use"]
    with c.messages.stream(**msg) as s:
        deltas = [e for e in s if e.type == "message_delta"]
    assert [d.delta.model_extra.get("hearth_tool_parse") for d in deltas] == ["incomplete"]

    body: dict[str, Any] = {
        "model": served.model_id,
        "messages": ASK,
        "tools": [WEATHER],
        "tool_choice": "required",
        "options": {"temperature": 0, "num_predict": cut},
    }
    api = served.root + "/api/chat"
    done = httpx.post(api, json={**body, "stream": False}, timeout=120).json()
    assert done["done_reason"] == "length" and done["hearth_tool_parse"] == "incomplete"
    with httpx.stream("POST", api, json=body, timeout=120) as resp:
        lines = [json.loads(x) for x in resp.iter_lines() if x]
    assert lines[-1]["done"] and lines[-1]["hearth_tool_parse"] == "incomplete"
    assert not any("hearth_tool_parse" in x for x in lines[:-1])
