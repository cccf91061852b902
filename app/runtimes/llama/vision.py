"""Images for a llama.cpp model through libmtmd: the projector (mmproj GGUF), the prompt's
image positions, and the embedding batches that put an image into a sequence.

An image takes a run of positions in the prompt. In ``prompt_tokens`` those are negative
pseudo-token ids derived from the image's digest (never a real token: real ids are >= 0), so the
prompt cache (slots.py compares token lists) reuses an image's cells only for the same
image at the same place, and a different image differs at its first position.
Tested by tests/runtimes/llama/test_vision.py and tests/gui/views/chat/test_images.py.
"""

from __future__ import annotations

import ctypes
import logging
from collections import OrderedDict
from pathlib import Path
from typing import Any

from app.core.inference.images import ImageInput, image_tokens
from app.core.library.projector import projector_problem
from app.core.types import LoadOptions, LocalModel
from app.errors import InvalidRequest, ModelLoadFailed
from app.runtimes.llama.backend import L

log = logging.getLogger(__name__)

_CHUNK_TEXT, _CHUNK_IMAGE = 0, 1  # mtmd_input_chunk_type
_ENCODED_KEPT = 4  # images whose embeddings stay encoded (the same image in the next turn)


def projector_path(model: LocalModel) -> str | None:
    p = model.extra.get("projector")
    return str(p) if p else None


def check_projector(model: LocalModel, path: str) -> None:
    """Refuse a projector that is not a vision projector or does not match the model's
    embedding width, from the two GGUF headers, before anything is loaded (the library's
    pairing asks the same question: ``app.core.library.projector``)."""
    why = projector_problem(model.path, path)
    if why is not None:
        raise ModelLoadFailed(f"'{model.id}': {why}")


class Projector:
    """An mtmd context over a loaded text model (worker thread only, after construction)."""

    def __init__(
        self, path: str, model: Any, *, threads: int, use_gpu: bool, flash_attn: int
    ) -> None:
        from llama_cpp import mtmd_cpp

        self.M = mtmd_cpp
        params = mtmd_cpp.mtmd_context_params_default()
        params.n_threads = threads
        params.use_gpu = use_gpu
        params.print_timings = False
        params.flash_attn_type = flash_attn
        params.warmup = True  # allocates the compute buffer now, not on the first request
        self.ctx = mtmd_cpp.mtmd_init_from_file(path.encode(), model, params)
        if not self.ctx:
            raise ModelLoadFailed(
                f"llama.cpp's mtmd could not load the projector '{Path(path).name}' for this "
                "model (it does not match it, or the file is damaged; see the log)"
            )
        if not mtmd_cpp.mtmd_support_vision(self.ctx):
            self.close()
            raise ModelLoadFailed(f"the projector '{Path(path).name}' has no vision encoder")
        self.n_embd = int(L.llama_model_n_embd_inp(model))
        self.marker = mtmd_cpp.mtmd_default_marker()
        self._encoded: OrderedDict[str, Any] = OrderedDict()
        self.encodes = 0  # images run through the encoder (the tests count cache use by it)

    def _chunks(self, text: bytes, images: tuple[ImageInput, ...], *, add_special: bool) -> Any:
        M = self.M
        bitmaps = (M.mtmd_bitmap_p_ctypes * max(1, len(images)))()
        for i, im in enumerate(images):
            if len(im.rgb) != im.width * im.height * 3:
                raise InvalidRequest("the image's pixels do not match its size", param=im.where)
            buf = (ctypes.c_uint8 * len(im.rgb)).from_buffer_copy(im.rgb)
            bitmaps[i] = M.mtmd_bitmap_init(im.width, im.height, buf)
        chunks = M.mtmd_input_chunks_init()
        inp = M.mtmd_input_text()
        inp.text, inp.text_len = text, len(text)
        inp.add_special, inp.parse_special = add_special, True
        try:
            rc = M.mtmd_tokenize(self.ctx, chunks, ctypes.byref(inp), bitmaps, len(images))
        finally:
            for i in range(len(images)):
                M.mtmd_bitmap_free(bitmaps[i])
        if rc != 0:
            M.mtmd_input_chunks_free(chunks)
            where = images[0].where if images else "messages"
            raise InvalidRequest(
                f"the prompt's image markers do not match its {len(images)} image(s) "
                f"(mtmd code {rc})",
                param=where or "messages",
            )
        return chunks

    def tokenize(self, text: str, images: tuple[ImageInput, ...]) -> list[int]:
        """The rendered prompt's tokens, each image's positions as its pseudo-tokens."""
        M = self.M
        chunks = self._chunks(text.encode("utf-8"), images, add_special=True)
        out: list[int] = []
        k = 0
        try:
            for i in range(M.mtmd_input_chunks_size(chunks)):
                chunk = M.mtmd_input_chunks_get(chunks, i)
                if M.mtmd_input_chunk_get_type(chunk) == _CHUNK_IMAGE:
                    n = int(M.mtmd_input_chunk_get_n_tokens(chunk))
                    out += image_tokens(images[k].digest, n)
                    k += 1
                    continue
                n_out = ctypes.c_size_t(0)
                ptr = M.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n_out))
                out += [int(ptr[j]) for j in range(n_out.value)]
        finally:
            M.mtmd_input_chunks_free(chunks)
        return out

    def encode(self, image: ImageInput) -> Any:
        """The image's embeddings, (n_tokens, n_embd) float32 (the last few are kept)."""
        import numpy as np

        hit = self._encoded.get(image.digest)
        if hit is not None:
            self._encoded.move_to_end(image.digest)
            return hit
        M = self.M
        chunks = self._chunks(self.marker, (image,), add_special=False)
        try:
            for i in range(M.mtmd_input_chunks_size(chunks)):
                chunk = M.mtmd_input_chunks_get(chunks, i)
                if M.mtmd_input_chunk_get_type(chunk) != _CHUNK_IMAGE:
                    continue
                n = int(M.mtmd_input_chunk_get_n_tokens(chunk))
                if M.mtmd_encode_chunk(self.ctx, chunk) != 0:
                    raise RuntimeError("the projector failed to encode the image")
                ptr = M.mtmd_get_output_embd(self.ctx)
                embd = np.ctypeslib.as_array(ptr, shape=(n * self.n_embd,)).copy()
                embd = embd.reshape(n, self.n_embd)
                break
            else:
                raise RuntimeError("mtmd made no image chunk for the image")
        finally:
            M.mtmd_input_chunks_free(chunks)
        self.encodes += 1
        self._encoded[image.digest] = embd
        while len(self._encoded) > _ENCODED_KEPT:
            self._encoded.popitem(last=False)
        return embd

    def close(self) -> None:
        if self.ctx:
            self.M.mtmd_free(self.ctx)
            self.ctx = None
        self._encoded.clear()


def open_images(
    model: LocalModel, options: LoadOptions, engine: Any, flash_attn: int
) -> ImageBatch:
    """The model's projector over the engine's loaded model, and its embedding batch."""
    gpu = options.gpu_layers != 0 and bool(L.llama_supports_gpu_offload())
    proj = Projector(
        projector_path(model) or "",
        engine.model,
        threads=engine.threads,
        use_gpu=gpu,
        flash_attn=flash_attn,
    )
    return ImageBatch(proj, int(engine.n_batch))


class ImageBatch:
    """The embedding batch an image's positions are decoded from (worker thread only)."""

    def __init__(self, projector: Projector, n_batch: int) -> None:
        self.projector = projector
        self.n_batch = n_batch
        self.batch = L.llama_batch_init(n_batch, projector.n_embd, 1)

    def fill(
        self, tokens: list[int], images: tuple[ImageInput, ...], start: int, seq_id: int
    ) -> int:
        """Fill the batch with the image positions from ``start`` (one image, at most n_batch
        of them); returns how many. The image is the one whose run holds ``start``."""
        firsts = [image_tokens(im.digest, 1)[0] for im in images]
        k, first = -1, 0
        for i in range(start + 1):  # an image's run starts at its first pseudo-token
            if k + 1 < len(images) and tokens[i] == firsts[k + 1]:
                k, first = k + 1, i
        if k < 0:
            raise RuntimeError("the prompt has image positions but not their image")
        embd = self.projector.encode(images[k])
        end = first + len(embd)
        n = min(end - start, self.n_batch, len(tokens) - start)
        rows = embd[start - first : start - first + n]
        b = self.batch
        ctypes.memmove(b.embd, rows.ctypes.data, rows.nbytes)
        for i in range(n):
            b.pos[i] = start + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = seq_id
            b.logits[i] = 0
        if start + n == len(tokens):
            b.logits[n - 1] = 1
        b.n_tokens = n
        return n

    def close(self) -> None:
        if self.batch is not None:
            L.llama_batch_free(self.batch)
            self.batch = None
        self.projector.close()
