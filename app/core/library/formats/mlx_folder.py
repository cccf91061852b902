"""MLX: one folder per repo (config, tokenizer, safetensors), assembled hidden and renamed whole.

A repo whose config would make a loader import code from it is refused, both from what the
Hub's API says and, after the download, from the files themselves.
Tested by tests/core/library/test_index.py and tests/core/library/test_stores.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from app.core.library import fit as fitlib
from app.core.library.fim_vocab import can_fill
from app.core.library.formats.base import (
    HeaderReader,
    HubFormat,
    ModelFormat,
    ModelOption,
    Offer,
    RepoFile,
    partial_of,
    register,
)
from app.core.util.fsutil import fsync_dir
from app.errors import InvalidModel, RepoRefused

# What an MLX folder needs; everything else in the repo (code, pickles, images) stays behind.
MLX_SUFFIXES = (".json", ".safetensors", ".txt", ".model", ".jinja", ".tiktoken")
MLX_SKIP = {"readme.md", "license", "license.txt", "notice.txt"}


def mlx_files(files: Iterable[RepoFile]) -> list[RepoFile]:
    """The files an MLX folder needs (top-level weights, config and tokenizer; never code)."""
    out = []
    for f in files:
        if "/" in f.path:
            continue
        low = f.path.lower()
        if low in MLX_SKIP or not low.endswith(MLX_SUFFIXES):
            continue
        out.append(f)
    return out


def remote_code_reason(config: Any, tags: Iterable[str] = ()) -> str | None:
    """Why a model config would make a loader run code from the repo, or None.

    ``auto_map`` is transformers' ``trust_remote_code`` hook; ``model_file`` is mlx-lm's.
    """
    if "custom_code" in set(tags):
        return "the repo is tagged custom_code (it needs trust_remote_code)"
    if not isinstance(config, dict):
        return None
    if config.get("auto_map"):
        return "its config has an auto_map (it needs trust_remote_code)"
    if config.get("trust_remote_code"):
        return "its config asks for trust_remote_code"
    if config.get("model_file"):
        return "its config names a model_file (Python code the loader would import)"
    tok = config.get("tokenizer_config")
    if isinstance(tok, dict) and tok.get("auto_map"):
        return "its tokenizer config has an auto_map (custom tokenizer code)"
    return None


def local_remote_code(folder: Path) -> str | None:
    """The downloaded config itself (not only what the Hub's API said) must not ask for code."""
    for name in ("config.json", "tokenizer_config.json"):
        p = folder / name
        if not p.is_file():
            continue
        try:
            cfg = json.loads(p.read_text())
        except (OSError, ValueError):
            return f"{name} is not valid JSON"
        why = remote_code_reason(cfg)
        if why:
            return f"{name}: {why}"
    return None


def token_texts(path: Path, tok_cfg: Any) -> Iterable[bytes]:
    """The tokenizer's token texts as its files name them: the added tokens (where special
    markers such as FIM's are) of tokenizer_config.json and tokenizer.json, then the model's
    vocabulary (CodeLlama's ``▁<PRE>`` is an ordinary entry)."""
    if isinstance(tok_cfg, dict) and isinstance(tok_cfg.get("added_tokens_decoder"), dict):
        for t in tok_cfg["added_tokens_decoder"].values():
            if isinstance(t, dict) and isinstance(t.get("content"), str):
                yield t["content"].encode()
    try:
        data = json.loads((path / "tokenizer.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if not isinstance(data, dict):
        return
    for t in data.get("added_tokens") or ():
        if isinstance(t, dict) and isinstance(t.get("content"), str):
            yield t["content"].encode()
    vocab = (data.get("model") or {}).get("vocab")
    if isinstance(vocab, dict):
        yield from (str(k).encode() for k in vocab)
    elif isinstance(vocab, list):  # unigram: [text, score] pairs
        yield from (str(v[0]).encode() for v in vocab if isinstance(v, list) and v)


def is_mlx_folder(p: Path) -> bool:
    return p.is_dir() and (p / "config.json").is_file() and any(p.glob("*.safetensors"))


class MlxFormat(ModelFormat):
    """MLX folders (mlx-lm): a repo is one option, downloaded as one folder."""

    name: HubFormat = "mlx"
    label = "MLX"
    option_heading = "Folder"
    search_tags: tuple[str, ...] = ("mlx",)

    # -- the Hub ---------------------------------------------------------------------------------
    def tagged(self, tags: Sequence[str], library_name: str | None) -> bool:
        return library_name == "mlx" or "mlx" in tags

    def matches_repo(
        self, names: Sequence[str], tags: Sequence[str], library_name: str | None
    ) -> bool:
        return (
            self.tagged(tags, library_name)
            and "config.json" in names
            and any(n.endswith(".safetensors") for n in names)
        )

    def offer(self, files: Sequence[RepoFile], *, config: Any, tags: Sequence[str]) -> Offer:
        why = remote_code_reason(config, tags)
        if why:
            return Offer((), f"refusing this MLX repo: {why}")
        chosen = tuple(mlx_files(files))
        size = sum(f.size or 0 for f in chosen)
        q = config.get("quantization") if isinstance(config, dict) else None
        bits = f"{q['bits']}bit" if isinstance(q, dict) and isinstance(q.get("bits"), int) else None
        return Offer((ModelOption("mlx", "mlx", bits, chosen, size),), None)

    def sharded(self, files: Sequence[RepoFile]) -> bool:
        return False  # many files, one folder: never shards of one file

    def option_label(self, repo_id: str, option: ModelOption) -> str:
        folder = repo_id.rsplit("/", 1)[-1]
        bits = f", {option.quantization}" if option.quantization else ""
        return f"{folder}/ (MLX folder{bits})"

    async def estimate_remote(
        self, option: ModelOption, read_header: HeaderReader, *, context_length: int
    ) -> fitlib.MemoryEstimate:
        # no GGUF header: weights as stored plus the same runtime overhead
        return fitlib.MemoryEstimate(option.size_bytes, 0, 0, fitlib.MLX_OVERHEAD, context_length)

    # -- the download on disk --------------------------------------------------------------------
    def download_name(self, repo_id: str, files: Sequence[RepoFile]) -> str:
        return repo_id.split("/")[1]

    def target(self, repo_dir: Path, files: Sequence[RepoFile]) -> Path:
        return repo_dir

    def staging(self, target: Path) -> Path:
        return target.parent / f".{target.name}.partial"

    def final(self, target: Path, file: RepoFile) -> Path:
        return self.staging(target) / file.path

    def folders(self, target: Path, files: Sequence[RepoFile]) -> list[Path]:
        staging = self.staging(target)
        subdirs = {self.final(target, f).parent for f in files if "/" in f.path}
        return [staging, *sorted(subdirs)]

    def installed(self, target: Path, files: Sequence[RepoFile]) -> bool:
        return (
            target.is_dir()
            and not target.is_symlink()
            and all(
                (target / f.path).is_file() and (target / f.path).stat().st_size == f.size
                for f in files
            )
        )

    def install(self, target: Path, files: Sequence[RepoFile]) -> None:
        staging = self.staging(target)
        for f in files:
            final = self.final(target, f)
            part = partial_of(final)
            if part.exists():
                os.replace(part, final)
        why = local_remote_code(staging)
        if why:
            shutil.rmtree(staging, ignore_errors=True)
            raise RepoRefused(f"refusing {target.parent.name}/{target.name}: {why}")
        if target.exists():  # an earlier pull of this repo: swap it out
            old = target.parent / f".{target.name}.old-{os.getpid()}"
            os.replace(target, old)
            os.replace(staging, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, target)
        fsync_dir(target.parent)

    def discard(self, target: Path) -> None:
        staging = self.staging(target)
        if staging.is_dir() and not staging.is_symlink():
            shutil.rmtree(staging, ignore_errors=True)

    # -- the library -----------------------------------------------------------------------------
    def describe(self, path: Path, *, declared: bool = False) -> dict[str, Any]:
        if not is_mlx_folder(path):
            raise InvalidModel(
                f"{path} is not a model folder (needs config.json and *.safetensors)"
            )
        try:
            cfg = json.loads((path / "config.json").read_text())
        except (OSError, ValueError) as e:
            raise InvalidModel(f"{path}/config.json is unreadable: {e}") from e
        if not isinstance(cfg, dict):
            raise InvalidModel(f"{path}/config.json is not an object")
        size = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
        tok_cfg: dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError):
            tok_cfg = json.loads((path / "tokenizer_config.json").read_text())
        template = tok_cfg.get("chat_template") if isinstance(tok_cfg, dict) else None
        if not isinstance(template, str) and (path / "chat_template.jinja").is_file():
            template = (path / "chat_template.jinja").read_text()
        q = cfg.get("quantization") or cfg.get("quantization_config")
        return {
            "format": self.name,
            "size_bytes": size,
            "architecture": cfg.get("model_type"),
            "name": path.name,
            "parameters": None,
            "quantization": f"{q.get('bits')}bit"
            if isinstance(q, dict) and q.get("bits")
            else None,
            "context_length": cfg.get("max_position_embeddings")
            or (cfg.get("text_config") or {}).get("max_position_embeddings"),
            "chat_template": template if isinstance(template, str) else None,
            "extra": {
                # mlx-vlm's folders describe their vision tower: images are taken
                **({"vision": True} if isinstance(cfg.get("vision_config"), dict) else {}),
                # prefix, suffix and middle markers: it can fill in the middle (editors)
                "fim": can_fill((), token_texts(path, tok_cfg)),
            },
        }

    def estimate_local(self, model: Any, options: Any) -> fitlib.MemoryEstimate:
        return fitlib.estimate_mlx(model.path, context_length=options.context_length or None)


MLX = register(MlxFormat())
