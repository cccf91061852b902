"""Outputs of the real model families, each written in its documented format, through the path
the runtime uses (the reasoning or harmony splitter, then the tool-call parser, inside a
Generation): one call, two calls, text before a call, a call after reasoning, call-like text
inside reasoning (stays reasoning), malformed arguments, a call cut by max_tokens and a call of a
tool the request did not offer; each fed whole, a character at a time and at every 2-way split.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable

import pytest

from app.core.inference.generation import Completion, Generation
from app.core.inference.reasoning import HarmonySplitter, ReasoningSplitter
from app.core.inference.tools import ToolCallParser
from app.core.types import Delta, Usage

Call = tuple[str, str]  # (name, arguments JSON text)
WEATHER: Call = ("get_weather", '{"city": "Paris"}')
TIME: Call = ("get_time", '{"zone": "CET", "hour24": true}')
ROCKETS: Call = ("launch_rockets", '{"count": 3}')  # not offered
BAD: Call = ("get_weather", '{"city": Paris}')  # not JSON
OFFERED = frozenset({"get_weather", "get_time"})
THOUGHT = "The user wants the weather in Paris."
ANSWER = "It is sunny in Paris."


def _kv(args: str, pair: Callable[[str, str], str]) -> str:
    return "".join(
        pair(k, v if isinstance(v, str) else json.dumps(v)) for k, v in json.loads(args).items()
    )


# each family's call text for a list of calls, as its chat template writes an assistant turn
def qwen3(calls: list[Call]) -> str:  # Qwen3 / Hermes 2 Pro
    return "\n".join(
        f'<tool_call>\n{{"name": "{n}", "arguments": {a}}}\n</tool_call>' for n, a in calls
    )


def qwen3coder(calls: list[Call]) -> str:
    return "\n".join(
        f"<tool_call>\n<function={n}>\n"
        + _kv(a, lambda k, v: f"<parameter={k}>\n{v}\n</parameter>\n")
        + "</function>\n</tool_call>"
        for n, a in calls
    )


def harmony(calls: list[Call]) -> str:  # gpt-oss, after the prompt's <|start|>assistant
    return "<|start|>assistant".join(
        f"<|channel|>commentary to=functions.{n} <|constrain|>json<|message|>{a}<|call|>"
        for n, a in calls
    )


def llama3(calls: list[Call]) -> str:  # Llama 3.1-3.3: bare JSON, parallel calls with "; "
    return "; ".join(f'{{"name": "{n}", "parameters": {a}}}' for n, a in calls)


def llama3_tag(calls: list[Call]) -> str:
    return "<|python_tag|>" + llama3(calls)


def mistral(calls: list[Call]) -> str:  # tokenizer v3-v7 (Mistral 7B v0.3, Nemo, Small 3)
    return (
        "[TOOL_CALLS][" + ", ".join(f'{{"name": "{n}", "arguments": {a}}}' for n, a in calls) + "]"
    )


def mistral_v11(calls: list[Call]) -> str:  # tokenizer v11+ (Devstral, Mistral Small 3.2)
    return "".join(f"[TOOL_CALLS]{n}[ARGS]{a}" for n, a in calls)


def deepseek_v3(calls: list[Call]) -> str:  # DeepSeek V3 / R1
    body = "\n".join(
        f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{n}\n```json\n{a}\n```<｜tool▁call▁end｜>"
        for n, a in calls
    )
    return f"<｜tool▁calls▁begin｜>{body}<｜tool▁calls▁end｜>"


def deepseek_v31(calls: list[Call]) -> str:
    body = "".join(
        f"<｜tool▁call▁begin｜>{n}<｜tool▁sep｜>{a}<｜tool▁call▁end｜>" for n, a in calls
    )
    return f"<｜tool▁calls▁begin｜>{body}<｜tool▁calls▁end｜>"


def glm(calls: list[Call]) -> str:  # GLM 4.5 / 4.6
    return "\n".join(
        f"<tool_call>{n}\n"
        + _kv(a, lambda k, v: f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n")
        + "</tool_call>"
        for n, a in calls
    )


def kimi(calls: list[Call]) -> str:  # Kimi K2
    body = "".join(
        f"<|tool_call_begin|>functions.{n}:{i}<|tool_call_argument_begin|>{a}<|tool_call_end|>"
        for i, (n, a) in enumerate(calls)
    )
    return f"<|tool_calls_section_begin|>{body}<|tool_calls_section_end|>"


def granite(calls: list[Call]) -> str:  # Granite 3.x
    return (
        "<|tool_call|>[" + ", ".join(f'{{"name": "{n}", "arguments": {a}}}' for n, a in calls) + "]"
    )


# (label, parser family, writer, arguments as JSON?); every writer is a real model's format
FAMILIES = [
    ("qwen3", "hermes", qwen3, True),
    ("qwen3coder", "qwen3coder", qwen3coder, False),
    ("gpt-oss", "harmony", harmony, True),
    ("llama3", "llama3", llama3, True),
    ("llama3-python-tag", "llama3", llama3_tag, True),
    ("mistral", "mistral", mistral, True),
    ("devstral", "mistral", mistral_v11, True),
    ("deepseek-v3", "deepseek", deepseek_v3, True),
    ("deepseek-v3.1", "deepseek", deepseek_v31, True),
    ("glm", "glm", glm, False),
    ("kimi-k2", "kimi", kimi, True),
    ("granite", "granite", granite, True),
]


def think(family: str, text: str) -> str:
    if family == "harmony":
        return f"<|channel|>analysis<|message|>{text}<|end|><|start|>assistant"
    return f"<think>\n{text}\n</think>\n\n"


def said(family: str, text: str) -> str:
    """Plain answer text, as the family writes it before (or instead of) a call."""
    if family == "harmony":
        return f"<|channel|>final<|message|>{text}"
    return text


def cases() -> list[tuple[str, str, str, str, dict]]:
    """(label, kind, family, output, what comes back)."""
    out = []
    for label, family, write, json_args in FAMILIES:
        one = write([WEATHER])
        mention = 'functions.get_weather({"city": "Paris"})' if family == "harmony" else one
        before = (
            "<|channel|>commentary<|message|>Let me check.<|end|><|start|>assistant" + one
            if family == "harmony"
            else "Let me check." + ("" if write is llama3_tag else "\n\n") + one
            if write is not llama3
            else "Let me check.<|python_tag|>" + one
        )
        rows: list[tuple[str, str, dict]] = [
            ("one", one, {"calls": [WEATHER]}),
            ("two", write([WEATHER, TIME]), {"calls": [WEATHER, TIME]}),
            ("text-before", before, {"calls": [WEATHER], "content": "Let me check."}),
            (
                "after-reasoning",
                think(family, THOUGHT) + one,
                {"calls": [WEATHER], "think": THOUGHT},
            ),
            (
                "call-inside-reasoning",
                think(family, f"I could write {mention} but I know it.") + said(family, ANSWER),
                {"calls": [], "content": ANSWER, "think": mention},
            ),
            (
                "cut-by-max-tokens",
                one[: one.index("Par") + 3],
                {"calls": [], "reason": "incomplete", "in_content": "Par", "finish": "length"},
            ),
            (
                "unknown-tool",
                write([ROCKETS]),
                {"calls": [], "reason": "unknown_tool", "in_content": "launch_rockets"},
            ),
        ]
        if json_args:  # the XML formats' values are text: they cannot be malformed JSON
            rows.append(
                (
                    "malformed-arguments",
                    write([BAD]),
                    {"calls": [], "reason": "malformed_arguments", "in_content": '"city": P'},
                )
            )
        out += [(label, kind, family, raw, want) for kind, raw, want in rows]
    return out


class Recorded:
    """The runtime's stream over recorded pieces: one delta per piece, then the final delta."""

    def __init__(self, pieces: list[str], reason: str) -> None:
        self.pieces, self.reason, self.cancelled = pieces, reason, False

    def __aiter__(self) -> AsyncIterator[Delta]:
        return self._run()

    async def _run(self) -> AsyncIterator[Delta]:
        sent = 0
        for p in self.pieces:
            if self.cancelled:
                break
            sent += 1
            yield Delta(text=p, token_count=1)
        reason = "cancelled" if self.cancelled else self.reason
        yield Delta(finish_reason=reason, usage=Usage(5, sent))  # type: ignore[arg-type]

    def cancel(self) -> None:
        self.cancelled = True


def splits(raw: str) -> list[list[str]]:
    return [[raw], list(raw)] + [[raw[:i], raw[i:]] for i in range(1, len(raw))]


async def answer(family: str, pieces: list[str], reason: str) -> Completion:
    splitter = HarmonySplitter() if family == "harmony" else ReasoningSplitter()
    parser = ToolCallParser(family, names=OFFERED)
    return await Generation("m", 5, Recorded(pieces, reason), splitter, parser).collect()


@pytest.mark.parametrize(
    ("label", "kind", "family", "raw", "want"),
    cases(),
    ids=[f"{c[0]}-{c[1]}" for c in cases()],
)
def test_transcript_at_every_split(
    label: str, kind: str, family: str, raw: str, want: dict
) -> None:
    finish = want.get("finish", "stop")

    async def every() -> list[tuple[list[str], Completion]]:
        return [(p, await answer(family, p, finish)) for p in splits(raw)]

    for pieces, got in asyncio.run(every()):
        where = f"pieces {[len(p) for p in pieces][:2]}"
        calls = [(c.name, json.loads(c.arguments)) for c in got.tool_calls]
        assert calls == [(n, json.loads(a)) for n, a in want["calls"]], where
        assert all(c.id.startswith("call_") for c in got.tool_calls)
        issue = got.final.tool_parse
        assert (issue.reason if issue else None) == want.get("reason"), where
        expected_finish = "tool_calls" if want["calls"] else finish
        assert got.final.finish_reason == expected_finish, where
        if "content" in want:
            assert got.text.strip() == want["content"], where
        elif "in_content" in want:  # the call's text is the answer: nothing of it vanishes
            assert want["in_content"] in got.text, where
        else:
            assert got.text.strip() == "", where
        if "think" in want:
            assert want["think"] in got.reasoning, where
        else:
            assert got.reasoning == "", where
