"""Each API's image shapes parse into the messages' image sources (bytes or URL, and the
parameter they came from) with IMAGE_MARKER in the text where each goes, several per message
and across messages, order kept; literal markers in text are neutralised; bad shapes are 400s
naming the parameter. Pure adapters: no server, no model."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from app.core.inference.images import IMAGE_MARKER, MARKER_LOOKALIKE
from app.core.requests import ChatRequest
from app.errors import InvalidRequest, UnsupportedParameter
from app.server.protocols.anthropic import parse as anthropic
from app.server.protocols.ollama import parse as ollama
from app.server.protocols.openai import parse as openai
from app.server.protocols.responses import parse as responses

A, B, C = b"\x89PNG-a", b"GIF89a-b", b"\xff\xd8-c"  # bytes only: decoding is the server's step


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def data_url(data: bytes, media: str = "image/png") -> str:
    return f"data:{media};base64,{b64(data)}"


def chat(req: ChatRequest | None) -> ChatRequest:
    assert isinstance(req, ChatRequest)
    return req


def images(req: ChatRequest) -> list[tuple[int, str, bytes | None, str | None]]:
    return [
        (i, s.where, s.data, s.url) for i, m in enumerate(req.messages) for s in m.image_sources
    ]


def test_openai_image_url_parts_several_per_message_and_across_messages() -> None:
    body = {
        "model": "m",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "first "},
                    {"type": "image_url", "image_url": {"url": data_url(A), "detail": "low"}},
                    {"type": "text", "text": f" then {IMAGE_MARKER} literal "},
                    {"type": "image_url", "image_url": {"url": "https://example.com/b.png"}},
                ],
            },
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": [{"type": "image_url", "image_url": data_url(C)}]},
        ],
    }
    req = chat(openai.parse_chat(body).request)
    assert req.messages[0].content == (
        f"first {IMAGE_MARKER} then {MARKER_LOOKALIKE} literal {IMAGE_MARKER}"
    )
    assert req.messages[2].content == IMAGE_MARKER
    assert images(req) == [
        (0, "messages[0].content[1].image_url.url", A, None),
        (0, "messages[0].content[3].image_url.url", None, "https://example.com/b.png"),
        (2, "messages[2].content[0].image_url", C, None),
    ]


def test_literal_markers_in_plain_string_content_are_neutralised() -> None:
    body = {"model": "m", "messages": [{"role": "system", "content": IMAGE_MARKER}]}
    req = chat(openai.parse_chat(body).request)
    assert req.messages[0].content == MARKER_LOOKALIKE and not req.messages[0].image_sources


@pytest.mark.parametrize(
    ("part", "param", "kind"),
    [
        ({"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}},
         "messages[0].content[0].image_url.url", InvalidRequest),
        ({"type": "image_url", "image_url": {"url": "data:image/png,notbase64"}},
         "messages[0].content[0].image_url.url", InvalidRequest),
        ({"type": "image_url", "image_url": {"url": "file:///etc/passwd"}},
         "messages[0].content[0].image_url.url", InvalidRequest),
        ({"type": "image_url", "image_url": {"url": 5}},
         "messages[0].content[0].image_url.url", InvalidRequest),
        ({"type": "image_url", "image_url": {"url": data_url(A), "detail": "ultra"}},
         "messages[0].content[0].image_url.detail", InvalidRequest),
        ({"type": "input_audio", "input_audio": {}}, "messages[0].content[0]",
         UnsupportedParameter),
    ],
)  # fmt: skip
def test_openai_bad_image_parts_name_the_parameter(
    part: dict[str, Any], param: str, kind: type[Exception]
) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": [part]}]}
    with pytest.raises(kind) as e:
        openai.parse_chat(body)
    assert getattr(e.value, "param", None) == param and getattr(e.value, "status", 0) == 400


def test_responses_input_image_url_and_data_url_and_file_id() -> None:
    body = {
        "model": "m",
        "input": [
            {
                "role": "user",
                "content": [
                    {"type": "input_image", "image_url": data_url(A)},
                    {"type": "input_text", "text": "and"},
                    {"type": "input_image", "image_url": "http://example.com/x.jpg"},
                ],
            },
            {"role": "user", "content": [{"type": "input_image", "image_url": data_url(B)}]},
        ],
    }
    req = chat(responses.parse_request(body).request)
    assert req.messages[0].content == f"{IMAGE_MARKER}and{IMAGE_MARKER}"
    assert images(req) == [
        (0, "input[0].content[0].image_url", A, None),
        (0, "input[0].content[2].image_url", None, "http://example.com/x.jpg"),
        (1, "input[1].content[0].image_url", B, None),
    ]
    body["input"] = [{"role": "user", "content": [{"type": "input_image", "file_id": "f_1"}]}]
    with pytest.raises(UnsupportedParameter) as e:
        responses.parse_request(body)
    assert e.value.param == "input[0].content[0].file_id"
    plain = chat(responses.parse_request({"model": "m", "input": IMAGE_MARKER}).request)
    assert plain.messages[0].content == MARKER_LOOKALIKE


def test_anthropic_image_blocks_base64_and_url_and_in_tool_results() -> None:
    body = {
        "model": "m",
        "max_tokens": 5,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image", "source": {"type": "base64", "media_type": "image/gif",
                                                 "data": b64(B)}},
                    {"type": "text", "text": f"what {IMAGE_MARKER}?"},
                    {"type": "image", "source": {"type": "url", "url": "https://e.com/c.png"}},
                ],
            },
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "t1", "name": "shot", "input": {}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": [
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                 "data": b64(A)}}]}]},
        ],
    }  # fmt: skip
    req = anthropic.parse_request(body).request
    assert req.messages[0].content == f"{IMAGE_MARKER}what {MARKER_LOOKALIKE}?{IMAGE_MARKER}"
    first = req.messages[0].image_sources[0]
    assert first.media_type == "image/gif"
    assert first.media_param == "messages[0].content[0].source.media_type"
    tool = req.messages[2]
    assert tool.role == "tool" and tool.content == IMAGE_MARKER
    assert images(req) == [
        (0, "messages[0].content[0].source.data", B, None),
        (0, "messages[0].content[2].source.url", None, "https://e.com/c.png"),
        (2, "messages[2].content[0].content[0].source.data", A, None),
    ]


@pytest.mark.parametrize(
    ("source", "param"),
    [
        ({"type": "base64", "media_type": "image/tiff", "data": b64(A)},
         "messages[0].content[0].source.media_type"),
        ({"type": "base64", "media_type": "image/png", "data": "%%%"},
         "messages[0].content[0].source.data"),
        ({"type": "file", "file_id": "x"}, "messages[0].content[0].source"),
        ({"type": "url", "url": "ftp://e.com/a.png"}, "messages[0].content[0].source.url"),
    ],
)  # fmt: skip
def test_anthropic_bad_image_blocks(source: dict[str, Any], param: str) -> None:
    body = {
        "model": "m",
        "max_tokens": 5,
        "messages": [{"role": "user", "content": [{"type": "image", "source": source}]}],
    }
    with pytest.raises(InvalidRequest) as e:
        anthropic.parse_request(body)
    assert e.value.param == param


def test_ollama_images_on_chat_messages_and_generate() -> None:
    body = {
        "model": "m",
        "messages": [
            {"role": "user", "content": f"look {IMAGE_MARKER}", "images": [b64(A), b64(B)]},
            {"role": "user", "content": "and", "images": [b64(C)]},
        ],
    }
    req = chat(ollama.parse_chat(body, lambda n: n).request)
    assert req.messages[0].content == f"{IMAGE_MARKER}{IMAGE_MARKER}look {MARKER_LOOKALIKE}"
    assert images(req) == [
        (0, "messages[0].images[0]", A, None),
        (0, "messages[0].images[1]", B, None),
        (1, "messages[1].images[0]", C, None),
    ]
    gen = {"model": "m", "prompt": "describe", "images": [b64(C)], "system": IMAGE_MARKER}
    req = chat(ollama.parse_generate(gen, lambda n: n).request)
    assert [m.content for m in req.messages] == [MARKER_LOOKALIKE, f"{IMAGE_MARKER}describe"]
    assert images(req) == [(1, "images[0]", C, None)]
    with pytest.raises(UnsupportedParameter) as e:
        ollama.parse_generate({**gen, "raw": True}, lambda n: n)
    assert e.value.param == "images"
    with pytest.raises(InvalidRequest) as e2:
        ollama.parse_chat(
            {"model": "m", "messages": [{"role": "user", "content": "x", "images": ["@@"]}]},
            lambda n: n,
        )
    assert e2.value.param == "messages[0].images[0]"
