"""/v1/messages and /v1/responses through the real server and the real anthropic and openai
SDKs, on the fake runtime (tests/support/fakes.py) with a template that opens a think block: the
reasoning comes back as thinking blocks and reasoning items, and every error of the Messages
route (401, 403, 413, 404, 400 bounds) has Anthropic's shape."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import openai
import pytest
from aiohttp.test_utils import TestServer

from app.core.library.index import ModelLibrary
from app.core.service import assemble
from app.core.types import LoadOptions
from app.server.app import create_app
from app.settings import ServerSettings, hash_key
from tests.support.fakes import FakeRuntime
from tests.support.gguf_files import CHATML, write_model

THINK = CHATML + "{% if add_generation_prompt %}{{ '<think>\\n' }}{% endif %}"
PIECES = ["Two", " and two.", "</think>", "\n\nIt is", " 4."]
ASK = [{"role": "user", "content": "2+2?"}]


@contextlib.asynccontextmanager
async def fake_server(
    tmp_path: Path, *, api_key: str | None = None, **settings: Any
) -> AsyncIterator[tuple[str, str]]:
    lib = ModelLibrary(tmp_path / "lib.json", tmp_path / "models")
    lib.import_path(write_model(tmp_path / "src" / "think.gguf", chat_template=THINK))
    (model,) = lib.list()
    h = assemble(lib, {"gguf": FakeRuntime(delay=0.0, pieces=PIECES)}, load_defaults=LoadOptions)
    hashes = (hash_key(api_key),) if api_key else ()
    app = create_app(h, ServerSettings(**settings), api_key_hashes=hashes)
    try:
        async with TestServer(app, host="127.0.0.1") as server:
            yield str(server.make_url("")).rstrip("/"), model.id
    finally:
        await h.close()


async def test_messages_return_thinking_blocks(tmp_path: Path) -> None:
    async with fake_server(tmp_path) as (root, model):
        a = anthropic.AsyncAnthropic(base_url=root, api_key="x", max_retries=0, timeout=60)
        m = await a.messages.create(model=model, max_tokens=50, messages=ASK)
        assert [b.type for b in m.content] == ["thinking", "text"]
        assert m.content[0].thinking == "Two and two." and m.content[0].signature == ""
        assert m.content[1].text == "It is 4." and m.stop_reason == "end_turn"
        async with a.messages.stream(model=model, max_tokens=50, messages=ASK) as s:
            evs = [e async for e in s]
            final = await s.get_final_message()
        thinking = "".join(e.thinking for e in evs if e.type == "thinking")
        assert thinking == "Two and two." and any(e.type == "signature" for e in evs)
        assert [b.type for b in final.content] == ["thinking", "text"]
        assert final.content[0].thinking == "Two and two." and final.content[1].text == "It is 4."
        # the thinking block handed back in history is accepted (and not sent to the model)
        follow = await a.messages.create(
            model=model,
            max_tokens=50,
            messages=[*ASK, {"role": "assistant", "content": m.content}, *ASK],
        )
        assert follow.content[1].text == "It is 4."
        await a.close()


async def test_responses_return_reasoning_items(tmp_path: Path) -> None:
    async with fake_server(tmp_path) as (root, model):
        c = openai.AsyncOpenAI(base_url=root + "/v1", api_key="x", max_retries=0, timeout=60)
        await _reasoning_items(c, model)
        await c.close()


async def _reasoning_items(c: openai.AsyncOpenAI, model: str) -> None:
    r = await c.responses.create(model=model, input="2+2?")
    assert [o.type for o in r.output] == ["reasoning", "message"]
    assert r.output[0].content[0].text == "Two and two." and r.output_text == "It is 4."
    assert r.usage.output_tokens_details.reasoning_tokens > 0
    events = [e async for e in await c.responses.create(model=model, input="2+2?", stream=True)]
    deltas = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    (done,) = [e for e in events if e.type == "response.reasoning_text.done"]
    assert deltas == done.text == "Two and two."
    async with c.responses.stream(model=model, input="2+2?") as s:
        final = await s.get_final_response()
    assert [o.type for o in final.output] == ["reasoning", "message"]
    assert final.output[0].content[0].text == "Two and two."
    assert final.output_text == "It is 4."
    # the SDK's multi-turn pattern hands the output back as input
    follow = await c.responses.create(
        model=model,
        input=[{"role": "user", "content": "2+2?"}, *[o.model_dump() for o in r.output]]
        + [{"role": "user", "content": "and 3+3?"}],
    )
    assert follow.output_text == "It is 4."


def _error_of(raw: bytes) -> dict[str, Any]:
    body = json.loads(raw)
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    return body["error"]


async def _post(root: str, path: str, body: bytes, **headers: str) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as s:
        h = {"Content-Type": "application/json", **headers}
        async with s.post(root + path, data=body, headers=h) as r:
            return r.status, await r.read()


MSG = json.dumps({"model": "m", "max_tokens": 5, "messages": ASK}).encode()


async def test_messages_errors_have_anthropic_shape(tmp_path: Path) -> None:
    async with fake_server(tmp_path, api_key="k-1", max_body_bytes=200_000) as (root, model):
        status, raw = await _post(root, "/v1/messages", MSG)
        assert status == 401 and _error_of(raw)["type"] == "authentication_error"
        status, raw = await _post(
            root, "/v1/messages", MSG, Host="evil.com", **{"x-api-key": "k-1"}
        )
        assert status == 403 and _error_of(raw)["type"] == "permission_error"
        big = json.dumps({"model": model, "max_tokens": 5, "messages": ASK, "x": "y" * 300_000})
        status, raw = await _post(root, "/v1/messages", big.encode(), **{"x-api-key": "k-1"})
        assert status == 413 and _error_of(raw)["type"] == "request_too_large"
        a = anthropic.AsyncAnthropic(base_url=root, api_key="k-1", max_retries=0, timeout=60)
        async with a:
            await _client_errors(a, model)


async def _client_errors(a: anthropic.AsyncAnthropic, model: str) -> None:
    """A 404 and the bounds every protocol shares, as the SDK raises them."""
    with pytest.raises(anthropic.NotFoundError) as nf:
        await a.messages.create(model="ghost", max_tokens=5, messages=ASK)
    assert nf.value.body["error"]["type"] == "not_found_error"
    for extra in (
        {"stop_sequences": ["s"] * 17},
        {"tools": [{"name": f"t{i}"} for i in range(129)]},
        {"tools": [{"name": "bad name!"}]},
        {"tools": [{"name": "t", "input_schema": {"type": "object", "x": "y" * 70_000}}]},
    ):
        with pytest.raises(anthropic.BadRequestError) as bad:
            await a.messages.create(model=model, max_tokens=5, messages=ASK, **extra)
        assert bad.value.body["error"]["type"] == "invalid_request_error", extra


async def test_responses_bounds_are_400(tmp_path: Path) -> None:
    async with fake_server(tmp_path) as (root, model):
        c = openai.AsyncOpenAI(base_url=root + "/v1", api_key="x", max_retries=0, timeout=60)

        def fn(name: str, **kw: Any) -> dict[str, Any]:
            return {"type": "function", "name": name, "parameters": {}, **kw}

        for extra, param in (
            ({"tools": [fn(f"t{i}") for i in range(129)]}, "tools"),
            ({"tools": [fn("bad name!")]}, "tools[0]"),
            ({"tools": [fn("t", parameters={"type": "object", "x": "y" * 70_000})]}, None),
            ({"tools": [fn("t")], "tool_choice": 3}, "tool_choice"),
        ):
            with pytest.raises(openai.BadRequestError) as bad:
                await c.responses.create(model=model, input="x", **extra)
            if param:
                assert bad.value.body["param"] == param, extra
        await c.close()
