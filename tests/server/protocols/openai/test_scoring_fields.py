"""Parsing echo, max_tokens 0 and prompt_logprobs (completions and chat), and their 400s;
the echoed logprobs and vLLM's prompt_logprobs shapes as rendered."""

from __future__ import annotations

import pytest

from app.core.inference.generation import Completion
from app.core.types import Delta, PromptToken, TokenLogprob
from app.errors import HearthError
from app.server.protocols.base import Context
from app.server.protocols.openai import parse, render

BASE = {"model": "m", "prompt": "hi"}


def test_echo_and_max_tokens_0_parse() -> None:
    req = parse.parse_completion({**BASE, "echo": True, "max_tokens": 0, "logprobs": 1}).request
    assert (req.echo, req.max_tokens, req.logprobs, req.prompt_logprobs) == (True, 0, 1, None)
    req = parse.parse_completion({**BASE, "prompt": [[1, 2], [1, 3]], "echo": True}).request
    assert req.echo and req.max_tokens == 16 and req.prompts == ((1, 2), (1, 3))
    assert parse.parse_completion(BASE).request.echo is False


def test_prompt_logprobs_parse_on_completions_and_chat() -> None:
    assert parse.parse_completion({**BASE, "prompt_logprobs": 0}).request.prompt_logprobs == 0
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "prompt_logprobs": 20}
    assert parse.parse_chat(chat).request.prompt_logprobs == 20


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({**BASE, "max_tokens": 0}, "max_tokens"),  # without echo: nothing to answer
        ({**BASE, "echo": True, "max_tokens": False}, "max_tokens"),
        ({**BASE, "echo": "yes"}, "echo"),
        ({**BASE, "prompt_logprobs": 21}, "prompt_logprobs"),
        ({**BASE, "prompt_logprobs": -1}, "prompt_logprobs"),
        ({**BASE, "prompt_logprobs": True}, "prompt_logprobs"),
        ({**BASE, "prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
    ],
)
def test_refusals_name_the_field(body: dict, param: str) -> None:
    with pytest.raises(HearthError) as e:
        parse.parse_completion(body)
    assert e.value.param == param


def test_chat_prompt_logprobs_is_not_streamed() -> None:
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with pytest.raises(HearthError) as e:
        parse.parse_chat({**chat, "prompt_logprobs": 1})
    assert e.value.param == "prompt_logprobs"


PROMPT = (
    PromptToken(5, None, None, text="Hi"),
    PromptToken(7, -2.0, 3, ((9, -0.1), (8, -1.0)), " you", (" there", " all")),
)


def test_echo_renders_the_prompt_before_the_answer_with_offsets() -> None:
    req = parse.parse_completion({**BASE, "echo": True, "logprobs": 2, "max_tokens": 1}).request
    done = Completion()
    done.add(Delta(text="hi", prompt=PROMPT))
    done.add(Delta(text="!", logprobs=(TokenLogprob("!", -0.3, (33,), (("!", -0.3, (33,)),)),)))
    done.add(Delta(finish_reason="length"))
    body = render.completion_response(req, [done], Context("m"))
    ch = body["choices"][0]
    assert ch["text"] == "hi!"
    assert ch["logprobs"] == {
        "tokens": ["Hi", " you", "!"],
        "token_logprobs": [None, -2.0, -0.3],
        "top_logprobs": [None, {" there": -0.1, " all": -1.0}, {"!": -0.3}],
        "text_offset": [0, 2, 2],  # the answer's offset: after the prompt as sent ("hi")
    }
    assert "prompt_logprobs" not in ch


def test_prompt_logprobs_render_in_vllms_shape() -> None:
    req = parse.parse_completion({**BASE, "prompt_logprobs": 2}).request
    done = Completion()
    done.add(Delta(prompt=PROMPT))
    done.add(Delta(finish_reason="stop"))
    ch = render.completion_response(req, [done], Context("m"))["choices"][0]
    assert ch["prompt_logprobs"] == [
        None,
        {
            "7": {"logprob": -2.0, "rank": 3, "decoded_token": " you"},
            "9": {"logprob": -0.1, "rank": 1, "decoded_token": " there"},
            "8": {"logprob": -1.0, "rank": 2, "decoded_token": " all"},
        },
    ]
    assert ch["text"] == ""
