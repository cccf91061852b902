"""The response cache keys a request's images by their digest: another image is
another key, the same pixels the same key, and no pixels go into the key."""

from __future__ import annotations

from dataclasses import replace

from app.core.gateway.cache.replay import request_fields, request_keys
from app.core.gateway.facts import completion_facts
from app.core.inference.images import IMAGE_MARKER, ImageInput, image_digest
from app.core.requests import ChatRequest, CompletionRequest, Infill
from app.core.types import ChatMessage


def image(fill: int) -> ImageInput:
    rgb = bytes([fill]) * 12
    return ImageInput(rgb, 2, 2, image_digest(2, 2, rgb), where="messages[0].content[0]")


def ask(*images: ImageInput) -> ChatRequest:
    text = IMAGE_MARKER * len(images) + "what is it?"
    return ChatRequest("m", (ChatMessage("user", text, images=images),))


def test_images_are_keyed_by_digest() -> None:
    a, b = image(1), image(2)
    key_a, skey_a, _ = request_keys(ask(a), ["m"])
    key_b, skey_b, _ = request_keys(ask(b), ["m"])
    assert key_a != key_b and skey_a != skey_b  # a similar question about another picture
    assert request_keys(ask(replace(a, where="elsewhere")), ["m"])[0] == key_a
    fields = request_fields(ask(a), ["m"])
    assert fields["messages"][0]["images"] == [a.digest]
    assert "rgb" not in repr(fields)


def test_a_text_message_keys_as_before_images_existed() -> None:
    fields = request_fields(ChatRequest("m", (ChatMessage("user", "hi"),)), ["m"])
    assert set(fields["messages"][0]) == {"role", "content", "name", "tool_calls", "tool_call_id"}


def test_fill_in_the_middle_is_keyed_by_what_follows_the_cursor() -> None:
    plain = CompletionRequest("m", ("def f(",))
    a = replace(plain, infill=Infill("):\n"))
    b = replace(plain, infill=Infill("): pass\n"))
    keys = {request_keys(r, ["m"])[0] for r in (plain, a, b)}
    assert len(keys) == 3  # never a plain completion's answer, nor another suffix's
    assert "infill" not in request_fields(plain, ["m"])  # a plain completion keys as before
    assert completion_facts(a).needs == ("fim",) and completion_facts(plain).needs == ()
