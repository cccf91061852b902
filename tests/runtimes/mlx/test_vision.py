"""Images through mlx-vlm in the MLX runtime, for real (mlx[cpu] here): the tiny LLaVA folder
tests/support/mlx_vlm_model.py builds. mlx-vlm's processor places the image, its vision tower and
projector encode it, the merged embeddings enter mlx-lm's decode loop; the weights are random,
so these check the path, never answer quality."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest

from app.core.inference.images import IMAGE_MARKER, ImageInput, decode_image
from app.core.library.index import ModelLibrary
from app.core.requests import ChatRequest
from app.core.service import Hearth, assemble
from app.core.types import ChatMessage, LoadOptions, SamplingParams
from app.errors import ContextLengthExceeded, UnsupportedParameter
from app.runtimes.mlx.runtime import MlxModel, MlxRuntime
from tests.conftest import Served, serving, transcript
from tests.support.service_calls import chat

pytest.importorskip("mlx_lm", reason="MLX runtime tests need mlx-lm (and mlx[cpu] on Linux)")
pytest.importorskip(
    "mlx_vlm",
    reason="MLX vision tests need mlx-vlm (pip install --no-deps mlx-vlm==0.7.10 requests)",
)

from tests.support.mlx_vlm_model import IMAGE_TOKENS, build_tiny_mlx_vlm_model  # noqa: E402

GREEDY = SamplingParams(temperature=0)
QUESTION = "what is in the picture?"


@dataclass
class Rig:
    root: Path
    vlm: Path
    text: Path


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Rig:
    from tests.support.mlx_model import build_tiny_mlx_model

    root = tmp_path_factory.mktemp("mlxvision")
    return Rig(
        root,
        build_tiny_mlx_vlm_model(root / "Tiny-MLX-Llava"),
        build_tiny_mlx_model(root / "Tiny-MLX-Text"),
    )


def hearth(rig: Rig, name: str, **options: object) -> Hearth:
    d = rig.root / name
    lib = ModelLibrary(d / "library.json", d / "models")
    opts = LoadOptions(**{"context_length": 512, **options})  # type: ignore[arg-type]
    return assemble(lib, {"mlx": MlxRuntime()}, load_defaults=lambda: opts)


def png(color: tuple[int, int, int], size: tuple[int, int] = (40, 30)) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, "PNG")
    return buf.getvalue()


def image(color: tuple[int, int, int], where: str = "messages[0].content[0]") -> ImageInput:
    return decode_image(png(color), where=where)


RED, BLUE, GREEN = (255, 0, 0), (0, 0, 255), (0, 160, 0)


def with_images(*imgs: ImageInput, text: str = QUESTION) -> ChatMessage:
    return ChatMessage("user", IMAGE_MARKER * len(imgs) + "\n" + text, images=imgs)


async def ask(h: Hearth, model_id: str, msg: ChatMessage, max_tokens: int = 2) -> tuple:
    gen = await chat(h, model_id, [msg], sampling=GREEDY, max_tokens=max_tokens, logprobs=5)
    return await transcript(gen)


async def test_images_enter_the_decode_and_the_cache_keys_on_them(rig: Rig) -> None:
    h = hearth(rig, "images")
    try:
        model, _ = h.models.import_path(rig.vlm)
        assert "vision" in model.capabilities  # the library saw the vision tower
        lm = await h.models.load(model.id)
        assert isinstance(lm, MlxModel) and "vision" in lm.capabilities
        vision = lm.engine.vision
        assert vision is not None
        text_only = await ask(h, model.id, ChatMessage("user", "\n" + QUESTION))
        a = await ask(h, model.id, with_images(image(RED)))
        # the image's positions count toward the prompt (the processor's 16 for 32x32)
        assert a[2].usage.prompt_tokens == text_only[2].usage.prompt_tokens + IMAGE_TOKENS
        encodes = vision.encodes
        b = await ask(h, model.id, with_images(image(BLUE)))
        assert vision.encodes == encodes + 1  # a new image goes through the vision tower
        # the prefix before the image is shared; the other image's positions are not reused
        assert 0 < b[2].usage.cached_tokens < a[2].usage.prompt_tokens - IMAGE_TOKENS
        a2 = await ask(h, model.id, with_images(image(RED)))
        # different pixels, different logprobs; the same pixels, the same ones
        assert [x[1] for x in a[1]] != [x[1] for x in b[1]]
        assert a[1][0][2] != b[1][0][2]
        assert a2[0] == a[0] and a2[1] == a[1]
        # two images in one message, each in its place: the order matters
        ab = await ask(h, model.id, with_images(image(RED), image(BLUE)))
        ba = await ask(h, model.id, with_images(image(BLUE), image(RED)))
        assert ab[2].usage.prompt_tokens == text_only[2].usage.prompt_tokens + 2 * IMAGE_TOKENS
        assert ab[1][0][2] != ba[1][0][2]
        # the same image again right after itself is a prompt-cache hit (its positions too),
        # and the vision tower does not run
        encodes = vision.encodes
        ba2 = await ask(h, model.id, with_images(image(BLUE), image(RED)))
        assert ba2[2].usage.cached_tokens == ba2[2].usage.prompt_tokens - 1
        assert vision.encodes == encodes and ba2[1] == ba[1]
    finally:
        await h.close()


async def test_a_cancelled_image_request_and_the_context_check(rig: Rig) -> None:
    h = hearth(rig, "cancel", context_length=64)
    try:
        model, _ = h.models.import_path(rig.vlm)
        mid = model.id
        first = await ask(h, mid, with_images(image(GREEN), text="hi"), max_tokens=3)
        gen = await chat(h, mid, [with_images(image(RED), text="hi")], sampling=GREEDY)
        gen.cancel()
        async for _ in gen:
            pass
        again = await ask(h, mid, with_images(image(GREEN), text="hi"), max_tokens=3)
        assert again[0] == first[0] and again[1] == first[1]

        async def count(msg: ChatMessage) -> int:
            return await h.count_tokens(ChatRequest(mid, (msg,)))

        # a text that fits in 64 positions, but not with an image's 16 too
        words = " ".join(["the sea"] * 20)
        plain = ChatMessage("user", "\n" + words)
        img = with_images(image(RED), text=words)
        assert await count(plain) < 64 <= await count(img)
        assert await count(img) == await count(plain) + IMAGE_TOKENS
        with pytest.raises(ContextLengthExceeded):
            await chat(h, mid, [img], sampling=GREEDY, max_tokens=1)
    finally:
        await h.close()


async def test_a_text_mlx_model_refuses_images(rig: Rig) -> None:
    h = hearth(rig, "text")
    try:
        model, _ = h.models.import_path(rig.text)
        assert "vision" not in model.capabilities
        with pytest.raises(UnsupportedParameter, match="is not a vision model") as e:
            await chat(h, model.id, [with_images(image(RED))], sampling=GREEDY)
        assert e.value.param == "messages[0].content[0]"
        assert not h.models.loaded()  # refused before any load
    finally:
        await h.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, rig: Rig) -> Iterator[Served]:
    with serving(tmp_path_factory.mktemp("vlmserved"), rig.vlm) as s:
        yield s


def test_an_image_through_the_openai_api(served: Served) -> None:
    c = openai.OpenAI(base_url=served.base_url, api_key="x", max_retries=0, timeout=120)
    m = c.models.retrieve(served.model_id).model_dump()
    assert "vision" in m["capabilities"]
    url = "data:image/png;base64," + base64.b64encode(png(RED)).decode()
    parts = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "hi"}]
    r = c.chat.completions.create(
        model=served.model_id,
        messages=[{"role": "user", "content": parts}],  # type: ignore[misc,list-item]
        max_tokens=3,
        temperature=0,
    )
    text = c.chat.completions.create(
        model=served.model_id,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=3,
        temperature=0,
    )
    assert r.usage is not None and text.usage is not None
    assert r.usage.prompt_tokens >= text.usage.prompt_tokens + IMAGE_TOKENS
    assert r.choices[0].finish_reason in ("length", "stop")
    assert json.loads(r.model_dump_json())["object"] == "chat.completion"


async def test_odd_image_shapes_are_taken(rig: Rig) -> None:
    h = hearth(rig, "shapes")
    try:
        model, _ = h.models.import_path(rig.vlm)
        for size in ((1, 1), (600, 2), (3, 500)):
            got = await ask(h, model.id, with_images(decode_image(png(RED, size), where="x")))
            assert got[2].usage.completion_tokens >= 1
    finally:
        await h.close()
