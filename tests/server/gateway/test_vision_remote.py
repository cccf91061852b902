"""Images to a remote OpenAI-compatible model: the front Hearth decodes them (bounded, like any
image) and sends each on as a PNG data URL in an ``image_url`` part where its marker was; the
engine (a second Hearth whose model has a projector, on the fake runtime) gets the same pixels."""

from __future__ import annotations

import asyncio
import base64
import io
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer
from PIL import Image

from app.core.gateway.providers.pool import ProviderPool
from app.core.gateway.providers.store import ProviderConfig, ProviderStore
from app.core.library.index import ModelLibrary
from app.core.service import assemble
from app.core.types import LoadOptions
from app.runtimes.remote.client import RemoteEngine
from app.server.app import create_app
from app.settings import ServerSettings
from tests.support.fakes import FakeRuntime
from tests.support.gguf_files import CHATML, write_model
from tests.support.vision_gguf import write_projector

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def seer_library(root: Path) -> ModelLibrary:
    lib_file = root / "lib.json"
    lib = ModelLibrary(lib_file, root / "models")
    seer = write_model(root / "src" / "seer.gguf", chat_template=CHATML)
    write_projector(seer.parent / "mmproj-seer-F16.gguf")  # paired by the import
    assert lib.import_path(seer)[0].extra["projector"]
    plain = write_model(root / "plain" / "plain.gguf", chat_template=CHATML)
    assert "projector" not in lib.import_path(plain)[0].extra  # no projector beside it
    return ModelLibrary(lib_file, root / "models")


async def test_images_go_to_a_remote_model_as_png_data_urls(tmp_path: Path) -> None:
    upstream = assemble(
        seer_library(tmp_path / "up"), {"gguf": FakeRuntime(delay=0.0, pieces=["ok"])},
        load_defaults=LoadOptions,
    )  # fmt: skip
    bodies: list[dict[str, Any]] = []

    @web.middleware
    async def record(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path == "/v1/chat/completions":
            bodies.append(json.loads(await request.read()))
        return await handler(request)

    up_app = create_app(upstream, ServerSettings())
    up_app.middlewares.append(record)
    pool = ProviderPool(
        ProviderStore(tmp_path / "providers.json", tmp_path / "keys.json"), RemoteEngine
    )
    front_lib = ModelLibrary(tmp_path / "front" / "lib.json", tmp_path / "front" / "models")
    front = assemble(front_lib, {}, load_defaults=LoadOptions, providers=pool)
    picture = Image.new("RGBA", (3, 2), (10, 20, 30, 255))
    picture.putpixel((2, 1), (0, 0, 0, 0))  # transparent: white once decoded
    buf = io.BytesIO()
    picture.save(buf, "WEBP", lossless=True)
    url = "data:image/webp;base64," + base64.b64encode(buf.getvalue()).decode()
    try:
        async with (
            TestServer(up_app, host="127.0.0.1") as up,
            TestServer(create_app(front, ServerSettings()), host="127.0.0.1") as srv,
            aiohttp.ClientSession() as session,
        ):
            front.routing.add_provider(
                ProviderConfig("up", str(up.make_url("/v1")), kind="hearth"), None
            )
            deadline = asyncio.get_running_loop().time() + 60
            while not front.routing.is_routable("up/seer") or not pool.listings():
                assert asyncio.get_running_loop().time() < deadline, "provider never ready"
                await asyncio.sleep(0.01)
            body = {
                "model": "up/seer",
                "max_tokens": 4,
                "messages": [{"role": "user", "content": [
                    {"type": "text", "text": "what is"},
                    {"type": "image_url", "image_url": {"url": url}},
                    {"type": "text", "text": "?"},
                ]}],
            }  # fmt: skip
            async with session.post(srv.make_url("/v1/chat/completions"), json=body) as r:
                assert r.status == 200, await r.text()
                out = await r.json()
            assert out["choices"][0]["message"]["content"] == "ok"
            # the engine's listing says the model takes images; the front lists it so
            assert "vision" in front.routing.remote_listing("up/seer").model.capabilities  # type: ignore[union-attr]
            # its listing says this one takes none: a 400 naming the image, nothing sent
            body["model"] = "up/plain"
            async with session.post(srv.make_url("/v1/chat/completions"), json=body) as r:
                assert r.status == 400
                err = (await r.json())["error"]
            assert err["param"] == "messages[0].content[1].image_url.url"
            assert "takes no images" in err["message"]
            # the same through Anthropic's shape
            anth = {"model": "up/plain", "max_tokens": 4, "messages": [{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/webp",
                                             "data": url.split(",", 1)[1]}},
            ]}]}  # fmt: skip
            async with session.post(srv.make_url("/v1/messages"), json=anth) as r:
                assert r.status == 400, await r.text()
            async with session.post(
                srv.make_url("/v1/chat/completions"),
                json=body | {"messages": [{"role": "user", "content": "text alone"}]},  # fmt: skip
            ) as r:
                assert r.status == 200, await r.text()  # text to it goes on as before
    finally:
        await front.close()
        await upstream.close()
    sent, text_only = bodies  # the refused requests never reached the engine
    assert text_only["model"] == "plain" and text_only["messages"][0]["content"] == "text alone"
    parts = sent["messages"][0]["content"]
    assert [p["type"] for p in parts] == ["text", "image_url", "text"]
    assert parts[0]["text"] == "what is" and parts[2]["text"] == "?"
    head, data = parts[1]["image_url"]["url"].split(",", 1)
    assert head == "data:image/png;base64"
    got = Image.open(io.BytesIO(base64.b64decode(data)))
    assert got.mode == "RGB" and got.size == (3, 2)
    assert got.getpixel((0, 0)) == (10, 20, 30) and got.getpixel((2, 1)) == (255, 255, 255)
