"""The response cache in front of a remote provider: a model served by a remote
engine goes through the same service path, so an exact repeat is answered without the engine
(here a second Hearth on the fake runtime, reached over HTTP by the real remote client)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from aiohttp.test_utils import TestServer

from app.core.gateway.cache.replay import ResponseCache
from app.core.gateway.cache.store import CacheConfig, CacheStore
from app.core.gateway.providers.pool import ProviderPool
from app.core.gateway.providers.store import ProviderConfig, ProviderStore
from app.core.library.index import ModelLibrary
from app.core.requests import ChatRequest
from app.core.service import assemble
from app.core.types import ChatMessage, LoadOptions, SamplingParams
from app.runtimes.remote.client import RemoteEngine
from app.server.app import create_app
from app.settings import ServerSettings
from tests.support.fakes import FakeRuntime
from tests.support.gguf_files import CHATML, write_model


async def _until(cond: object, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + 60
    while not cond():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.01)


async def test_a_remote_model_is_cached_the_same_way(tmp_path: Path) -> None:
    lib = ModelLibrary(tmp_path / "up" / "lib.json", tmp_path / "up" / "models")
    lib.import_path(write_model(tmp_path / "src" / "m.gguf", chat_template=CHATML))
    (model,) = lib.list()
    runtime = FakeRuntime(delay=0.0, pieces=("Four", "."))
    upstream = assemble(lib, {"gguf": runtime}, load_defaults=LoadOptions)
    providers = ProviderStore(tmp_path / "providers.json", tmp_path / "provider_keys.json")
    front_lib = ModelLibrary(tmp_path / "front" / "lib.json", tmp_path / "front" / "models")
    pool = ProviderPool(providers, RemoteEngine)
    front = assemble(
        front_lib,
        {},
        load_defaults=LoadOptions,
        providers=pool,
        cache=lambda _embed: ResponseCache(
            CacheStore(tmp_path / "cache.sqlite"), lambda: CacheConfig(mode="exact")
        ),
    )
    try:
        async with TestServer(create_app(upstream, ServerSettings()), host="127.0.0.1") as srv:
            url = str(srv.make_url("/v1"))
            front.routing.add_provider(ProviderConfig("up", url, kind="hearth"), None)
            remote_id = f"up/{model.id}"
            await _until(lambda: front.routing.is_routable(remote_id) and pool.listings(), "ready")
            req = ChatRequest(remote_id, (ChatMessage("user", "2+2?"),), SamplingParams(0.0))
            results = []
            for _ in range(2):
                choices = await front.chat(req)
                text = "".join([d.text async for d in choices.first])
                results.append((choices.cache, choices.model, text))
            assert results[0] == ("miss", remote_id, "Four.")
            assert results[1] == ("hit", remote_id, "Four.")
            assert sum(m.submit_calls for m in runtime.models) == 1  # the engine saw one
    finally:
        await front.close()
        await upstream.close()
