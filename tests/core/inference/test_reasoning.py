"""<think> separation on raw outputs in the documented formats, streamed in every split."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.core.inference.reasoning import ReasoningSplitter, prompt_opens_reasoning


def run(text: str, *, inside: bool = False, step: int = 1) -> tuple[str, str]:
    s = ReasoningSplitter(inside=inside)
    rs, ans = [], []
    for i in range(0, len(text), step):
        r, a = s.feed(text[i : i + step])
        rs.append(r)
        ans.append(a)
    r, a = s.flush()
    return "".join(rs) + r, "".join(ans) + a


CASES = [
    # Qwen3 / DeepSeek-R1: a think block first, then the answer after blank lines
    (
        "<think>\nLet me add 2 and 2.\n</think>\n\nThe answer is 4.",
        False,
        ("\nLet me add 2 and 2.\n", "The answer is 4."),
    ),
    # the template opened the block: the model starts inside it
    ("The user greets me.</think>\n\nHello!", True, ("The user greets me.", "Hello!")),
    # no reasoning at all
    ("Just an answer.", False, ("", "Just an answer.")),
    # a tag after the answer started is text, not reasoning (code, quotes)
    (
        "Use <think> tags like <think>x</think>.",
        False,
        ("", "Use <think> tags like <think>x</think>."),
    ),
    # never closed (cut by max_tokens): all of it is reasoning
    ("<think>still thinking", False, ("still thinking", "")),
    # multi-byte text and an empty think block
    ("<think></think>Grüße, 世界 🌊", False, ("", "Grüße, 世界 🌊")),
    # a lone "<thi" that never becomes a tag is released at the end
    ("<thi", False, ("", "<thi")),
]


@pytest.mark.parametrize(("text", "inside", "expected"), CASES)
@pytest.mark.parametrize("step", [1, 2, 3, 5, 8, 1000])
def test_every_split(text: str, inside: bool, expected: tuple[str, str], step: int) -> None:
    assert run(text, inside=inside, step=step) == expected


@pytest.mark.parametrize(("text", "inside", "expected"), CASES)
def test_every_single_cut_point(text: str, inside: bool, expected: tuple[str, str]) -> None:
    for cut in range(len(text) + 1):
        s = ReasoningSplitter(inside=inside)
        r1, a1 = s.feed(text[:cut])
        r2, a2 = s.feed(text[cut:])
        r3, a3 = s.flush()
        assert (r1 + r2 + r3, a1 + a2 + a3) == expected, cut


def test_prompt_opens_reasoning() -> None:
    assert prompt_opens_reasoning("<|im_start|>assistant\n<think>\n")
    assert prompt_opens_reasoning("...<think>")
    assert not prompt_opens_reasoning("<think>done</think>\n<|im_start|>assistant\n")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n")
    assert not prompt_opens_reasoning("explain the <think> tag please\n<|im_start|>assistant\n")


# -- gpt-oss harmony channels ----------------------------------------------------------------------

from app.core.inference.reasoning import HarmonySplitter, is_harmony_template, reasoning_splitter  # noqa: E402
from app.core.inference.tools import ToolCallParser  # noqa: E402
from tests.support.service_calls import chat  # noqa: E402


def run_harmony(text: str, cuts: list[int]) -> tuple[str, str]:
    s = HarmonySplitter()
    rs, ans = [], []
    prev = 0
    for c in [*cuts, len(text)]:
        r, a = s.feed(text[prev:c])
        rs.append(r)
        ans.append(a)
        prev = c
    r, a = s.flush()
    return "".join(rs) + r, "".join(ans) + a


CALL = '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}'
HARMONY_CASES = [
    # as llama.cpp renders it: <|end|> is a control token (no text), <|return|> ends generation
    (
        "<|channel|>analysis<|message|>The user wants 2+2. Easy.<|start|>assistant"
        "<|channel|>final<|message|>2 + 2 = 4.",
        ("The user wants 2+2. Easy.", "2 + 2 = 4."),
    ),
    # every marker rendered (MLX, or a llama.cpp build that renders control tokens)
    (
        "<|channel|>analysis<|message|>Think: 世界 🌊<|end|><|start|>assistant<|channel|>final"
        "<|message|>Grüße!<|return|>",
        ("Think: 世界 🌊", "Grüße!"),
    ),
    # a tool call after reasoning: re-emitted as one block for the harmony tool parser
    (
        "<|channel|>analysis<|message|>Need the weather tool.<|start|>assistant" + CALL,
        ("Need the weather tool.", CALL + "<|call|>"),
    ),
    # the recipient in the role part of the header, <|call|> rendered
    (
        '<|start|>assistant to=functions.lookup<|channel|>commentary json<|message|>{"q":1}<|call|>',
        ("", '<|channel|>commentary to=functions.lookup<|message|>{"q":1}<|call|>'),
    ),
    # a preamble on the commentary channel is shown to the user
    (
        "<|channel|>commentary<|message|>Checking…<|end|><|start|>assistant<|channel|>final"
        "<|message|>Done.",
        ("", "Checking…Done."),
    ),
    # cut by max_tokens inside the analysis: all of it is reasoning
    ("<|channel|>analysis<|message|>still thinking", ("still thinking", "")),
    # a model that does not speak harmony: plain text, untouched
    ("Just an answer with <|channel|> inside.", ("", "Just an answer with <|channel|> inside.")),
]


@pytest.mark.parametrize(("text", "expected"), HARMONY_CASES)
def test_harmony_channels_at_every_cut(text: str, expected: tuple[str, str]) -> None:
    assert run_harmony(text, []) == expected
    for cut in range(len(text) + 1):
        assert run_harmony(text, [cut]) == expected, cut
    assert run_harmony(text, list(range(1, len(text)))) == expected  # one character at a time


def test_harmony_tool_block_reaches_the_parser() -> None:
    text = "<|channel|>analysis<|message|>Weather needed.<|start|>assistant" + CALL
    s, p = HarmonySplitter(), ToolCallParser("harmony")
    reasoning, content, calls, args = "", "", [], ""
    for ch in [*text, None]:
        r, a = s.feed(ch) if ch is not None else s.flush()
        reasoning += r
        for ev in [p.feed(a)] + ([p.flush()] if ch is None else []):
            content += ev.text
            calls += ev.started
            args += "".join(frag for _, frag in ev.arguments)
    assert reasoning == "Weather needed." and content == ""
    assert [c.name for c in calls] == ["get_weather"]
    assert json.loads(args) == {"city": "Paris"}


def test_splitter_choice_follows_the_template() -> None:
    harmony = "{{ '<|start|>assistant<|channel|>final<|message|>' }}"
    assert is_harmony_template(harmony) and not is_harmony_template("<|im_start|>")
    assert isinstance(reasoning_splitter(harmony, "<|start|>assistant"), HarmonySplitter)
    think = reasoning_splitter("{{ '<think>' }}", "<|im_start|>assistant\n<think>\n")
    assert isinstance(think, ReasoningSplitter) and think.inside


HARMONY_TEMPLATE = (
    "{% for m in messages %}<|start|>{{ m.role }}"
    "{% if m.role == 'assistant' %}<|channel|>final{% endif %}"
    "<|message|>{{ m.content }}<|end|>{% endfor %}"
    "{% if tools %}<|start|>developer<|message|>{{ tools | tojson }}<|end|>{% endif %}"
    "<|start|>assistant"
)


async def test_harmony_through_the_service(tmp_path: Path) -> None:
    """The service picks the harmony splitter from the template; reasoning, answer and tool
    calls come out separated, with reasoning tokens counted."""
    from app.core.inference.tools import Tool
    from app.core.library.index import ModelLibrary
    from app.core.service import assemble
    from app.core.types import ChatMessage, LoadOptions, SamplingParams
    from tests.support.fakes import FakeRuntime
    from tests.support.gguf_files import write_model

    lib = ModelLibrary(tmp_path / "lib.json", tmp_path / "models")
    lib.import_path(write_model(tmp_path / "src" / "oss.gguf", chat_template=HARMONY_TEMPLATE))
    (model,) = lib.list()
    pieces = [
        "<|channel|>",
        "analysis",
        "<|message|>",
        "Paris",
        " weather",
        "<|start|>",
        "assistant",
        "<|channel|>",
        "commentary to=functions.get_weather",
        " <|constrain|>json",
        "<|message|>",
        '{"city":',
        ' "Paris"}',
    ]
    h = assemble(lib, {"gguf": FakeRuntime(delay=0.0, pieces=pieces)}, load_defaults=LoadOptions)
    weather = Tool(
        "get_weather", "", {"type": "object", "properties": {"city": {"type": "string"}}}
    )
    try:
        gen = await chat(
            h,
            model.id,
            [ChatMessage("user", "weather in Paris?")],
            sampling=SamplingParams(),
            max_tokens=None,
            tools=[weather],
        )
        reasoning, content, names, args, final = "", "", [], "", None
        async for d in gen:
            reasoning += d.reasoning
            content += d.text
            for c in d.tool_calls:
                names += [c.name] if c.name else []
                args += c.arguments or ""
            final = d if d.finish_reason else final
        assert reasoning == "Paris weather" and content == ""
        assert names == ["get_weather"] and json.loads(args) == {"city": "Paris"}
        assert final is not None and final.finish_reason == "tool_calls"
        assert final.usage is not None and final.usage.reasoning_tokens >= 2
    finally:
        await h.close()
