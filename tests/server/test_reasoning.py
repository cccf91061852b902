"""Reasoning separation on the real server, with a real model whose template opens <think>."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from app.core.gguf import read_header
from tests.conftest import Served, serving
from tests.gguf_rewrite import copy_with_template

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def think_served(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> Iterator[Served]:
    src = tmp_path_factory.mktemp("think-src")
    template = (
        read_header(smollm2_path).chat_template
        + "{% if add_generation_prompt %}<think>\n{% endif %}"
    )
    model = copy_with_template(smollm2_path, src / "SmolLM2-Think.gguf", template)
    with serving(tmp_path_factory.mktemp("think"), model, reasoning_field_also=True) as s:
        yield s


def test_reasoning_separated_when_the_template_opens_it(think_served: Served) -> None:
    c = openai.OpenAI(base_url=think_served.base_url, api_key="x", max_retries=0, timeout=120)
    msgs = [{"role": "user", "content": "What is 2+2?"}]
    r = c.chat.completions.create(
        model=think_served.model_id, messages=msgs, max_tokens=20, temperature=0
    )
    msg = r.choices[0].message.model_dump()
    # the model never closes the block: everything it wrote is reasoning
    assert msg["reasoning_content"] and msg["reasoning"] == msg["reasoning_content"]
    assert msg["content"] == ""
    assert r.usage.completion_tokens_details.reasoning_tokens == r.usage.completion_tokens > 0
    chunks = list(
        c.chat.completions.create(
            model=think_served.model_id,
            messages=msgs,
            max_tokens=20,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    deltas = [ch.choices[0].delta.model_dump() for ch in chunks if ch.choices]
    streamed = "".join(d.get("reasoning_content") or "" for d in deltas)
    assert streamed == msg["reasoning_content"]
    assert not "".join(d.get("content") or "" for d in deltas)
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens == r.usage.completion_tokens
    # completions stay raw: no splitting
    comp = c.completions.create(
        model=think_served.model_id, prompt="<think>x</think>y", max_tokens=3, temperature=0
    )
    assert comp.choices[0].text is not None
