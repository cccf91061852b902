"""The Ollama adapter on recorded delta sequences: no model, no server. Exact NDJSON lines for
text, thinking, tool calls split at every point, logprobs, an error mid-stream, a cut stream and
usage; and the request parsing with the shared bounds (stop, tools, top_logprobs) every protocol
has."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest

from app.core.inference.generation import Completion
from app.core.requests import ChatRequest, CompletionRequest, ToolChoice
from app.core.types import (
    ChatMessage,
    Constraint,
    Delta,
    Timings,
    ToolCall,
    ToolCallDelta,
    Usage,
)
from app.errors import GenerationTimeout, InvalidRequest, ModelNotFound, UnsupportedParameter
from app.server.protocols import OLLAMA
from app.server.protocols.base import Context, Frame
from app.server.protocols.common import MAX_STOP, MAX_TOOLS
from app.server.protocols.ollama.parse import (
    Key,
    parse_chat,
    parse_embed,
    parse_embeddings_legacy,
    parse_generate,
)
from app.server.protocols.ollama.render import NdjsonStream, load_response, whole_response

from ..replay import lp, lp_json

T0 = 1_700_000_000.0
STAMP = "2023-11-14T22:13:20Z"  # T0 as Ollama writes it
START_NS = 5_000_000_000
NOW_NS = 7_500_000_000
FINAL = Delta(
    finish_reason="stop",
    usage=Usage(prompt_tokens=11, completion_tokens=3),
    timings=Timings(prompt_n=11, prompt_ms=20.0, predicted_n=3, predicted_ms=30.0),
)
COUNTERS = {
    "done_reason": "stop",
    "total_duration": NOW_NS - START_NS,
    "load_duration": 1234,
    "prompt_eval_count": 11,
    "prompt_eval_duration": 20_000_000,
    "eval_count": 3,
    "eval_duration": 30_000_000,
}


def ctx() -> Context:
    return Context("m", started_ns=START_NS, load_ns=1234)


def stream(key: Key = "message", think: bool = True) -> NdjsonStream:
    return NdjsonStream(key, think, ctx(), clock=lambda: T0, perf_ns=lambda: NOW_NS)


def play(deltas: Sequence[Delta], key: Key = "message", think: bool = True) -> list[Any]:
    """What respond() writes for these deltas (the last one final): delta() for each with a
    payload, then end_choice() and close(); the frames' data, as the NDJSON lines."""
    r = stream(key, think)
    frames: list[Frame] = [*r.open()]
    for d in deltas:
        if d.text or d.reasoning or d.tool_calls or d.logprobs:
            frames += r.delta(0, d)
    frames += r.end_choice(0, deltas[-1])
    frames += r.close([deltas[-1]])
    assert r.framing == "ndjson"
    return [f.data for f in frames]


def line(message: dict[str, Any]) -> dict[str, Any]:
    return {"model": "m", "created_at": STAMP, "message": message, "done": False}


DONE = {
    "model": "m",
    "created_at": STAMP,
    "message": {"role": "assistant", "content": ""},
    "done": True,
    **COUNTERS,
}


def whole(results: Sequence[Completion], key: Key = "message", think: bool = True) -> Any:
    return whole_response(key, think, results, ctx(), clock=lambda: T0, perf_ns=lambda: NOW_NS)


def completion(deltas: Sequence[Delta]) -> Completion:
    c = Completion()
    for d in deltas:
        c.add(d)
    return c


# -- rendering ---------------------------------------------------------------------------------
def test_text_lines_then_the_done_line_with_ollama_s_counters() -> None:
    deltas = [
        Delta(text="Hel"),
        Delta(text="lo"),
        Delta(text="!", finish_reason="stop", usage=FINAL.usage, timings=FINAL.timings),
    ]
    assert play(deltas) == [
        line({"role": "assistant", "content": "Hel"}),
        line({"role": "assistant", "content": "lo"}),
        line({"role": "assistant", "content": "!"}),
        DONE,
    ]
    assert whole([completion(deltas)]) == {
        **DONE,
        "message": {"role": "assistant", "content": "Hello!"},
    }


def test_generate_writes_response_and_thinking_fields() -> None:
    deltas = [Delta(reasoning="hmm"), Delta(text="4"), FINAL]
    assert play(deltas, key="response") == [
        {"model": "m", "created_at": STAMP, "response": "", "thinking": "hmm", "done": False},
        {"model": "m", "created_at": STAMP, "response": "4", "done": False},
        {"model": "m", "created_at": STAMP, "response": "", "done": True, **COUNTERS},
    ]
    assert whole([completion(deltas)], key="response") == {
        "model": "m",
        "created_at": STAMP,
        "response": "4",
        "thinking": "hmm",
        "done": True,
        **COUNTERS,
    }


def test_usage_and_done_reason() -> None:
    length = Delta(finish_reason="length", usage=Usage(5, 7), timings=Timings(5, 1.5, 7, 2.5))
    (done,) = play([length])
    assert done["done_reason"] == "length" and done["prompt_eval_count"] == 5
    assert done["eval_count"] == 7 and done["prompt_eval_duration"] == 1_500_000
    assert done["eval_duration"] == 2_500_000
    # a tool-call finish is "stop" for Ollama's clients; no usage is counted as zero
    (done,) = play([Delta(finish_reason="tool_calls")])
    assert done["done_reason"] == "stop" and done["eval_count"] == done["prompt_eval_count"] == 0


def test_thinking_goes_to_its_field_or_back_into_content_with_think_false() -> None:
    deltas = [
        Delta(reasoning="two"),
        Delta(reasoning=" plus two", text="4"),
        Delta(text="."),
        FINAL,
    ]
    assert play(deltas) == [
        line({"role": "assistant", "content": "", "thinking": "two"}),
        line({"role": "assistant", "content": "4", "thinking": " plus two"}),
        line({"role": "assistant", "content": "."}),
        DONE,
    ]
    off = play(deltas, think=False)
    assert [x["message"]["content"] for x in off[:-1]] == [
        "<think>two",
        " plus two</think>\n\n4",
        ".",
    ]
    assert all("thinking" not in x["message"] for x in off)
    # the whole answer says the same as the stream, both ways
    for think in (True, False):
        lines = play(deltas, think=think)[:-1]
        w = whole([completion(deltas)], think=think)["message"]
        assert w["content"] == "".join(x["message"]["content"] for x in lines)
        assert w.get("thinking", "") == "".join(x["message"].get("thinking", "") for x in lines)
    # a block never closed stays open in the content
    assert whole([completion([Delta(reasoning="hm"), FINAL])], think=False)["message"] == {
        "role": "assistant",
        "content": "<think>hm",
    }


def test_each_line_carries_its_tokens_logprobs_and_the_whole_answer_all_of_them() -> None:
    deltas = [
        Delta(text="Hel", logprobs=(lp("Hel", -0.5, ("Hel", -0.5), ("Hi", -1.0)),)),
        # the text of a held-back token (a stop string's start) comes later: a line for its
        # logprobs alone, as Ollama sends them while its parsers buffer
        Delta(logprobs=(lp("lo", -0.25, ("lo", -0.25), ("p", -2.0)),)),
        Delta(text="lo!", logprobs=(lp("!", -0.125, ("!", -0.125), (".", -3.0)),)),
        FINAL,
    ]
    assert play(deltas) == [
        {
            **line({"role": "assistant", "content": "Hel"}),
            "logprobs": [lp_json("Hel", -0.5, ("Hel", -0.5), ("Hi", -1.0))],
        },
        {
            **line({"role": "assistant", "content": ""}),
            "logprobs": [lp_json("lo", -0.25, ("lo", -0.25), ("p", -2.0))],
        },
        {
            **line({"role": "assistant", "content": "lo!"}),
            "logprobs": [lp_json("!", -0.125, ("!", -0.125), (".", -3.0))],
        },
        DONE,
    ]
    assert whole([completion(deltas)]) == {
        **DONE,
        "message": {"role": "assistant", "content": "Hello!"},
        "logprobs": [
            lp_json("Hel", -0.5, ("Hel", -0.5), ("Hi", -1.0)),
            lp_json("lo", -0.25, ("lo", -0.25), ("p", -2.0)),
            lp_json("!", -0.125, ("!", -0.125), (".", -3.0)),
        ],
    }
    # /api/generate: the same list beside "response"; top_logprobs 0: each token alone
    gen = [Delta(text="4", logprobs=(lp("4", -0.1),)), FINAL]
    assert play(gen, key="response")[0] == {
        "model": "m",
        "created_at": STAMP,
        "response": "4",
        "done": False,
        "logprobs": [lp_json("4", -0.1)],
    }
    assert whole([completion(gen)], key="response")["logprobs"] == [lp_json("4", -0.1)]


def test_without_logprobs_there_is_no_logprobs_field() -> None:
    deltas = [Delta(text="Hi"), Delta(reasoning="hm"), FINAL]
    for key in ("message", "response"):
        assert all("logprobs" not in x for x in play(deltas, key=key))  # type: ignore[arg-type]
        assert "logprobs" not in whole([completion(deltas)], key=key)  # type: ignore[arg-type]


ARGS = '{"city": "Paris", "days": [1, 2]}'


def _call_deltas(args: str, cuts: Sequence[int]) -> list[Delta]:
    """One call: its start, then its arguments in pieces cut at ``cuts``."""
    bounds = [0, *cuts, len(args)]
    frags = [args[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    return [
        Delta(tool_calls=(ToolCallDelta(0, "call_1", "get_weather"),)),
        *(Delta(tool_calls=(ToolCallDelta(0, arguments=f),)) for f in frags if f),
    ]


CALL = {
    "id": "call_1",
    "function": {"index": 0, "name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}},
}


@pytest.mark.parametrize("cut", range(len(ARGS) + 1))
def test_a_tool_call_split_anywhere_comes_out_once_whole(cut: int) -> None:
    for final in (
        FINAL,
        Delta(finish_reason="tool_calls", usage=FINAL.usage, timings=FINAL.timings),
    ):
        deltas = [*_call_deltas(ARGS, [cut]), final]
        out = play(deltas)
        calls = [x for x in out if x.get("message", {}).get("tool_calls")]
        assert calls == [line({"role": "assistant", "content": "", "tool_calls": [CALL]})]
        assert out[-1] == DONE and out.index(calls[0]) == len(out) - 2
        assert whole([completion(deltas)])["message"] == {
            "role": "assistant",
            "content": "",
            "tool_calls": [CALL],
        }


def test_a_call_goes_out_as_soon_as_its_arguments_are_an_object() -> None:
    # two cuts: the call is written with the fragment that closes the object, not before
    deltas = _call_deltas(ARGS, [5, len(ARGS) - 1])
    r = stream()
    seen = [r.delta(0, d) for d in deltas]
    assert [len(s) for s in seen] == [0, 0, 0, 1]
    assert seen[-1][0].data["message"]["tool_calls"] == [CALL]
    assert r.end_choice(0, FINAL) == [Frame(DONE)]


def test_two_calls_and_arguments_that_never_become_an_object() -> None:
    first = [Delta(tool_calls=(ToolCallDelta(0, "a", "f"), ToolCallDelta(0, arguments='{"x": ')))]
    # the second call's start ends the first, whose arguments are not JSON: {} (logged)
    second = [
        Delta(tool_calls=(ToolCallDelta(1, "b", "g"),)),
        Delta(tool_calls=(ToolCallDelta(1, arguments="[1]"),)),
    ]
    out = play([*first, *second, FINAL])
    f = {"id": "a", "function": {"index": 0, "name": "f", "arguments": {}}}
    g = {"id": "b", "function": {"index": 1, "name": "g", "arguments": {}}}
    assert out == [
        line({"role": "assistant", "content": "", "tool_calls": [f]}),
        line({"role": "assistant", "content": "", "tool_calls": [g]}),  # flushed at the end
        DONE,
    ]
    assert whole([completion([*first, *second, FINAL])])["message"]["tool_calls"] == [f, g]


def test_an_error_mid_stream_is_one_error_line_and_nothing_after() -> None:
    r = stream()
    frames = r.delta(0, Delta(text="cat, "))
    frames += r.error(GenerationTimeout("the request ran over the server's time limit (2s)"))
    assert [f.data for f in frames] == [
        line({"role": "assistant", "content": "cat, "}),
        {"error": "the request ran over the server's time limit (2s)"},
    ]


def test_a_cut_stream_ends_without_a_done_line() -> None:
    # deltas and no final (respond() raises StreamBroken): the last line is the error
    from app.server.streaming import StreamBroken

    r = stream()
    frames = r.open() + r.delta(0, Delta(text="a"))
    frames += r.error(StreamBroken("the generation ended without a result"))
    data = [f.data for f in frames]
    assert data[-1] == {"error": "the generation ended without a result"}
    assert not any(isinstance(x, dict) and x.get("done") for x in data)
    text = "".join(json.dumps(x) + "\n" for x in data)
    assert '"done": true' not in text


def test_error_body_is_ollama_s_shape() -> None:
    assert OLLAMA.error_body(ModelNotFound("model 'x' does not exist")) == {
        "error": "model 'x' does not exist"
    }


def test_load_and_unload_answers() -> None:
    assert load_response("m", "message", False)["message"] == {
        "role": "assistant",
        "content": "",
    }
    r = load_response("m", "response", True)
    assert r["done"] and r["done_reason"] == "unload" and r["response"] == ""


# -- parsing -----------------------------------------------------------------------------------
def ident(name: str) -> str:
    return name.removesuffix(":latest")


def chat_body(**kw: Any) -> dict[str, Any]:
    return {"model": "m:latest", "messages": [{"role": "user", "content": "hi"}], **kw}


def test_chat_body_to_request() -> None:
    p = parse_chat(
        chat_body(
            options={"temperature": 0, "num_predict": 12, "stop": ["\n", ""], "seed": 3},
            format="json",
            think="high",
            keep_alive="5m",
            stream=False,
        ),
        ident,
    )
    req = p.request
    assert isinstance(req, ChatRequest) and p.model == req.model == "m"
    assert (p.key, p.stream, p.think, p.ttl, req.ttl) == ("message", False, True, 300.0, 300.0)
    assert req.messages == (ChatMessage("user", "hi"),) and req.max_tokens == 12
    assert req.stop == ("\n",) and req.sampling.seed == 3 and req.sampling.temperature == 0
    assert req.sampling.top_k == 40 and req.sampling.top_p == 0.9  # Ollama's defaults
    assert req.sampling.repeat_penalty == 1.1
    assert req.constraint == Constraint("json_object")
    assert req.template_vars == {"enable_thinking": True, "reasoning_effort": "high"}
    assert req.tools == () and req.tool_choice.mode == "none"


def test_history_with_ollama_tool_calls_becomes_typed_history() -> None:
    messages = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": "",
            "thinking": "look it up",
            "tool_calls": [
                {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                {"id": "call_x", "function": {"name": "get_time", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_name": "get_time", "content": "noon"},
        {"role": "tool", "tool_name": "get_weather", "content": "18 C"},
        {"role": "tool", "tool_call_id": "call_9", "content": "?"},
    ]
    req = parse_chat(chat_body(messages=messages), ident).request
    assert isinstance(req, ChatRequest)
    assert req.messages == (
        ChatMessage("user", "weather?"),
        ChatMessage(
            "assistant",
            "",
            tool_calls=(
                ToolCall("call_1_0", "get_weather", '{"city": "Paris"}'),
                ToolCall("call_x", "get_time", "{}"),
            ),
        ),
        ChatMessage("tool", "noon", name="get_time", tool_call_id="call_x"),
        ChatMessage("tool", "18 C", name="get_weather", tool_call_id="call_1_0"),
        ChatMessage("tool", "?", tool_call_id="call_9"),
    )


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def test_tools_are_auto() -> None:
    req = parse_chat(chat_body(tools=[WEATHER]), ident).request
    assert isinstance(req, ChatRequest) and req.tool_choice == ToolChoice("auto")
    assert [t.name for t in req.tools] == ["get_weather"]


def test_hearth_s_tool_choice_extension_takes_openai_s_spellings() -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    req = parse_chat(chat_body(tools=[WEATHER], tool_choice=named), ident).request
    assert isinstance(req, ChatRequest)
    assert req.tool_choice == ToolChoice("named", "get_weather", False)
    with pytest.raises(InvalidRequest) as ei:
        parse_chat(
            chat_body(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "x"}}),
            ident,
        )
    assert ei.value.param == "tool_choice"


def _deep(n: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(n):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def _tool(name: str, params: Any = None) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": params}}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (chat_body(options={"stop": ["x"] * (MAX_STOP + 1)}), "options.stop"),
        (chat_body(options={"stop": "s" * 2048}), "options.stop"),
        (chat_body(options={"stop": [1]}), "options.stop"),
        (chat_body(tools=[_tool(f"t{i}") for i in range(MAX_TOOLS + 1)]), "tools"),
        (chat_body(tools=[_tool("bad name!")]), "tools[0]"),
        (chat_body(tools=[_tool("deep", _deep(200))]), "tools[0].function.parameters"),
        (chat_body(options={"num_predict": 0}), "options.num_predict"),
        (chat_body(options="hot"), "options"),
        (chat_body(format="xml"), "format"),
        (chat_body(think="maybe"), "think"),
        (chat_body(messages=[{"role": "wizard", "content": "x"}]), "messages[0].role"),
        (chat_body(messages=[{"role": "user"}]), "messages[0].content"),
        (
            chat_body(messages=[{"role": "user", "content": "x", "tool_calls": [{}]}]),
            "messages[0].tool_calls",
        ),
        (
            chat_body(messages=[{"role": "assistant", "content": "", "tool_calls": [{}]}]),
            "messages[0].tool_calls[0]",
        ),
        (chat_body(messages="hello"), "messages"),
        (chat_body(logprobs="yes"), "logprobs"),
        (chat_body(top_logprobs=3), "top_logprobs"),
        (chat_body(logprobs=False, top_logprobs=3), "top_logprobs"),
        (chat_body(logprobs=True, top_logprobs=21), "top_logprobs"),
        (chat_body(logprobs=True, top_logprobs=-1), "top_logprobs"),
        (chat_body(logprobs=True, top_logprobs="5"), "top_logprobs"),
    ],
)
def test_bad_chat_bodies_are_400_naming_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as ei:
        parse_chat(body, ident)
    assert ei.value.param == param, ei.value.message


def test_logprobs_and_top_logprobs_on_chat_and_generate() -> None:
    gens = [
        {"model": "m", "prompt": "1, 2,", "raw": True},  # a completion
        {"model": "m", "prompt": "Hi"},  # a templated chat
    ]

    def asked(**kw: Any) -> list[int | None]:
        chat = parse_chat(chat_body(**kw), ident).request
        reqs = [chat, *(parse_generate({**g, **kw}, ident).request for g in gens)]
        assert isinstance(reqs[1], CompletionRequest) and isinstance(reqs[2], ChatRequest)
        return [r.logprobs for r in reqs]  # type: ignore[union-attr]

    assert asked() == [None, None, None]
    assert asked(logprobs=False) == [None, None, None]
    assert asked(logprobs=True) == [0, 0, 0]
    assert asked(logprobs=True, top_logprobs=5) == [5, 5, 5]
    assert asked(logprobs=True, top_logprobs=20) == [20, 20, 20]
    # 0 is Ollama's default for top_logprobs (its clients may send it with logprobs off)
    assert asked(top_logprobs=0) == [None, None, None]
    for bad in ({"top_logprobs": 2}, {"logprobs": True, "top_logprobs": 21}):
        for g in gens:
            with pytest.raises(InvalidRequest) as ei:
                parse_generate({**g, **bad}, ident)
            assert ei.value.param == "top_logprobs"
    # checked before an empty prompt loads the model, as every field is
    with pytest.raises(InvalidRequest) as ei:
        parse_generate({"model": "m", "top_logprobs": 4}, ident)
    # Ollama's error shape, as every other error of these routes
    assert OLLAMA.error_body(ei.value) == {"error": "'top_logprobs' needs 'logprobs': true"}


def test_the_stop_bound_is_the_one_of_every_protocol() -> None:
    ok = parse_chat(chat_body(options={"stop": ["x"] * MAX_STOP}), ident).request
    assert ok is not None and len(ok.stop) == MAX_STOP
    with pytest.raises(InvalidRequest):
        parse_generate(
            {"model": "m", "prompt": "x", "raw": True, "options": {"stop": ["y"] * 17}}, ident
        )


@pytest.mark.parametrize(
    ("body", "param"),
    [
        # the suffix is taken (fill-in-the-middle); what Ollama drops beside it is refused
        ({"prompt": "x", "suffix": "y", "raw": True}, "raw"),
        ({"prompt": "x", "suffix": "y", "system": "s"}, "system"),
        ({"prompt": "x", "tools": [WEATHER]}, "tools"),
        ({"prompt": "x", "template": "{{ .Prompt }}"}, "template"),
    ],
)
def test_unsupported_fields_are_400(body: dict[str, Any], param: str) -> None:
    # images parse now (tests/server/protocols/test_image_parts.py); a model without vision
    # refuses them at the service (tests/server/edge/test_vision.py)
    parse = parse_chat if "messages" in body else parse_generate
    with pytest.raises(UnsupportedParameter) as ei:
        parse({"model": "m", **body}, ident)
    assert ei.value.param == param


def test_generate_raw_is_a_completion_and_templated_is_a_chat() -> None:
    raw = parse_generate(
        {"model": "m", "prompt": "1, 2,", "raw": True, "format": {"type": "object"}}, ident
    )
    assert isinstance(raw.request, CompletionRequest) and raw.request.prompts == ("1, 2,",)
    assert raw.request.constraint is not None and raw.request.constraint.kind == "json_schema"
    t = parse_generate({"model": "m", "prompt": "Hi", "system": "Be brief.", "think": False}, ident)
    assert isinstance(t.request, ChatRequest) and t.key == "response" and not t.think
    assert t.request.messages == (ChatMessage("system", "Be brief."), ChatMessage("user", "Hi"))
    assert t.request.template_vars == {"enable_thinking": False}


def test_empty_prompt_or_messages_is_a_load_or_an_unload() -> None:
    p = parse_generate({"model": "m:latest", "keep_alive": 0}, ident)
    assert p.request is None and p.model == "m" and p.ttl == 0
    p = parse_chat({"model": "m", "messages": [], "keep_alive": -1}, ident)
    assert p.request is None and p.key == "message" and p.ttl is None


def test_unknown_model_is_resolved_first() -> None:
    def resolve(name: str) -> str:
        raise ModelNotFound(f"model '{name}' does not exist")

    with pytest.raises(ModelNotFound):
        parse_chat(chat_body(format="xml"), resolve)


def test_embed_inputs() -> None:
    req = parse_embed({"model": "e", "input": "a"}, ident)
    assert req.inputs == ("a",)
    with pytest.raises(InvalidRequest) as ei:
        parse_embed({"model": "e", "input": ["x"] * 2049}, ident)
    assert "2048" in ei.value.message and ei.value.param == "input"
    for bad in ([], [""], [1, 2], None):
        with pytest.raises(InvalidRequest):
            parse_embed({"model": "e", "input": bad}, ident)
    assert parse_embeddings_legacy({"model": "e", "prompt": "p"}, ident).inputs == ("p",)
