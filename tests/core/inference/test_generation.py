"""A Generation with tools, on what SmolLM2 really wrote: one call for a single-call choice, then
the end; no content between or after calls; finish_reason "tool_calls"."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from app.core.inference.generation import Completion, Generation
from app.core.inference.tools import Tool, ToolCallParser
from app.core.types import ChatMessage, Delta, LoadOptions, SamplingParams, Usage
from tests.support.service_calls import chat

# SmolLM2-135M (Q8_0, temperature 0) asked "What is the weather in Paris?" with a named
# tool_choice get_weather, under the parallel grammar: its tokens, one block (and a newline) ...
BLOCK = [
    "<", "tool", "_", "call", ">", "\n", '{"', "name", '":', ' "', "g", "et", "_", "weather",
    '",', ' "', "arguments", '":', ' {', '"', "city", '":', ' "', "Paris", '"', "}}", "\n",
    "</", "tool", "_", "call", ">", "\n",
]  # fmt: skip
# ... twice, then max_tokens (80) cut a third block before its name was complete
SMOL_NAMED = BLOCK * 2 + BLOCK[:14]
PROMPT_TOKENS = 7


class Recorded:
    """A GenerationStream over recorded pieces, ending as the worker does: "length" (or
    ``reason``) after the last piece, or "cancelled" with the usage so far at the first step
    after ``cancel()``."""

    def __init__(self, pieces: list[str], reason: str = "length") -> None:
        self.pieces = pieces
        self.reason = reason
        self.cancelled = False
        self.sent = 0

    def __aiter__(self) -> AsyncIterator[Delta]:
        return self._run()

    async def _run(self) -> AsyncIterator[Delta]:
        for p in self.pieces:
            if self.cancelled:
                break
            self.sent += 1
            yield Delta(text=p, token_count=1)
        yield Delta(
            finish_reason="cancelled" if self.cancelled else self.reason,  # type: ignore[arg-type]
            usage=Usage(PROMPT_TOKENS, self.sent, cached_tokens=2),
        )

    def cancel(self) -> None:
        self.cancelled = True


def regroup(pieces: list[str], cut: int) -> list[str]:
    """The same text in other pieces: cut once at character ``cut``, then token by token."""
    text = "".join(pieces)
    return [text[:cut], text[cut:]] if 0 < cut < len(text) else [text]


async def run(gen: Generation) -> tuple[list[Delta], Completion]:
    deltas = [d async for d in gen]
    out = Completion()
    for d in deltas:
        out.add(d)
    return deltas, out


def splits(pieces: list[str]) -> list[list[str]]:
    text = "".join(pieces)
    return [pieces, list(text)] + [regroup(pieces, c) for c in range(0, len(text) + 1, 5)]


@pytest.mark.parametrize("pieces", splits(SMOL_NAMED))
async def test_single_call_choice_ends_after_the_call(pieces: list[str]) -> None:
    stream = Recorded(pieces)
    gen = Generation("m", PROMPT_TOKENS, stream, tools=ToolCallParser("hermes", max_calls=1))
    deltas, out = await run(gen)
    assert [(c.name, json.loads(c.arguments)) for c in out.tool_calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    assert all(not d.text for d in deltas)  # not the "\n" between blocks, nor the cut block
    final = deltas[-1]
    assert final.finish_reason == "tool_calls" and final.error is None
    # the runtime was stopped in the first block
    assert stream.cancelled
    assert len(pieces) <= 2 or "".join(pieces[: stream.sent]).count("<tool_call>") == 1
    # the usage counted until the runtime stopped, cached tokens included
    assert final.usage == Usage(PROMPT_TOKENS, stream.sent, cached_tokens=2)
    assert sum(d.finish_reason is not None for d in deltas) == 1


class Racing(Recorded):
    """A runtime that makes one more token before it sees the cancel (its decode step was
    already running), and counts it in its final usage, as the worker does."""

    async def _run(self) -> AsyncIterator[Delta]:
        late = 0
        for p in self.pieces:
            if self.cancelled:
                if late:
                    break
                late = 1
            self.sent += 1
            yield Delta(text=p, token_count=1)
        yield Delta(finish_reason="cancelled", usage=Usage(PROMPT_TOKENS, self.sent, 2))


async def test_a_token_made_after_the_call_closed_is_not_counted() -> None:
    """The usage of a call choice counts the tokens up to the call's close, whether or not the
    runtime made one more before it saw the cancel (every protocol then reports the same)."""
    counts = []
    for stream in (Recorded(SMOL_NAMED), Racing(SMOL_NAMED)):
        gen = Generation("m", PROMPT_TOKENS, stream, tools=ToolCallParser("hermes", max_calls=1))
        deltas, _ = await run(gen)
        counts.append((deltas[-1].usage.completion_tokens, stream.sent))
    (plain, plain_sent), (raced, raced_sent) = counts
    assert raced_sent == plain_sent + 1, "the racing runtime did make one more"
    assert raced == plain == plain_sent


@pytest.mark.parametrize("pieces", splits(SMOL_NAMED))
async def test_auto_drops_text_after_calls(pieces: list[str]) -> None:
    """No limit on calls: both whole blocks are calls, what lies between and after is not
    content (nor the block max_tokens cut before its name); the stream ran to its end."""
    stream = Recorded(pieces)
    deltas, out = await run(Generation("m", 7, stream, tools=ToolCallParser("hermes")))
    assert [c.name for c in out.tool_calls] == ["get_weather", "get_weather"]
    assert [json.loads(c.arguments) for c in out.tool_calls] == [{"city": "Paris"}] * 2
    assert out.text == "" and not stream.cancelled
    assert deltas[-1].finish_reason == "length"  # cut by max_tokens, as it was


@pytest.mark.parametrize("max_calls", [None, 1])
@pytest.mark.parametrize("cut", range(0, 60, 3))
async def test_text_before_the_first_call_still_streams(max_calls: int | None, cut: int) -> None:
    pieces = regroup(["Let me check.\n", *BLOCK, "Done: sunny."], cut)
    stream = Recorded(pieces, reason="stop")
    parser = ToolCallParser("hermes", max_calls=max_calls)
    deltas, out = await run(Generation("m", 7, stream, tools=parser))
    assert out.text == "Let me check.\n"
    assert [json.loads(c.arguments) for c in out.tool_calls] == [{"city": "Paris"}]
    assert deltas[-1].finish_reason == "tool_calls"


@pytest.mark.parametrize("family", ["mistral", "llama3"])
async def test_formats_without_end_marker_stop_at_the_limit(family: str) -> None:
    """The limit holds inside one block too: a second call in the same list is not started."""
    key = "parameters" if family == "llama3" else "arguments"
    one = f'{{"name": "a", "{key}": {{"x": 1}}}}'
    raw = f"[TOOL_CALLS][{one}, {one}] and text" if family == "mistral" else f"{one}; {one} text"
    for max_calls, names in ((1, ["a"]), (None, ["a", "a"])):
        stream = Recorded([raw], reason="stop")
        deltas, out = await run(
            Generation("m", 7, stream, tools=ToolCallParser(family, max_calls=max_calls))
        )
        assert [c.name for c in out.tool_calls] == names and out.text == ""
        assert deltas[-1].finish_reason == "tool_calls"


HERMES_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if tools %}<tool_call>{{ tools | tojson }}</tool_call>{% endif %}<|im_start|>assistant\n"
)


@pytest.mark.parametrize("parallel", [True, False])
async def test_named_choice_through_the_service(tmp_path: Path, parallel: bool) -> None:
    """The service plans a named choice as one call whatever parallel_tool_calls says, and the
    real worker is stopped after it: the engine writes the first recorded block, then waits to be
    cancelled before the second."""
    from app.core.library.index import ModelLibrary
    from app.core.service import assemble
    from tests.support.fakes import FakeRuntime
    from tests.support.gguf_files import write_model

    lib = ModelLibrary(tmp_path / "lib.json", tmp_path / "models")
    lib.import_path(write_model(tmp_path / "src" / "m.gguf", chat_template=HERMES_TEMPLATE))
    (model,) = lib.list()
    runtime = FakeRuntime(delay=0.0, pieces=SMOL_NAMED, hold_at=len(BLOCK))
    h = assemble(lib, {"gguf": runtime}, load_defaults=LoadOptions)
    params = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    tools = [Tool("get_weather", "", params), Tool("get_time", "", {})]
    try:
        gen = await chat(
            h,
            model.id,
            [ChatMessage("user", "What is the weather in Paris?")],
            sampling=SamplingParams(),
            max_tokens=80,
            tools=tools,
            tool_choice="get_weather",
            parallel_tool_calls=parallel,
        )
        deltas, out = await run(gen)
        (lm,) = runtime.models
        kind, spec = lm.checked_constraints[-1]
        assert kind == "tool_call" and json.loads(spec)["parallel"] is False
        assert [(c.name, json.loads(c.arguments)) for c in out.tool_calls] == [
            ("get_weather", {"city": "Paris"})
        ]
        assert out.text == "" and deltas[-1].finish_reason == "tool_calls"
        usage = deltas[-1].usage
        assert usage is not None and 0 < usage.completion_tokens <= len(BLOCK)
    finally:
        await h.close()
