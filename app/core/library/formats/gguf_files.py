"""GGUF: one file per quantization, or its shards (``-00001-of-00003``), downloaded beside each other.

The library lists first shards only, so the first shard is renamed into place last: until it is,
a half-installed sharded model is invisible.
Tested by tests/core/library/test_formats.py and tests/core/library/test_projector.py.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from app.core.library import fit as fitlib
from app.core.library import gguf
from app.core.library.fim_vocab import can_fill
from app.core.library.formats.base import (
    HeaderReader,
    ModelFormat,
    ModelOption,
    Offer,
    RepoFile,
    partial_of,
    register,
)
from app.core.library.gguf import QUANT_RE, quant_of  # noqa: F401  (re-exported)
from app.core.library.gguf_check import check_for_llama_cpp, token_texts
from app.core.library.hardware import offload_gpus
from app.core.library.projector import is_projector_name, projector_rank
from app.core.util.fsutil import fsync_dir
from app.errors import HearthError, InvalidModel

log = logging.getLogger(__name__)

SHARD_RE = re.compile(r"^(?P<stem>.+)-(?P<idx>\d{5})-of-(?P<n>\d{5})\.gguf$", re.IGNORECASE)


def group_gguf(files: Iterable[RepoFile]) -> tuple[list[ModelOption], list[str]]:
    """GGUF files grouped by quantization: a sharded model (``-00001-of-00003``) is one option
    with its summed size. Vision projectors (``mmproj*.gguf``) are not models: each option
    gets the one that goes with it (``app.core.library.projector.projector_rank``), its size added.
    Returns (options, notes).
    """
    singles: list[RepoFile] = []
    projectors = [f for f in files if is_projector_name(f.basename)]
    shards: dict[tuple[str, str], dict[int, RepoFile]] = {}
    notes: list[str] = []
    for f in files:
        base = f.basename
        if not base.lower().endswith(".gguf") or is_projector_name(base):
            continue
        m = SHARD_RE.match(f.path)
        if m:
            shards.setdefault((m["stem"], m["n"]), {})[int(m["idx"])] = f
        else:
            singles.append(f)
    options: list[ModelOption] = []
    for f in singles:
        q = quant_of(f.path)
        stem = f.basename[:-5]
        options.append(ModelOption(q or stem, "gguf", q, (f,), f.size or 0))
    for (stem, n), parts in shards.items():
        total = int(n)
        if sorted(parts) != list(range(1, total + 1)):
            notes.append(f"{stem}: shards missing ({len(parts)} of {total}); skipped")
            continue
        ordered = tuple(parts[i] for i in range(1, total + 1))
        q = quant_of(stem)
        label = q or stem.rsplit("/", 1)[-1]
        options.append(ModelOption(label, "gguf", q, ordered, sum(p.size or 0 for p in ordered)))
    # two files with one quantization (e.g. two variants): name them by file instead
    counts: dict[str, int] = {}
    for o in options:
        counts[o.name] = counts.get(o.name, 0) + 1
    named = []
    for o in options:
        if counts[o.name] > 1:
            stem = SHARD_RE.sub(r"\g<stem>", o.first_file.basename)
            stem = stem[:-5] if stem.lower().endswith(".gguf") else stem
            o = ModelOption(stem, o.format, o.quantization, o.files, o.size_bytes)
        if projectors:
            model = o.first_file.path
            proj = min(projectors, key=lambda f: projector_rank(f.path, f.size, model))
            o = replace(o, projector=proj, size_bytes=o.size_bytes + (proj.size or 0))
        named.append(o)
    named.sort(key=lambda o: (o.size_bytes, o.name))
    return named, notes


class GgufFormat(ModelFormat):
    """GGUF files (llama.cpp): each download lands as plain files in the repo's folder."""

    name = "gguf"
    label = "GGUF"
    option_heading = "Quantization"
    search_tags = ("gguf",)
    suffix = ".gguf"

    # -- the Hub ---------------------------------------------------------------------------------
    def tagged(self, tags: Sequence[str], library_name: str | None) -> bool:
        return "gguf" in tags

    def matches_repo(
        self, names: Sequence[str], tags: Sequence[str], library_name: str | None
    ) -> bool:
        return any(n.endswith(self.suffix) for n in names)

    def offer(self, files: Sequence[RepoFile], *, config: Any, tags: Sequence[str]) -> Offer:
        options, notes = group_gguf(files)
        refused = None if options else "this repo has no usable GGUF model files"
        return Offer(tuple(options), refused, tuple(notes))

    def sharded(self, files: Sequence[RepoFile]) -> bool:
        return len(files) > 1

    def option_label(self, repo_id: str, option: ModelOption) -> str:
        return option.name

    async def estimate_remote(
        self, option: ModelOption, read_header: HeaderReader, *, context_length: int
    ) -> fitlib.MemoryEstimate:
        header = await read_header(option.first_file)
        est = fitlib.estimate_gguf(header, context_length=context_length)
        if option.sharded:  # the first shard's tensor table covers only its own tensors
            est = replace(est, weights=option.model_bytes)
        proj = option.projector
        if proj is not None:  # loaded with the model: its weights and its encoder's buffer
            try:
                est = fitlib.with_projector(est, await read_header(proj))
            except HearthError as e:  # no header: its size stands for its weights
                log.info("%s: no projector header (%s); counting its size", proj.path, e.message)
                est = replace(est, weights=est.weights + (proj.size or 0))
        return est

    # -- the download on disk --------------------------------------------------------------------
    def download_name(self, repo_id: str, files: Sequence[RepoFile]) -> str:
        return files[0].basename

    def target(self, repo_dir: Path, files: Sequence[RepoFile]) -> Path:
        return repo_dir / files[0].basename

    def staging(self, target: Path) -> Path:
        return target.parent  # shards sit beside the first one, as the library expects

    def final(self, target: Path, file: RepoFile) -> Path:
        return target.parent / file.basename

    def folders(self, target: Path, files: Sequence[RepoFile]) -> list[Path]:
        return []

    def installed(self, target: Path, files: Sequence[RepoFile]) -> bool:
        for f in files:
            final = self.final(target, f)
            if final.is_symlink() or not final.is_file() or final.stat().st_size != f.size:
                return False
            if partial_of(final).exists():
                return False
        return True

    def install(self, target: Path, files: Sequence[RepoFile]) -> None:
        ordered = list(files)
        for f in ordered[1:] + ordered[:1]:  # the first shard (what the library lists) last
            final = self.final(target, f)
            part = partial_of(final)
            if part.exists():
                os.replace(part, final)
        fsync_dir(target.parent)

    def discard(self, target: Path) -> None:
        return None  # nothing beyond the .partial files: the folder holds other models too

    # -- the library -----------------------------------------------------------------------------
    def describe(self, path: Path, *, declared: bool = False) -> dict[str, Any]:
        if not path.is_file():
            raise InvalidModel(f"{path} does not exist")
        if path.suffix.lower() != self.suffix and not declared:
            raise InvalidModel(f"{path.name} is not a .gguf file")
        h = gguf.read_header(path)
        check_for_llama_cpp(h, path)
        size = path.stat().st_size
        shards = gguf.shard_siblings(path)
        if len(shards) > 1:
            size = sum(p.stat().st_size for p in shards if p.is_file())
        name = h.metadata.get("general.name")
        return {
            "format": self.name,
            "size_bytes": size,
            "architecture": h.architecture,
            "name": name if isinstance(name, str) else None,
            "parameters": h.parameters,
            "quantization": h.quantization,
            "context_length": h.context_length,
            "chat_template": h.chat_template,
            "extra": {
                "embedding": h.is_embedding_model,
                "reranker": h.is_reranker,
                # prefix, suffix and middle markers: it can fill in the middle (editors)
                "fim": can_fill(h.metadata, token_texts(path, h)),
            },
        }

    def estimate_local(self, model: Any, options: Any) -> fitlib.MemoryEstimate:
        header = gguf.read_header(model.path)
        projector = model.extra.get("projector")
        batch = options.ubatch_size or options.batch_size
        if not projector and (options.gpu_layers == 0 or not offload_gpus()):
            # on the CPU a prompt is read CPU_PROMPT_PIECE tokens a decode (an image's
            # positions take whole batches)
            batch = min(batch, fitlib.CPU_PROMPT_PIECE)
        est = fitlib.estimate_gguf(
            header,
            context_length=options.context_length or None,
            kv_type=options.kv_type,
            batch_size=batch,
            # "auto" is off on CPU (app/runtimes/llama/backend.flash_attn_type), llama.cpp's
            # choice with a GPU: counted off, the larger compute buffer
            flash_attention=options.flash_attention == "on",
            embedding=bool(model.extra.get("embedding")),
            parallel=options.parallel,
            prompt_cache=options.prompt_cache,
            kv_layout=options.kv_layout,
        )
        if projector:  # a vision model's projector is loaded with it
            est = fitlib.with_projector(est, gguf.read_header(projector))
        return est


GGUF = register(GgufFormat())
