"""Stored Responses on a real ``hearth serve`` with SmolLM2, through openai-python and the
OpenAI Agents SDK: a kept response is continued by ``previous_response_id`` (its turn is in the
next prompt, which the prompt cache serves), read back (``retrieve``, ``input_items.list``),
deleted; another key sees none of it; ``store: false`` keeps nothing; a restart keeps it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from app.core.gateway.keys import KeyStore
from tests.conftest import Served, serving, start_served, stop_served

pytestmark = pytest.mark.model

KEYS = {"a": "k-a-0123456789abcdef", "b": "k-b-0123456789abcdef"}
SHORT = {"max_output_tokens": 12, "temperature": 0}


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> Iterator[Served]:
    def prepare(service: Any, paths: Any, store: Any) -> None:
        ks = KeyStore(paths.keys_file)
        for name, secret in KEYS.items():
            ks.add(name, secret)

    with serving(tmp_path_factory.mktemp("stored"), smollm2_path, prepare=prepare) as s:
        yield s


def client(s: Served, key: str = "x") -> openai.OpenAI:
    return openai.OpenAI(base_url=s.base_url, api_key=key, max_retries=0, timeout=120)


def test_a_continuation_carries_the_kept_turn(keyed: Served) -> None:
    c = client(keyed, KEYS["a"])
    r1 = c.responses.create(model=keyed.model_id, input="My name is Ada. Say hi.", **SHORT)
    assert r1.store is True and r1.previous_response_id is None
    r2 = c.responses.create(
        model=keyed.model_id, input="What is my name?", previous_response_id=r1.id, **SHORT
    )
    assert r2.status in ("completed", "incomplete") and r2.previous_response_id == r1.id
    assert r2.usage is not None and r1.usage is not None
    # turn 2's prompt begins with turn 1's prompt and answer: the prompt cache has them
    assert r2.usage.input_tokens_details.cached_tokens >= r1.usage.input_tokens
    alone = c.responses.create(model=keyed.model_id, input="What is my name?", store=False, **SHORT)
    assert alone.usage is not None and alone.store is False
    assert r2.usage.input_tokens > alone.usage.input_tokens + r1.usage.output_tokens

    got = c.responses.retrieve(r2.id)
    assert got.id == r2.id and got.output_text == r2.output_text
    assert got.previous_response_id == r1.id
    items = c.responses.input_items.list(r2.id, order="asc")
    kinds = [(i.type, getattr(i, "role", None)) for i in items.data]
    # turn 1's input, its answer, then turn 2's input
    assert kinds == [("message", "user"), ("message", "assistant"), ("message", "user")]
    assert items.data[0].content[0].text == "My name is Ada. Say hi."
    assert items.data[2].content[0].text == "What is my name?"
    newest = c.responses.input_items.list(r2.id, limit=1)  # order desc by default
    assert [i.id for i in newest.data] == [items.data[2].id] and newest.has_more

    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(alone.id)  # store: false kept nothing
    with pytest.raises(openai.BadRequestError) as ei:
        c.responses.create(model=keyed.model_id, input="x", previous_response_id=alone.id)
    assert ei.value.code == "previous_response_not_found"

    deleted = c.responses.delete(r1.id)
    assert deleted is None  # openai-python reads the deleted object and returns nothing
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(r1.id)


def test_another_key_sees_nothing(keyed: Served) -> None:
    a, b = client(keyed, KEYS["a"]), client(keyed, KEYS["b"])
    r = a.responses.create(model=keyed.model_id, input="Say hi.", **SHORT)
    with pytest.raises(openai.NotFoundError):
        b.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        b.responses.input_items.list(r.id)
    with pytest.raises(openai.NotFoundError):
        b.responses.delete(r.id)
    with pytest.raises(openai.BadRequestError) as ei:
        b.responses.create(model=keyed.model_id, input="x", previous_response_id=r.id, **SHORT)
    assert ei.value.code == "previous_response_not_found"
    assert a.responses.retrieve(r.id).id == r.id  # still there for its own key


def test_a_streamed_response_is_kept_when_it_ends(keyed: Served) -> None:
    c = client(keyed, KEYS["a"])
    events = list(
        c.responses.create(model=keyed.model_id, input="Say hello.", stream=True, **SHORT)
    )
    last = events[-1]
    assert last.type in ("response.completed", "response.incomplete")  # max_output_tokens
    final = last.response
    got = c.responses.retrieve(final.id)
    assert got.status == final.status and got.output_text == final.output_text


def test_a_kept_response_survives_a_restart(
    tmp_path: Path, smollm2_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("HEARTH_HOME", str(home))
    s = start_served(home, smollm2_path)
    try:
        r1 = client(s).responses.create(model=s.model_id, input="Say hi.", **SHORT)
    finally:
        stop_served(s)
    s = start_served(home, smollm2_path)
    try:
        c = client(s)
        assert c.responses.retrieve(r1.id).output_text == r1.output_text
        r2 = c.responses.create(
            model=s.model_id, input="Again.", previous_response_id=r1.id, **SHORT
        )
        assert r2.previous_response_id == r1.id
    finally:
        stop_served(s)


def test_agents_sdk_continues_by_previous_response_id(served: Served) -> None:
    from agents import Agent, OpenAIResponsesModel, Runner, set_tracing_disabled
    from pydantic import BaseModel, Field

    set_tracing_disabled(True)  # no network

    class Reply(BaseModel):
        # A bounded answer: the SDK raises on a response cut at max_output_tokens, and a tiny
        # model's free text can loop that far on some CPUs; the schema's grammar ends it.
        text: str = Field(max_length=24)

    async def two_turns() -> tuple[Any, Any]:
        api = openai.AsyncOpenAI(base_url=served.base_url, api_key="x", max_retries=0)
        model = OpenAIResponsesModel(model=served.model_id, openai_client=api)
        agent = Agent(name="helper", instructions="Answer briefly.", model=model, output_type=Reply)
        first = await Runner.run(agent, "My name is Ada. Say hi.")
        second = await Runner.run(
            agent, "What is my name?", previous_response_id=first.last_response_id
        )
        await api.close()
        return first, second

    first, second = asyncio.run(two_turns())
    assert isinstance(first.final_output, Reply) and isinstance(second.final_output, Reply)
    kept = client(served).responses.retrieve(second.last_response_id)
    assert kept.previous_response_id == first.last_response_id  # the request carried it
    items = client(served).responses.input_items.list(second.last_response_id, order="asc")
    assert len(items.data) >= 3  # turn 1's input and answer came before turn 2's
