"""Reasoning separation on the real server, with a real model whose template opens <think>."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from app.core.library.gguf import read_header
from tests.conftest import Served, serving
from tests.support.gguf_rewrite import copy_with_template

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def think_served(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> Iterator[Served]:
    src = tmp_path_factory.mktemp("think-src")
    template = (
        read_header(smollm2_path).chat_template
        # Qwen3-style: thinking unless the request says enable_thinking=false; gpt-oss-style
        # reasoning_effort shown in the prompt
        + "{% if add_generation_prompt %}"
        + "{% if reasoning_effort is defined %}Reasoning: {{ reasoning_effort }}\n{% endif %}"
        + "{% if enable_thinking is defined and enable_thinking is false %}"
        + "<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}{% endif %}"
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


def test_template_variables_from_the_request(think_served: Served) -> None:
    c = openai.OpenAI(base_url=think_served.base_url, api_key="x", max_retries=0, timeout=120)
    kw = dict(
        model=think_served.model_id,
        messages=[{"role": "user", "content": "What is 2+2?"}],
        max_tokens=12,
        temperature=0,
    )
    thinking = c.chat.completions.create(**kw)
    assert thinking.choices[0].message.model_dump()["reasoning_content"]
    off = c.chat.completions.create(
        **kw, extra_body={"chat_template_kwargs": {"enable_thinking": False}}
    )
    msg = off.choices[0].message.model_dump()
    assert msg["content"] and not msg.get("reasoning_content"), "the template closed the block"
    assert off.usage.prompt_tokens > thinking.usage.prompt_tokens  # the empty think block
    effort = c.chat.completions.create(**kw, reasoning_effort="high")
    assert effort.usage.prompt_tokens > thinking.usage.prompt_tokens  # "Reasoning: high"
    rkw = dict(model=think_served.model_id, input="What is 2+2?", max_output_tokens=4)
    plain_r = c.responses.create(**rkw)
    high_r = c.responses.create(**rkw, reasoning={"effort": "high"})
    assert high_r.usage.input_tokens > plain_r.usage.input_tokens  # Responses spells it so
    # any other name is just a variable, even one that is a parameter name of our own code
    odd = c.chat.completions.create(**kw, extra_body={"chat_template_kwargs": {"self": 1}})
    assert odd.choices[0].message.model_dump()["reasoning_content"]
    for body, param in (
        ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
        ({"chat_template_kwargs": ["enable_thinking"]}, "chat_template_kwargs"),
        (
            {
                "chat_template_kwargs": {
                    "x": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]
                }
            },
            "chat_template_kwargs",
        ),
        ({"reasoning_effort": "extreme"}, "reasoning_effort"),
    ):
        with pytest.raises(openai.BadRequestError) as ei:
            c.chat.completions.create(**kw, extra_body=body)
        assert ei.value.body["param"] == param, body
