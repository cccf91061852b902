"""POST /v1/messages/count_tokens on SmolLM2 through the real anthropic client: the count is
the prompt /v1/messages then reports for the same body (same template, tools, tokenizer)."""

from __future__ import annotations

from typing import Any

import anthropic
import pytest

from tests.conftest import Served

TOOLS: list[Any] = [
    {
        "name": "get_weather",
        "description": "The weather in a city",
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    }
]
MESSAGES: list[Any] = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": "Let me look."},
    {"role": "user", "content": [{"type": "text", "text": "Quickly, please."}]},
]


def client(s: Served) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=s.root, api_key="x", max_retries=0, timeout=120)


@pytest.mark.parametrize("tools", [False, True], ids=["plain", "tools"])
def test_count_tokens_is_the_prompt_messages_reports(served: Served, tools: bool) -> None:
    c = client(served)
    extra: dict[str, Any] = {"tools": TOOLS} if tools else {}
    body: dict[str, Any] = {
        "model": served.model_id,
        "system": "You are terse.",
        "messages": MESSAGES,
        **extra,
    }
    counted = c.messages.count_tokens(**body)
    answered = c.messages.create(max_tokens=1, **body)
    assert counted.input_tokens == answered.usage.input_tokens
    assert counted.input_tokens > 20


def test_tools_are_counted(served: Served) -> None:
    c = client(served)
    body: dict[str, Any] = {"model": served.model_id, "messages": MESSAGES}
    plain = c.messages.count_tokens(**body).input_tokens
    with_tools = c.messages.count_tokens(tools=TOOLS, **body).input_tokens
    assert with_tools > plain + 10, "the tool's schema is in the rendered prompt"


def test_count_tokens_errors(served: Served) -> None:
    c = client(served)
    with pytest.raises(anthropic.NotFoundError):
        c.messages.count_tokens(model="no-such-model", messages=MESSAGES)
    with pytest.raises(anthropic.BadRequestError) as bad:
        c.messages.count_tokens(model=served.model_id, messages=[])
    assert bad.value.status_code == 400
