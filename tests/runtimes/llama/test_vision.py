"""Images through libmtmd in the llama.cpp runtime, for real: SmolLM2 with the tiny projector
GGUF that tests/support/vision_gguf.py writes. The image is encoded by libmtmd and its embeddings enter
Hearth's decode loop; the weights are random, so these check the path, never answer quality."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.core.inference.images import IMAGE_MARKER, ImageInput
from app.core.library.index import ModelLibrary
from app.core.requests import ChatRequest
from app.core.service import Hearth, assemble
from app.core.types import ChatMessage, LoadOptions, SamplingParams
from app.errors import ContextLengthExceeded, ModelLoadFailed
from app.runtimes.llama.runtime import LlamaCppModel, LlamaCppRuntime
from app.runtimes.llama.vision import image_tokens
from tests.conftest import REUSE_LOGPROB_TOLERANCE, assert_greedy_close, transcript
from tests.support import probes
from tests.support.service_calls import chat
from tests.support.vision_gguf import IMAGE_SIZE, N_IMAGE_TOKENS, image_rgb, write_projector

pytestmark = pytest.mark.model

GREEDY = SamplingParams(temperature=0)
QUESTION = "What is in this picture?"


@dataclass
class Rig:
    root: Path
    model: Path
    projector: Path
    wrong: Path  # projection_dim 64: SmolLM2 takes 576


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> Rig:
    root = tmp_path_factory.mktemp("vision")
    return Rig(
        root,
        smollm2_path,
        write_projector(root / "mmproj-test.gguf"),
        write_projector(root / "mmproj-wrong.gguf", projection_dim=64),
    )


def hearth(rig: Rig, name: str, **options: object) -> Hearth:
    d = rig.root / name
    lib = ModelLibrary(d / "library.json", d / "models")
    rt = LlamaCppRuntime(probe_file=probes.shared())
    opts = LoadOptions(**{"context_length": 1024, **options})  # type: ignore[arg-type]
    return assemble(lib, {"gguf": rt}, load_defaults=lambda: opts)


def pair(h: Hearth, model_path: Path, projector: Path | None) -> str:
    """Import the model and set its projector by hand (pull/scan pairing is another part)."""
    model, _ = h.models.import_path(model_path)
    if projector is not None:
        index = h.models._library.index_file
        data = json.loads(index.read_text())
        for m in data["models"]:
            if m["id"] == model.id:
                m.setdefault("extra", {})["projector"] = str(projector)
        index.write_text(json.dumps(data))
        h.models._library._index.invalidate()  # the library caches the index: make the edit seen
        assert h.models._library.get(model.id).extra.get("projector") == str(projector)
    return model.id


def image(seed: int) -> ImageInput:
    rgb = image_rgb(seed)
    digest = hashlib.sha256(b"%dx%d:" % (IMAGE_SIZE, IMAGE_SIZE) + rgb).hexdigest()
    return ImageInput(rgb, IMAGE_SIZE, IMAGE_SIZE, digest, f"messages[0].content[{seed}]")


def with_images(*imgs: ImageInput, text: str = QUESTION) -> ChatMessage:
    return ChatMessage("user", IMAGE_MARKER * len(imgs) + "\n" + text, images=imgs)


async def ask(h: Hearth, model_id: str, msg: ChatMessage, max_tokens: int = 2) -> tuple:
    gen = await chat(h, model_id, [msg], sampling=GREEDY, max_tokens=max_tokens, logprobs=5)
    return await transcript(gen)


def test_the_projector_is_a_small_real_gguf(rig: Rig) -> None:
    from app.core.library.gguf import read_header

    head = read_header(rig.projector)
    assert head.metadata["clip.projector_type"] == "mlp"
    assert head.metadata["clip.vision.projection_dim"] == 576
    assert rig.projector.stat().st_size < 400_000


async def test_a_mismatched_projector_is_refused_before_the_model_loads(rig: Rig) -> None:
    h = hearth(rig, "wrong")
    mid = pair(h, rig.model, rig.wrong)
    try:
        with pytest.raises(
            ModelLoadFailed, match="embedding size 64 does not match the model.s 576"
        ):
            await h.models.load(mid)
        assert not h.models.loaded()  # nothing stayed loaded
    finally:
        await h.close()


def first_token_gap(x: tuple, y: tuple) -> float:
    """The most a first-token alternative both transcripts list moved between them."""
    xs, ys = ({t: lp for t, lp, _ in z[1][0][2]} for z in (x, y))
    return max(abs(xs[t] - ys[t]) for t in xs.keys() & ys.keys())


async def test_images_enter_the_decode_and_the_cache_keys_on_them(rig: Rig) -> None:
    h = hearth(rig, "images")
    mid = pair(h, rig.model, rig.projector)
    try:
        lm = await h.models.load(mid)
        assert isinstance(lm, LlamaCppModel) and "vision" in lm.capabilities
        vision = lm.engine.vision
        assert vision is not None
        text_only = await ask(h, mid, ChatMessage("user", "\n" + QUESTION))
        a = await ask(h, mid, with_images(image(1)))
        # image tokens count toward the prompt (mtmd's count for a 32x32 image: 16)
        assert a[2].usage.prompt_tokens == text_only[2].usage.prompt_tokens + N_IMAGE_TOKENS
        encodes = vision.projector.encodes
        b = await ask(h, mid, with_images(image(2)))
        assert vision.projector.encodes == encodes + 1  # a new image is encoded
        # the prefix before the image is shared; the other image's cells are not reused
        assert b[2].usage.cached_tokens < a[2].usage.prompt_tokens - N_IMAGE_TOKENS
        a2 = await ask(h, mid, with_images(image(1)))
        # different pixels, different logits (the first token's alternatives moved by ~1.1 on
        # one CPU); the same pixels, the same ones within the reuse cache's tolerance (the
        # question asked again is read into other cells of the cache: 0.10 there)
        assert first_token_gap(a, b) > REUSE_LOGPROB_TOLERANCE
        if not assert_greedy_close(a[1], a2[1], "the same image again"):
            assert a2[0] == a[0]
        # ... and the same image again is a prompt-cache hit (its positions included)
        assert a2[2].usage.cached_tokens == a2[2].usage.prompt_tokens - 1
        # two images in one message, each in its place: the order matters
        ab = await ask(h, mid, with_images(image(1), image(2)))
        ba = await ask(h, mid, with_images(image(2), image(1)))
        assert ab[2].usage.prompt_tokens == text_only[2].usage.prompt_tokens + 2 * N_IMAGE_TOKENS
        assert ab[1][0][2] != ba[1][0][2]
    finally:
        await h.close()


async def test_text_on_a_vision_model_is_as_without_the_projector(rig: Rig) -> None:
    msg = ChatMessage("user", "Name a colour.")
    plain = hearth(rig, "plain")
    pid = pair(plain, rig.model, None)  # its own library: the same file, no projector
    try:
        expected = await ask(plain, pid, msg, max_tokens=4)
    finally:
        await plain.close()
    h = hearth(rig, "text")
    mid = pair(h, rig.model, rig.projector)
    try:
        got = await ask(h, mid, msg, max_tokens=4)
    finally:
        await h.close()
    assert got[0] == expected[0] and got[1] == expected[1]


async def test_image_sequences_batch_and_cancel(rig: Rig) -> None:
    # no prompt cache: the batched run reads the images again, as the solo ones did
    h = hearth(rig, "batch", parallel=2, prompt_cache="off")
    mid = pair(h, rig.model, rig.projector)
    try:
        lm = await h.models.load(mid)
        assert isinstance(lm, LlamaCppModel)
        m1, m2 = with_images(image(3)), with_images(image(4), text="Describe it.")
        solo = [await ask(h, mid, m, max_tokens=3) for m in (m1, m2)]
        assert lm.engine.peak_batch == 1
        # the first runs on (its end tokens banned) while the second's image is read and
        # decoded in the same steps; then the first is cancelled mid-stream
        ends = {int(lm.special_tokens["eos_id"])}
        ends |= set(lm.tokenize("<|im_end|>", add_special=False, parse_special=True))
        ban = SamplingParams(temperature=0, logit_bias=tuple((t, -1000.0) for t in ends))
        long = await chat(h, mid, [m1], sampling=ban, max_tokens=400, logprobs=5)
        first: list[tuple] = []
        deltas = aiter(long)  # held: leaving an iteration would cancel it
        while len(first) < 3:
            first += [(x.token, x.logprob, x.top) for x in (await anext(deltas)).logprobs]
        second = await ask(h, mid, m2, max_tokens=3)
        assert lm.engine.peak_batch == 2, "the two image sequences were decoded in one batch"
        long.cancel()
        rest = [d async for d in deltas]
        assert rest[-1].finish_reason == "cancelled"
        first = first[:3]
        for s, t in ((solo[0][1], first), (solo[1][1], second[1])):
            if not assert_greedy_close(s, t, "batched image sequence"):
                assert [x[0] for x in s] == [x[0] for x in t]
        # a request cancelled as soon as it is submitted (its image not yet or just being
        # read) leaves the slots consistent: the next request answers as before
        gen = await chat(h, mid, [with_images(image(5))], sampling=GREEDY, max_tokens=64)
        gen.cancel()
        async for _ in gen:
            pass
        again = await ask(h, mid, m1, max_tokens=3)
        if not assert_greedy_close(solo[0][1], again[1], "after a cancel"):
            assert again[0] == solo[0][0]
    finally:
        await h.close()


def test_image_pseudo_tokens_are_negative_and_keyed_on_the_digest() -> None:
    a, b = image(1), image(2)
    ta, tb = image_tokens(a.digest, N_IMAGE_TOKENS), image_tokens(b.digest, N_IMAGE_TOKENS)
    assert all(t < 0 for t in ta + tb)
    assert len(set(ta)) == N_IMAGE_TOKENS and ta[0] != tb[0]
    assert ta == image_tokens(a.digest, N_IMAGE_TOKENS)


async def test_the_memory_estimate_counts_the_projector(rig: Rig) -> None:
    from app.core.library import fit
    from app.core.library.gguf import read_header

    plain, vision = hearth(rig, "est-plain"), hearth(rig, "est-vision")
    try:
        a = plain.models.estimate(pair(plain, rig.model, None))
        b = vision.models.estimate(pair(vision, rig.model, rig.projector))
    finally:
        await plain.close()
        await vision.close()
    proj_weights = sum(t.n_bytes for t in read_header(rig.projector).tensors)
    assert b["weights"] == a["weights"] + proj_weights
    # an image's positions are decoded in whole batches: the language model's compute is
    # counted for a whole batch, where a text model on the CPU counts a prompt piece
    o = LoadOptions()
    whole = fit.estimate_gguf(
        read_header(rig.model), context_length=1024, batch_size=o.batch_size,
        parallel=o.parallel, prompt_cache=o.prompt_cache, kv_layout=o.kv_layout,
    )  # fmt: skip
    assert a["compute"] <= whole.compute
    # libmtmd logs a 0.02 MiB compute buffer for this projector; the estimate's is 0.04 MiB
    assert 10_000 < b["compute"] - whole.compute < 200_000
    assert b["total"] > a["total"]


async def test_image_positions_count_toward_the_context_check(rig: Rig) -> None:
    h = hearth(rig, "ctx", context_length=256)
    mid = pair(h, rig.model, rig.projector)
    try:
        lm = await h.models.load(mid)

        async def count(msg: ChatMessage) -> int:
            return await h.count_tokens(ChatRequest(mid, (msg,)))

        def text(n: int) -> str:
            return "Look." + " again" * n

        base, ten = await count(with_images(text=text(0))), await count(with_images(text=text(10)))
        # a text that leaves 8 positions free: room for it, not for an image's 16 too
        words = (lm.context_length - 8 - base) * 10 // (ten - base)
        plain = with_images(text=text(words))
        assert await count(plain) < lm.context_length
        img = with_images(image(1), text=text(words))
        assert await count(img) == await count(plain) + N_IMAGE_TOKENS
        await ask(h, mid, plain, max_tokens=1)
        with pytest.raises(ContextLengthExceeded):
            await chat(h, mid, [img], sampling=GREEDY, max_tokens=1)
    finally:
        await h.close()
