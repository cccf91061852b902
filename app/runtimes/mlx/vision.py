"""MLX vision models through mlx-vlm: the processor that places images in a prompt, and the
embeddings that put them into mlx-lm's decode loop.

A model folder whose config.json has a ``vision_config`` loads through ``mlx_vlm.utils.load``
(mlx-vlm is optional: without it such a folder loads as a text model through mlx-lm, when mlx-lm
knows its architecture). The text half is driven exactly like a text model (``MlxEngine`` in
runtime.py: the same worker, sampler, grammar, cancellation and prompt cache): the vision tower and
projector run once per request with images, and their merged embeddings are fed to mlx-lm's
``generate_step`` as ``input_embeddings``.

In ``prompt_tokens`` an image's positions are negative pseudo-token ids derived from its digest
(:func:`app.core.inference.images.image_tokens`, as for llama.cpp), so the prompt cache reuses an image's
positions only for the same image at the same place. Models whose positions are not the cache
offset (Qwen-VL's M-RoPE: the embeddings come with position ids) get no cross-request reuse for
prompts with images. Verified on Linux CPU with a LLaVA-architecture model only
(tests/support/mlx_vlm_model.py); the other architectures follow mlx-vlm's documented API.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from app.core.inference.images import IMAGE_MARKER, ImageInput, image_tokens
from app.errors import InvalidRequest, ModelLoadFailed, RuntimeUnavailable

log = logging.getLogger(__name__)

# What stands for one image in a prompt, where the processor's own image token is not all of it
_PLACEHOLDERS = {
    "qwen2_vl": "<|vision_start|><|image_pad|><|vision_end|>",
    "qwen2_5_vl": "<|vision_start|><|image_pad|><|vision_end|>",
    "qwen3_vl": "<|vision_start|><|image_pad|><|vision_end|>",
    "idefics3": "<image>",
    "smolvlm": "<image>",
}


def is_vision_config(cfg: dict[str, Any]) -> bool:
    """An MLX folder's config.json that describes a vision model (mlx-vlm's folders)."""
    return isinstance(cfg.get("vision_config"), dict)


def vlm_available() -> bool:
    try:
        import mlx_vlm.utils  # noqa: F401
    except ImportError:
        return False
    return True


def _import_vlm() -> Any:
    try:
        from mlx_vlm import utils as vlm_utils
    except ImportError as e:
        raise RuntimeUnavailable(
            "mlx-vlm is not installed here (pip install mlx-vlm): vision models need it"
        ) from e
    return vlm_utils


class VisionModel:
    """An mlx-vlm model's processor and vision half (worker thread only, after construction)."""

    def __init__(self, path: Path, model_id: str) -> None:
        vlm_utils = _import_vlm()
        try:
            self.model, self.processor = vlm_utils.load(str(path))
        except (ValueError, OSError, KeyError, TypeError) as e:
            raise ModelLoadFailed(f"mlx-vlm could not load '{model_id}': {e}") from e
        cfg = self.model.config
        self.model_type = str(getattr(cfg, "model_type", "") or "")
        index = getattr(cfg, "image_token_index", None)
        if index is None:
            index = getattr(cfg, "image_token_id", None)
        proc = self.processor
        token = getattr(proc, "image_token", None)
        tok = getattr(proc, "tokenizer", proc)
        if index is None and isinstance(token, str):
            index = tok.convert_tokens_to_ids(token)
        if index is None:
            raise ModelLoadFailed(f"'{model_id}': its config names no image token")
        self.image_token_id = int(index)
        self.placeholder = _PLACEHOLDERS.get(self.model_type) or (
            token if isinstance(token, str) else "<image>"
        )
        # the processor's image token in user text is neutralised like IMAGE_MARKER
        self._image_token = token if isinstance(token, str) else self.placeholder
        self.language = LanguageView(self.model.language_model)
        self.encodes = 0  # vision-tower runs (the tests count cache use by it)

    # -- the prompt -------------------------------------------------------------------------
    def _pil(self, images: tuple[ImageInput, ...]) -> list[Any]:
        from PIL import Image

        out = []
        for im in images:
            if len(im.rgb) != im.width * im.height * 3:
                raise InvalidRequest("the image's pixels do not match its size", param=im.where)
            out.append(Image.frombytes("RGB", (im.width, im.height), im.rgb))
        return out

    def tokenize(self, text: str, images: tuple[ImageInput, ...]) -> list[int]:
        """The rendered prompt's tokens, each image's positions as its pseudo-tokens: the
        processor expands each image to its positions (so they count in the context check)."""
        pieces = text.split(IMAGE_MARKER)
        if len(pieces) - 1 != len(images):
            raise InvalidRequest(
                f"the prompt's image markers do not match its {len(images)} image(s)",
                param=images[0].where if images else "messages",
            )
        lookalike = self._image_token[:1] + "\u200b" + self._image_token[1:]
        safe = [p.replace(self._image_token, lookalike) for p in pieces]
        prompt = self.placeholder.join(safe)
        try:
            out = self.processor(text=[prompt], images=self._pil(images))
        except (ValueError, TypeError) as e:  # an image its processor cannot take (too small)
            raise InvalidRequest(
                f"the model's image processor refused the image: {e}",
                param=images[0].where or "messages",
            ) from e
        ids = [int(t) for t in _row(out["input_ids"])]
        return self._mark(ids, images)

    def _mark(self, ids: list[int], images: tuple[ImageInput, ...]) -> list[int]:
        """Each run of image-token positions as its image's pseudo-tokens. When the runs are
        not one per image (a model that puts separators inside an image), every image
        position is keyed on all the images together: still never another image's cache."""
        runs: list[tuple[int, int]] = []
        for i, t in enumerate(ids):
            if t != self.image_token_id:
                continue
            if runs and runs[-1][1] == i:
                runs[-1] = (runs[-1][0], i + 1)
            else:
                runs.append((i, i + 1))
        if not runs:
            raise InvalidRequest(
                "the model's processor placed none of the images in the prompt",
                param=images[0].where or "messages",
            )
        out = list(ids)
        if len(runs) == len(images):
            for (a, b), im in zip(runs, images, strict=True):
                out[a:b] = image_tokens(im.digest, b - a)
            return out
        import hashlib

        joint = hashlib.sha256("".join(im.digest for im in images).encode()).hexdigest()
        positions = [i for a, b in runs for i in range(a, b)]
        for i, t in zip(positions, image_tokens(joint, len(positions)), strict=True):
            out[i] = t
        return out

    def real_ids(self, tokens: list[int]) -> list[int]:
        """``tokens`` with each image pseudo-token back as the model's image token."""
        return [t if t >= 0 else self.image_token_id for t in tokens]

    # -- the embeddings ---------------------------------------------------------------------
    def embeddings(self, mx: Any, tokens: list[int], images: tuple[ImageInput, ...]) -> Any:
        """The whole prompt's input embeddings (n_tokens, hidden), the images merged in.
        After it, ``positional`` says whether they came with position ids (M-RoPE): such a
        prompt is computed from its start and its cache is not reused."""
        ip = getattr(self.processor, "image_processor", None)
        if ip is None:
            raise RuntimeError("the model's processor has no image processor")
        feats = ip(self._pil(images))
        kwargs = {k: mx.array(_numpy(v)) for k, v in dict(feats).items() if v is not None}
        pixel_values = kwargs.pop("pixel_values")
        ids = mx.array([self.real_ids(tokens)])
        emb = self.model.get_input_embeddings(ids, pixel_values, mask=None, **kwargs)
        self.encodes += 1
        extra = {k: v for k, v in emb.to_dict().items() if k != "inputs_embeds" and v is not None}
        self.language.extra = extra
        return emb.inputs_embeds[0]

    def close(self) -> None:
        self.model = None
        self.processor = None


class LanguageView:
    """mlx-vlm's language model as mlx-lm's ``generate_step`` calls a model: logits out, the
    merged embeddings in as ``input_embeddings``, its own cache kind."""

    def __init__(self, language_model: Any) -> None:
        self.lm = language_model
        # what the embeddings came with (position ids of an M-RoPE model); mlx-vlm's language
        # models take them on every call of the request
        self.extra: dict[str, Any] = {}

    @property
    def positional(self) -> bool:
        return bool(self.extra)

    @property
    def layers(self) -> Any:
        return self.lm.layers

    def make_cache(self) -> list[Any]:
        from mlx_vlm.models import cache as vlm_cache

        return list(vlm_cache.make_prompt_cache(self.lm))

    def __call__(self, inputs: Any, cache: Any = None, input_embeddings: Any = None) -> Any:
        if input_embeddings is None:  # a decode step (mlx-lm embeds only the prompt)
            return self.lm(inputs, cache=cache).logits
        return self.lm(inputs, inputs_embeds=input_embeddings, cache=cache, **self.extra).logits


def _row(ids: Any) -> list[int]:
    rows = ids.tolist() if hasattr(ids, "tolist") else list(ids)
    return list(rows[0]) if rows and isinstance(rows[0], list) else list(rows)


def _numpy(v: Any) -> Any:
    import numpy as np

    if isinstance(v, list) and v and not isinstance(v[0], (int, float)):
        return np.stack([np.asarray(x) for x in v])
    return np.asarray(v)
