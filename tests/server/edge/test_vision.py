"""Images through the real server (fake runtime, tests/support/fakes.py): a model without a
projector answers 400 naming the image's parameter in all four APIs' error shapes, before any
load; a model with one takes them (the markers reach the prompt, in order); hostile images and
URLs are 400s with the parameter and the server keeps serving; the URL policy
(vision.fetch_urls) and the private-address refusal, redirects and DNS included.

The fetch seam: a test resolver maps public-looking names to addresses, the real check runs on
those addresses, and ``dial`` sends a checked public address to the local image server."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import re
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from PIL import Image

from app.core.inference.images import (
    IMAGE_MARKER,
    MARKER_LOOKALIKE,
    MAX_IMAGES,
    InvalidImage,
    decode_image,
)
from app.core.library.index import ModelLibrary
from app.core.service import assemble
from app.core.types import LoadOptions
from app.core.util import filecache
from app.server.app import create_app
from app.server.edge.image_fetch import ImageFetcher, public_address
from app.server.edge.vision import VisionEdge
from app.settings import ServerSettings, VisionSettings
from tests.core.inference.test_images import png_header
from tests.support.fakes import FakeRuntime, ScriptEngine
from tests.support.gguf_files import CHATML, write_model
from tests.support.vision_gguf import write_projector

PUBLIC = "93.184.216.34"  # a public address: the check passes, dial sends it to the test server


def png(color: tuple[int, int, int] = (255, 0, 0), size: tuple[int, int] = (3, 2)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, "PNG")
    return buf.getvalue()


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


class RecordingEngine(ScriptEngine):
    prompts: list[str] = []  # the prompt text of every request begun (the fake tokenizer's)

    def begin(self, seq: Any) -> None:
        RecordingEngine.prompts.append(
            "".join(chr(t - 10) for t in seq.request.prompt_tokens if t >= 10)
        )
        super().begin(seq)


class RecordingRuntime(FakeRuntime):
    engine_type = RecordingEngine


@dataclass
class Env:
    root: str
    plain: str
    seer: str
    runtime: RecordingRuntime
    vision: list[VisionSettings]
    session: aiohttp.ClientSession
    image_port: int = 0
    served: list[str] = field(default_factory=list)

    async def post(
        self, path: str, body: dict[str, Any], root: str | None = None
    ) -> tuple[int, Any]:
        async with self.session.post((root or self.root) + path, json=body) as r:
            return r.status, await r.json(content_type=None)

    async def alive(self) -> None:
        async with self.session.get(self.root + "/health") as r:
            assert r.status == 200


def image_app(served: list[str]) -> web.Application:
    """The local image server: a PNG, redirects (to public names and to private addresses),
    an endless body, a corrupt one."""
    app = web.Application()

    async def handle(request: web.Request) -> web.StreamResponse:
        served.append(request.path)
        name = request.match_info["name"]
        if name == "red.png":
            return web.Response(body=png(), content_type="image/png")
        if name == "hop":  # to a public-looking name: followed (and checked)
            raise web.HTTPFound("http://img.test/red.png")
        if name == "to-private":
            raise web.HTTPFound("http://10.0.0.1/red.png")
        if name == "to-internal":  # a name that resolves to 127.0.0.1
            raise web.HTTPFound("http://internal.test/red.png")
        if name == "loop":
            raise web.HTTPFound("http://img.test/loop")
        if name == "endless":
            resp = web.StreamResponse()
            await resp.prepare(request)
            for _ in range(64):
                await resp.write(b"\x00" * 65536)
            return resp
        if name == "corrupt.png":
            return web.Response(body=png()[:40], content_type="image/png")
        return web.Response(status=404)

    app.router.add_get("/{name}", handle)
    return app


async def names_resolve(host: str, port: int) -> list[str]:
    names = {
        "img.test": [PUBLIC],
        "internal.test": ["127.0.0.1"],
        "mixed.test": [PUBLIC, "10.9.9.9"],
    }
    if host not in names:
        raise OSError(f"unknown test name {host}")
    return names[host]


@contextlib.asynccontextmanager
async def env(tmp_path: Path, host: str = "127.0.0.1", **server: Any) -> AsyncIterator[Env]:
    lib_file = tmp_path / "lib.json"
    lib = ModelLibrary(lib_file, tmp_path / "models")
    plain = lib.import_path(write_model(tmp_path / "src" / "plain.gguf", chat_template=CHATML))[0]
    # the seer's projector lies next to it: the import pairs them
    seer_file = write_model(tmp_path / "seer" / "seer.gguf", chat_template=CHATML)
    write_projector(seer_file.parent / "mmproj-seer-F16.gguf")
    seer = lib.import_path(seer_file)[0]
    assert seer.extra["projector"] and "projector" not in plain.extra
    runtime = RecordingRuntime(delay=0.0, pieces=["ok"])
    h = assemble(
        ModelLibrary(lib_file, tmp_path / "models"), {"gguf": runtime}, load_defaults=LoadOptions
    )
    vision = [VisionSettings()]
    served: list[str] = []
    async with TestServer(image_app(served), host="127.0.0.1") as images:
        assert images.port is not None
        edge = VisionEdge(
            settings=lambda: vision[0],
            resolve=names_resolve,
            dial={(PUBLIC, 80): ("127.0.0.1", images.port)},
        )
        app = create_app(h, ServerSettings(**server), vision=edge)
        try:
            async with TestServer(app, host=host) as srv, aiohttp.ClientSession() as session:
                RecordingEngine.prompts = []
                yield Env(
                    str(srv.make_url("")).rstrip("/"),
                    plain.id,
                    seer.id,
                    runtime,
                    vision,
                    session,
                    images.port,
                    served,
                )
        finally:
            await h.close()


def openai_body(model: str, *urls: str) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "text", "text": f"see {IMAGE_MARKER}"}]
    parts += [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return {"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": parts}]}


def four_apis(model: str, data: bytes) -> list[tuple[str, dict[str, Any], str]]:
    b64 = base64.b64encode(data).decode()
    return [
        ("/v1/chat/completions", openai_body(model, data_url(data)), "messages[0].content[1].image_url.url"),
        ("/v1/responses", {"model": model, "input": [{"role": "user", "content": [
            {"type": "input_image", "image_url": data_url(data)}]}]}, "input[0].content[0].image_url"),
        ("/v1/messages", {"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}}]}]},
         "messages[0].content[0].source.data"),
        ("/api/chat", {"model": model, "stream": False, "messages": [
            {"role": "user", "content": "see", "images": [b64]}]}, "messages[0].images[0]"),
        ("/api/generate", {"model": model, "stream": False, "prompt": "see", "images": [b64]}, "images[0]"),
    ]  # fmt: skip


def error_param(path: str, body: Any) -> tuple[str | None, str]:
    """(param, message) of an error in each API's shape."""
    if path.startswith("/api/"):
        assert set(body) == {"error"} and isinstance(body["error"], str)
        return None, body["error"]
    if path == "/v1/messages":
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        return None, body["error"]["message"]
    return body["error"]["param"], body["error"]["message"]


async def test_a_model_without_vision_answers_400_naming_the_image_in_every_api(
    tmp_path: Path,
) -> None:
    async with env(tmp_path) as e:
        for path, body, param in four_apis(e.plain, png()):
            status, err = await e.post(path, body)
            assert status == 400, (path, err)
            got, message = error_param(path, err)
            assert got in (param, None) and param in message and "vision" in message, (path, err)
        assert e.runtime.calls == 0  # refused before any load
        await e.alive()


async def test_a_model_with_a_projector_takes_images_in_every_api_markers_in_order(
    tmp_path: Path,
) -> None:
    async with env(tmp_path) as e:
        for path, body, _ in four_apis(e.seer, png()):
            status, out = await e.post(path, body)
            assert status == 200, (path, out)
        assert len(RecordingEngine.prompts) == 5
        assert all(p.count(IMAGE_MARKER) == 1 for p in RecordingEngine.prompts)
        # what reaches the model is decoded RGB (once the prompt hands images to the runtime:
        # t22-vrt's app/core/inference/prompt.py calls tokenize_images; before it, nothing is handed)
        seen = [im for m in e.runtime.models for ims in m.images_seen for im in ims]
        assert seen and all((im.width, im.height, len(im.rgb)) == (3, 2, 18) for im in seen)
        assert {im.digest for im in seen} <= {decode_image(png(), where="").digest}
        # the literal marker the client typed is text, not an image
        assert MARKER_LOOKALIKE in RecordingEngine.prompts[0]
        status, _ = await e.post(
            "/v1/chat/completions", openai_body(e.seer, data_url(png()), data_url(png((0, 0, 9))))
        )
        assert status == 200
        last = RecordingEngine.prompts[-1]
        assert last.count(IMAGE_MARKER) == 2 and last.index(MARKER_LOOKALIKE) < last.index(
            IMAGE_MARKER
        )
        async with e.session.get(e.root + "/v1/models") as r:
            caps = {m["id"]: m["capabilities"] for m in (await r.json())["data"]}
        assert "vision" in caps[e.seer] and "vision" not in caps[e.plain]
        status, show = await e.post("/api/show", {"model": e.seer})
        assert status == 200 and "vision" in show["capabilities"]


def bomb() -> bytes:
    return png_header(100_000, 100_000)


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"\x89PNG\r\n\x1a\n garbage", "unsupported|corrupt"),
        (None, "pixels"),  # the bomb
        (b"II*\x00" + b"\x00" * 64, "unsupported image format"),  # TIFF
        (b"<svg xmlns='http://www.w3.org/2000/svg'/>", "unsupported image format"),
    ],
    ids=["corrupt", "bomb", "tiff", "svg"],
)
async def test_hostile_images_are_400_with_the_param_and_the_server_stays_up(
    tmp_path: Path, data: bytes | None, words: str
) -> None:
    payload = bomb() if data is None else data
    async with env(tmp_path) as e:
        for path, body, param in four_apis(e.seer, payload):
            status, err = await e.post(path, body)
            assert status == 400, (path, err)
            got, message = error_param(path, err)
            assert got in (param, None) and message.startswith(param) and re.search(words, message)
        await e.alive()
        assert (await e.post("/v1/chat/completions", openai_body(e.seer, data_url(png()))))[
            0
        ] == 200


async def test_truncated_oversize_bad_base64_and_media_type_mismatch(tmp_path: Path) -> None:
    noisy = io.BytesIO()
    Image.effect_noise((64, 64), 60).convert("RGB").save(noisy, "PNG")
    full = noisy.getvalue()
    async with env(tmp_path) as e:
        status, err = await e.post(
            "/v1/chat/completions", openai_body(e.seer, data_url(full[: len(full) // 2]))
        )
        assert status == 400 and err["error"]["param"] == "messages[0].content[1].image_url.url"
        e.vision[0] = VisionSettings(max_image_bytes=len(full) - 1)
        status, err = await e.post("/v1/chat/completions", openai_body(e.seer, data_url(full)))
        assert status == 400 and "bytes" in err["error"]["message"]
        e.vision[0] = VisionSettings(max_pixels=63 * 64)
        status, err = await e.post("/v1/chat/completions", openai_body(e.seer, data_url(full)))
        assert status == 400 and "64x64" in err["error"]["message"]
        e.vision[0] = VisionSettings()
        many = openai_body(e.seer, *[data_url(png())] * (MAX_IMAGES + 1))
        status, err = await e.post("/v1/chat/completions", many)
        assert status == 400 and f"at most {MAX_IMAGES} images" in err["error"]["message"]
        assert err["error"]["param"] == f"messages[0].content[{MAX_IMAGES + 1}].image_url.url"
        status, err = await e.post(
            "/v1/chat/completions", openai_body(e.seer, "data:image/png;base64,!!")
        )
        assert status == 400 and err["error"]["param"] == "messages[0].content[1].image_url.url"
        jpeg = io.BytesIO()
        Image.new("RGB", (2, 2)).save(jpeg, "JPEG")
        status, err = await e.post("/v1/messages", {"model": e.seer, "max_tokens": 4, "messages": [
            {"role": "user", "content": [{"type": "image", "source": {
                "type": "base64", "media_type": "image/png",
                "data": base64.b64encode(jpeg.getvalue()).decode()}}]}]})  # fmt: skip
        assert status == 400 and err["error"]["message"].startswith(
            "messages[0].content[0].source.media_type: the media type says image/png"
        )
        await e.alive()


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:1/x.png",
        "http://10.1.2.3/x.png",
        "http://169.254.169.254/latest/meta-data",
        "http://[::1]/x.png",
        "http://[::ffff:127.0.0.1]/x.png",
        "http://0.0.0.0/x.png",
        "http://224.0.0.1/x.png",
        "http://internal.test/red.png",  # DNS says 127.0.0.1
        "http://mixed.test/red.png",  # one address public, one private: refused
        "http://img.test/to-private",  # a public URL redirecting to a private address
        "http://img.test/to-internal",  # ... to a name resolving to loopback
    ],
)
async def test_urls_to_private_addresses_are_refused_redirects_and_dns_included(
    tmp_path: Path, url: str
) -> None:
    async with env(tmp_path) as e:
        e.vision[0] = VisionSettings(fetch_urls="all")
        status, err = await e.post("/v1/chat/completions", openai_body(e.seer, url))
        assert status == 400, err
        assert err["error"]["param"] == "messages[0].content[1].image_url.url"
        assert "non-public" in err["error"]["message"]
        assert "/red.png" not in e.served  # nothing was fetched from the private target
        await e.alive()


async def test_public_urls_are_fetched_redirects_followed_and_bounded(tmp_path: Path) -> None:
    async with env(tmp_path) as e:  # a loopback client: local-clients (the default) fetches
        status, out = await e.post(
            "/v1/chat/completions", openai_body(e.seer, "http://img.test/red.png")
        )
        assert status == 200, out
        assert e.served == ["/red.png"] and RecordingEngine.prompts[-1].count(IMAGE_MARKER) == 1
        status, out = await e.post(
            "/v1/chat/completions", openai_body(e.seer, "http://img.test/hop")
        )
        assert status == 200 and e.served[-2:] == ["/hop", "/red.png"]
        status, err = await e.post(
            "/v1/chat/completions", openai_body(e.seer, "http://img.test/loop")
        )
        assert status == 400 and "redirects more than 3" in err["error"]["message"]
        status, err = await e.post(
            "/v1/chat/completions", openai_body(e.seer, "http://img.test/nope")
        )
        assert status == 400 and "HTTP 404" in err["error"]["message"]
        status, err = await e.post(
            "/v1/chat/completions", openai_body(e.seer, "http://img.test/corrupt.png")
        )
        assert status == 400 and "messages[0].content[1].image_url.url" == err["error"]["param"]
        e.vision[0] = VisionSettings(max_image_bytes=100_000)
        status, err = await e.post(
            "/v1/chat/completions", openai_body(e.seer, "http://img.test/endless")
        )
        assert status == 400 and "over 100000 bytes" in err["error"]["message"]
        # a model without vision refuses before anything is fetched
        before = len(e.served)
        status, err = await e.post(
            "/v1/chat/completions", openai_body(e.plain, "http://img.test/red.png")
        )
        assert status == 400 and len(e.served) == before
        e.vision[0] = VisionSettings(fetch_urls="off")
        status, err = await e.post(
            "/v1/chat/completions", openai_body(e.seer, "http://img.test/red.png")
        )
        assert status == 400 and "vision.fetch_urls" in err["error"]["message"]
        assert len(e.served) == before  # off: nothing fetched
        await e.alive()


def lan_address() -> str | None:
    """This machine's address on a network (not loopback), or None."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the route's source
        addr = str(s.getsockname()[0])
        return None if addr.startswith("127.") else addr
    return None


async def test_local_clients_fetches_for_this_machine_only_and_all_for_everyone(
    tmp_path: Path,
) -> None:
    lan = lan_address()
    if lan is None:
        pytest.skip("no network address to connect from other than loopback")
    async with env(tmp_path, host=lan, allowed_hosts=(lan,)) as e:
        status, err = await e.post(
            "/v1/chat/completions", openai_body(e.seer, "http://img.test/red.png")
        )
        assert status == 400 and "local-clients" in err["error"]["message"] and not e.served
        status, _ = await e.post("/v1/chat/completions", openai_body(e.seer, data_url(png())))
        assert status == 200  # inline images are taken from any client
        e.vision[0] = VisionSettings(fetch_urls="all")
        status, out = await e.post(
            "/v1/chat/completions", openai_body(e.seer, "http://img.test/red.png")
        )
        assert status == 200 and e.served == ["/red.png"], out


def test_public_address_check() -> None:
    for a in ("127.0.0.1", "10.0.0.1", "172.16.0.1", "192.168.1.1", "169.254.169.254", "::1",
              "fe80::1", "fc00::1", "0.0.0.0", "::", "224.0.0.1", "100.64.0.1", "::ffff:10.0.0.1", "2002:7f00:1::1", "64:ff9b::7f00:1", "64:ff9b::a00:1",
              "192.0.2.1", "not an ip"):  # fmt: skip
        assert not public_address(a), a
    assert public_address(PUBLIC) and public_address("2606:4700::1111")
    assert public_address("64:ff9b::5db8:d822")  # NAT64 of a public address


async def test_the_fetcher_times_out() -> None:
    release = asyncio.Event()

    async def slow(request: web.Request) -> web.Response:
        await release.wait()  # held until the fetcher has given up (its bound: 0.2 s)
        return web.Response(body=b"")

    app = web.Application()
    app.router.add_get("/slow", slow)
    async with TestServer(app, host="127.0.0.1") as srv:
        f = ImageFetcher(names_resolve, {(PUBLIC, 80): ("127.0.0.1", srv.port or 0)}, timeout_s=0.2)
        try:
            with pytest.raises(InvalidImage, match="longer than") as e:
                await f.fetch("http://img.test/slow", where="u", max_bytes=10)
            assert e.value.param == "u"
        finally:
            release.set()


def test_hearth_serve_reads_vision_settings_and_resolves_names_for_real(tmp_path: Path) -> None:
    """The real server (ServerController, settings.json, the system resolver): the URL policy
    follows the file, and ``localhost`` is refused after real DNS resolution."""
    import httpx

    from tests.conftest import serving

    home = tmp_path / "home"
    with serving(home, write_model(tmp_path / "src" / "seer.gguf", chat_template=CHATML)) as s:
        lib_file = s.service.models._library.index_file  # type: ignore[attr-defined]
        index = json.loads(lib_file.read_text())
        index["models"][0]["extra"]["projector"] = str(write_projector(tmp_path / "mmproj.gguf"))
        lib_file.write_text(json.dumps(index))
        filecache.shared(lib_file, "library").invalidate()
        settings_file = home / "config" / "settings.json"

        def post(url: str) -> tuple[int, dict[str, Any]]:
            r = httpx.post(f"{s.base_url}/chat/completions", json=openai_body(s.model_id, url))
            return r.status_code, r.json()

        status, err = post("http://localhost:9/x.png")  # default local-clients: fetched, if public
        assert status == 400 and "non-public" in err["error"]["message"], err
        raw = json.loads(settings_file.read_text())
        settings_file.write_text(json.dumps({**raw, "vision": {"fetch_urls": "off"}}))
        filecache.shared(settings_file, "settings").invalidate()
        status, err = post("https://example.com/x.png")
        assert status == 400 and "'off'" in err["error"]["message"], err
