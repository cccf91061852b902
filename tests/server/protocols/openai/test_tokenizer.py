"""The tokenizer routes' wire shapes, parsed: llama.cpp's and vLLM's /tokenize forms, /detokenize
and /tokenizer_info's query (the real server's answers: tests/server/clients/
test_tokenizer_routes.py)."""

from __future__ import annotations

import pytest

from app.errors import InvalidRequest
from app.server.protocols.common import MAX_PIECES, MAX_TOKENIZE_BYTES
from app.server.protocols.openai import tokenizer as wire


def test_each_form_keeps_its_own_defaults() -> None:
    llama = wire.parse_tokenize({"content": "hi"})
    assert (llama.form, llama.add_special, llama.parse_special) == ("content", False, True)
    vllm = wire.parse_tokenize({"prompt": "hi", "return_token_strs": True})
    assert (vllm.form, vllm.add_special, vllm.return_token_strs) == ("prompt", True, True)
    chat = wire.parse_tokenize({"messages": [{"role": "user", "content": "hi"}]})
    assert chat.chat is not None and chat.chat.add_generation_prompt
    assert not chat.chat.continue_final_message and chat.model == ""


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "prompt"),
        ({"content": "a", "messages": []}, "messages"),
        ({"prompt": "x" * (MAX_TOKENIZE_BYTES + 1)}, "prompt"),
        (
            {"messages": [{"role": "user", "content": "a"}], "chat_template": "{{x}}"},
            "chat_template",
        ),
        (
            {"messages": [{"role": "user", "content": "a"}], "add_special_tokens": True},
            "add_special_tokens",
        ),
        ({"prompt": "a", "add_special_tokens": "yes"}, "add_special_tokens"),
    ],
)
def test_what_cannot_be_honoured_is_a_400_naming_it(body: dict, param: str) -> None:
    with pytest.raises(InvalidRequest) as ei:
        wire.parse_tokenize(body)
    assert ei.value.param == param


def test_detokenize_and_its_bounds() -> None:
    assert wire.parse_detokenize({"tokens": [1, 2]}) == ("", [1, 2])
    for bad in ({"tokens": "1"}, {"tokens": [True]}, {"tokens": [0] * (MAX_PIECES + 1)}):
        with pytest.raises(InvalidRequest) as ei:
            wire.parse_detokenize(bad)
        assert ei.value.param == "tokens"
    assert wire.detokenize_response("sea") == {"content": "sea", "prompt": "sea"}


def test_tokenizer_info_query() -> None:
    assert wire.parse_info_query({"model": "m", "vocab": "true"}, None) == ("m", True)
    assert wire.parse_info_query({}, {"model": "n", "vocab": True}) == ("n", True)
    assert wire.parse_info_query({}, None) == ("", False)
    with pytest.raises(InvalidRequest):
        wire.parse_info_query({"vocab": "maybe"}, None)
