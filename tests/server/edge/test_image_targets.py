"""Images through the real server (fake runtime): the request's target is resolved before any
image is touched (an unknown name is a 404, an alias or ``auto`` that cannot take images the
400 a model without a projector gets, a remote model as its engine says), a request's decoded
pixels are bounded in all, and decoding runs in its own small pool: /tokenize answers while
decodes wait there, and a decode whose request ended is never started.

"No decode happened" is seen two ways: the image is corrupt, so a decode would answer "corrupt"
rather than the model's 404/400, and the pool's count of jobs started stays put."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer
from PIL import Image

from app.core.gateway.aliases import AliasStore
from app.core.gateway.providers.pool import ProviderPool
from app.core.gateway.providers.store import ProviderConfig, ProviderStore
from app.core.inference.images import ImageSource
from app.core.library.index import ModelLibrary
from app.core.requests import ChatRequest, RequestContext
from app.core.service import Hearth, assemble
from app.core.types import ChatMessage, LoadOptions
from app.errors import ModelNotFound
from app.runtimes.remote.client import RemoteEngine
from app.server.app import create_app
from app.server.edge.vision import VisionEdge
from app.settings import ServerSettings, VisionSettings
from tests.server.edge.test_vision import error_param, four_apis, openai_body
from tests.server.gateway.test_vision_remote import seer_library
from tests.support.fakes import FakeRuntime
from tests.support.hostile_images import data_url, header_only_png, one_colour_png

CORRUPT = header_only_png(64, 64)  # a fine header, no pixel data: decoding it says "corrupt"


def png(side: int, colour: tuple[int, int, int] = (200, 10, 10)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (side, side), colour).save(buf, "PNG")
    return buf.getvalue()


@dataclass
class Env:
    root: str
    hearth: Hearth
    edge: VisionEdge
    vision: list[VisionSettings]
    runtime: FakeRuntime
    session: aiohttp.ClientSession

    async def post(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        async with self.session.post(self.root + path, json=body) as r:
            return r.status, await r.json(content_type=None)


@contextlib.asynccontextmanager
async def env(tmp_path: Path, **server: Any) -> AsyncIterator[Env]:
    """``seer`` (a projector) and ``plain`` (none), and aliases over them."""
    runtime = FakeRuntime(delay=0.0, pieces=["ok"])
    h = assemble(
        seer_library(tmp_path),
        {"gguf": runtime},
        load_defaults=LoadOptions,
        aliases=AliasStore(tmp_path / "aliases.json"),
    )
    h.routing.set_alias("see", ["seer"])
    h.routing.set_alias("blind", ["plain"])
    h.routing.set_alias("blind-first", ["plain", "seer"])  # the chain starts on plain: its 400
    vision = [VisionSettings()]
    edge = VisionEdge(settings=lambda: vision[0])
    app = create_app(h, ServerSettings(**server), vision=edge)
    try:
        async with TestServer(app, host="127.0.0.1") as srv, aiohttp.ClientSession() as session:
            yield Env(str(srv.make_url("")).rstrip("/"), h, edge, vision, runtime, session)
    finally:
        await h.close()


async def test_a_name_that_resolves_to_nothing_is_a_404_and_no_image_is_decoded(
    tmp_path: Path,
) -> None:
    async with env(tmp_path) as e:
        for name in ("nope", "prov/nope", "blind-typo"):
            for path, body, _ in four_apis(name, CORRUPT):
                status, err = await e.post(path, body)
                assert status == 404, (name, path, err)
                assert "corrupt" not in str(err)
        assert e.edge.pool.started == 0 and e.runtime.calls == 0


async def test_aliases_and_auto_are_resolved_before_any_image_is_decoded(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        for name in ("blind", "blind-first"):
            for path, body, param in four_apis(name, CORRUPT):
                status, err = await e.post(path, body)
                got, message = error_param(path, err)
                assert status == 400 and "vision" in message and "plain" in message, (path, err)
                assert got in (param, None) and "corrupt" not in message
        status, err = await e.post("/v1/chat/completions", openai_body("auto", data_url(CORRUPT)))
        assert status == 400 and "'auto' has no rules" in err["error"]["message"], err
        assert e.edge.pool.started == 0 and e.runtime.calls == 0
        # an alias whose target takes images: decoded (the corrupt one says so), then answered
        status, err = await e.post("/v1/chat/completions", openai_body("see", data_url(CORRUPT)))
        assert status == 400 and "corrupt" in err["error"]["message"], err
        assert e.edge.pool.started == 1
        for path, body, _ in four_apis("see", png(8)):
            status, out = await e.post(path, body)
            assert status == 200, (path, out)


async def test_a_key_scope_hides_an_alias_s_targets_before_any_image_is_decoded(
    tmp_path: Path,
) -> None:
    async with env(tmp_path) as e:
        messages = (ChatMessage("user", "x", image_sources=(ImageSource("img", data=CORRUPT),)),)
        # what the middleware puts on the request's context for a key's --models
        scoped = ChatRequest("see", messages, context=RequestContext(models=("plain",)))
        try:
            await e.hearth.check_images(scoped)
        except ModelNotFound as err:
            assert "see" in err.message
        else:
            raise AssertionError("an out-of-scope alias was accepted")
        await e.hearth.check_images(ChatRequest("see", messages))  # unscoped: it takes images


async def test_a_request_s_images_are_bounded_in_pixels_all_together(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        # 64 one-colour 4096x4096 PNGs (a few MB of body): to a model without vision, refused
        # before any is decoded; to a vision model, the fifth goes over the default total
        big = data_url(one_colour_png(4096))
        status, err = await e.post("/v1/chat/completions", openai_body("blind", *[big] * 64))
        assert status == 400 and "vision" in err["error"]["message"], err
        assert e.edge.pool.started == 0
        status, err = await e.post("/v1/chat/completions", openai_body("seer", *[big] * 64))
        assert status == 400, err
        assert err["error"]["param"] == "messages[0].content[5].image_url.url", err
        assert "max_request_pixels" in err["error"]["message"]
        assert e.edge.pool.started == 5  # four decoded, the fifth refused from its header
        # the setting is read per request
        e.vision[0] = VisionSettings(max_request_pixels=3 * 16 * 16)
        three = [data_url(png(16, (i, 0, 0))) for i in range(3)]
        assert (await e.post("/v1/chat/completions", openai_body("seer", *three)))[0] == 200
        status, err = await e.post(
            "/v1/chat/completions", openai_body("seer", *three, data_url(png(1)))
        )
        assert status == 400 and err["error"]["param"] == "messages[0].content[4].image_url.url"
        for path, body, param in four_apis("seer", png(64)):  # over the total alone
            status, err = await e.post(path, body)
            got, message = error_param(path, err)
            assert status == 400 and got in (param, None) and message.startswith(param), err


async def test_decodes_wait_in_their_own_pool_tokenize_answers_and_an_ended_request_s_decode_never_runs(  # noqa: E501
    tmp_path: Path,
) -> None:
    async with env(tmp_path, request_timeout_s=3.0) as e:
        await e.hearth.models.load("seer")
        loop = asyncio.get_running_loop()
        gate = threading.Event()
        busy = asyncio.Semaphore(0)

        def hold(_stop: object) -> None:  # a long decode, as far as the pool can tell
            loop.call_soon_threadsafe(busy.release)
            gate.wait(60)

        holders = [
            asyncio.ensure_future(e.edge.pool.run(hold)) for _ in range(e.edge.pool.max_threads)
        ]
        try:
            for _ in holders:
                await asyncio.wait_for(busy.acquire(), 30)
            started = e.edge.pool.started
            image_req = asyncio.ensure_future(
                e.post("/v1/chat/completions", openai_body("seer", data_url(png(8))))
            )
            # every decode thread is taken and an image waits for one: /tokenize still answers
            status, out = await asyncio.wait_for(
                e.post("/tokenize", {"model": "seer", "content": "hello"}), 30
            )
            assert status == 200 and out["tokens"], out
            assert not image_req.done()
            # the image request runs out of time while its decode waits: 504, decode dropped
            status, err = await asyncio.wait_for(image_req, 60)
            assert status == 504, err
        finally:
            gate.set()
            await asyncio.gather(*holders)
        for _ in range(e.edge.pool.max_threads):  # jobs queued after the dropped one have run
            await e.edge.pool.run(lambda _stop: None)
        assert e.edge.pool.started == started + e.edge.pool.max_threads  # never the dropped decode
        status, out = await e.post("/v1/chat/completions", openai_body("seer", data_url(png(8))))
        assert status == 200, out


async def test_a_remote_target_is_checked_as_its_engine_says_before_decoding(
    tmp_path: Path,
) -> None:
    upstream = assemble(
        seer_library(tmp_path / "up"),
        {"gguf": FakeRuntime(delay=0.0, pieces=["ok"])},
        load_defaults=LoadOptions,
    )
    pool = ProviderPool(
        ProviderStore(tmp_path / "providers.json", tmp_path / "keys.json"), RemoteEngine
    )
    front_lib = ModelLibrary(tmp_path / "front" / "lib.json", tmp_path / "front" / "models")
    front = assemble(front_lib, {}, load_defaults=LoadOptions, providers=pool)
    edge = VisionEdge()
    b64 = base64.b64encode(CORRUPT).decode()
    try:
        async with (
            TestServer(create_app(upstream, ServerSettings()), host="127.0.0.1") as up,
            TestServer(create_app(front, ServerSettings(), vision=edge), host="127.0.0.1") as srv,
            aiohttp.ClientSession() as session,
        ):
            front.routing.add_provider(
                ProviderConfig("up", str(up.make_url("/v1")), kind="hearth"), None
            )
            deadline = asyncio.get_running_loop().time() + 60
            while not front.routing.is_routable("up/seer") or not pool.listings():
                assert asyncio.get_running_loop().time() < deadline, "provider never ready"
                await asyncio.sleep(0.05)

            async def post(model: str) -> tuple[int, str]:
                body = {"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": [
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                 "data": b64}}]}]}  # fmt: skip
                async with session.post(srv.make_url("/v1/messages"), json=body) as r:
                    return r.status, (await r.json())["error"]["message"]

            status, message = await post("up/plain")  # its engine says: no images
            assert status == 400 and "takes no images" in message, message
            status, message = await post("up/ghost")  # its engine lists no such model
            assert status == 404 and "corrupt" not in message, message
            assert edge.pool.started == 0
            status, message = await post("up/seer")  # takes images: decoded here first
            assert status == 400 and "corrupt" in message, message
            assert edge.pool.started == 1
    finally:
        await front.close()
        await pool.close()
        await upstream.close()
