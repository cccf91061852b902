"""Models other apps already downloaded: the Hugging Face cache, LM Studio, Ollama.

Found in place and listed with their ``origin``; Hearth never copies them and never deletes them
unless the user confirms. Each reader trusts nothing it finds: names come from folder layouts,
digests must be sha256 hex, and every path must stay inside the store it was found in.
Tested by tests/core/library/test_stores.py.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.core.library.formats.whisper_folder import is_whisper_folder

log = logging.getLogger(__name__)

ORIGIN_HF_CACHE = "huggingface-cache"
ORIGIN_LM_STUDIO = "lm-studio"
ORIGIN_OLLAMA = "ollama"
FOREIGN_ORIGINS = frozenset({ORIGIN_HF_CACHE, ORIGIN_LM_STUDIO, ORIGIN_OLLAMA})
OLLAMA_MODEL_MEDIA = "application/vnd.ollama.image.model"
_DIGEST_RE = re.compile(r"^sha256[:-]([0-9a-f]{64})$")
_LATER_SHARD = re.compile(r"-(?!00001-)\d{5}-of-\d{5}\.gguf$", re.IGNORECASE)
_MAX_MANIFEST = 1 << 20


@dataclass(frozen=True, slots=True)
class ForeignLocations:
    """Where other apps keep models. Every field is injectable (tests build fake stores)."""

    hf_cache: tuple[Path, ...] = ()
    lm_studio: tuple[Path, ...] = ()
    ollama: tuple[Path, ...] = ()

    @classmethod
    def default(cls) -> ForeignLocations:
        """The usual places, honouring ``HF_HUB_CACHE``/``HF_HOME`` and ``OLLAMA_MODELS``."""
        try:
            home = Path.home()
        except (RuntimeError, KeyError):  # no home folder (a service account): nothing to find
            return cls()
        hf = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
        if not hf:
            hf_home = os.environ.get("HF_HOME") or str(home / ".cache" / "huggingface")
            hf = str(Path(hf_home) / "hub")
        ollama = os.environ.get("OLLAMA_MODELS") or str(home / ".ollama" / "models")
        return cls(
            hf_cache=(Path(hf).expanduser(),),
            lm_studio=(home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"),
            ollama=(Path(ollama).expanduser(),),
        )


@dataclass(frozen=True, slots=True)
class FoundModel:
    """A model file or MLX folder found in another app's store."""

    path: Path  # as found (an HF cache snapshot path is a symlink into blobs/: kept as is)
    origin: str
    name: str  # what the library derives the id from
    format: str  # gguf | mlx
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


def _inside(p: Path, root: Path) -> bool:
    try:
        return p.resolve().is_relative_to(root.resolve())
    except OSError:
        return False


def _is_model_gguf(p: Path) -> bool:
    n = p.name.lower()
    return n.endswith(".gguf") and not n.startswith(("mmproj", ".")) and not _LATER_SHARD.search(n)


def _looks_mlx(p: Path, hinted: bool) -> bool:
    """An MLX folder: config.json + safetensors, and named or quantized for MLX (a plain
    transformers checkpoint in the HF cache is not one)."""
    if not ((p / "config.json").is_file() and any(p.glob("*.safetensors"))):
        return False
    if hinted:
        return True
    try:
        cfg = json.loads((p / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(cfg, dict) and isinstance(cfg.get("quantization"), dict)


def scan_hf_cache(root: Path) -> Iterator[FoundModel]:
    """``models--OWNER--NAME/snapshots/REV/``: GGUF files, MLX snapshots and Whisper folders
    (faster-whisper's own downloads: ``Systran/faster-whisper-*``)."""
    if not root.is_dir():
        return
    for repo in sorted(root.glob("models--*--*")):
        if not repo.is_dir() or repo.is_symlink():
            continue
        parts = repo.name.split("--")
        if len(parts) < 3:
            continue
        owner, name = parts[1], "--".join(parts[2:])
        snaps = repo / "snapshots"
        if not snaps.is_dir():
            continue
        main = None
        try:
            main = (repo / "refs" / "main").read_text().strip()
        except OSError:
            pass
        revs = sorted(
            (d for d in snaps.iterdir() if d.is_dir() and not d.is_symlink()),
            key=lambda d: (d.name != main, -d.stat().st_mtime),
        )
        seen: set[str] = set()
        for rev in revs:
            if is_whisper_folder(rev):
                # every file a symlink into this repo's blobs, as huggingface_hub makes them
                inside = all(_inside(f, repo) for f in rev.iterdir())
                if "whisper" not in seen and inside:
                    seen.add("whisper")
                    found = {"repo_id": f"{owner}/{name}", "revision": rev.name}
                    yield FoundModel(rev, ORIGIN_HF_CACHE, name, "whisper", found)
                continue
            hinted = owner.lower() == "mlx-community" or "mlx" in name.lower()
            if _looks_mlx(rev, hinted):
                if "mlx" not in seen and _inside(rev, repo):
                    seen.add("mlx")
                    yield FoundModel(
                        rev,
                        ORIGIN_HF_CACHE,
                        name,
                        "mlx",
                        {"repo_id": f"{owner}/{name}", "revision": rev.name},
                    )
                continue
            for f in sorted(rev.rglob("*.gguf")):
                rel = f.relative_to(rev).as_posix()
                if rel in seen or not _is_model_gguf(f) or not f.is_file():
                    continue
                if not _inside(f, repo):  # a symlink must point into this repo's blobs
                    log.warning("HF cache: %s points outside its repo; skipped", f)
                    continue
                seen.add(rel)
                yield FoundModel(
                    f,
                    ORIGIN_HF_CACHE,
                    f.name,
                    "gguf",
                    {"repo_id": f"{owner}/{name}", "revision": rev.name, "file": rel},
                )


def scan_lm_studio(root: Path) -> Iterator[FoundModel]:
    """``PUBLISHER/REPO/*.gguf`` and ``PUBLISHER/REPO/`` MLX folders."""
    if not root.is_dir():
        return
    for pub in sorted(root.iterdir()):
        if not pub.is_dir() or pub.name.startswith("."):
            continue
        for repo in sorted(pub.iterdir()):
            if not repo.is_dir() or repo.name.startswith(".") or not _inside(repo, root):
                continue
            if _looks_mlx(repo, True):
                yield FoundModel(
                    repo,
                    ORIGIN_LM_STUDIO,
                    repo.name,
                    "mlx",
                    {"repo_id": f"{pub.name}/{repo.name}"},
                )
                continue
            for f in sorted(repo.glob("*.gguf")):
                if _is_model_gguf(f) and f.is_file() and _inside(f, root):
                    yield FoundModel(
                        f, ORIGIN_LM_STUDIO, f.name, "gguf", {"repo_id": f"{pub.name}/{repo.name}"}
                    )


def ollama_name(host: str, namespace: str, name: str, tag: str) -> str:
    """``llama3.2:1b`` for the default library, ``ns/name:tag`` or ``host/ns/name:tag`` else."""
    base = f"{name}:{tag}"
    if host != "registry.ollama.ai":
        return f"{host}/{namespace}/{base}"
    return base if namespace == "library" else f"{namespace}/{base}"


def scan_ollama(root: Path) -> Iterator[FoundModel]:
    """``manifests/HOST/NAMESPACE/NAME/TAG`` (JSON) whose model layer is ``blobs/sha256-HEX``."""
    manifests = root / "manifests"
    blobs = root / "blobs"
    if not manifests.is_dir() or not blobs.is_dir():
        return
    for m in sorted(manifests.glob("*/*/*/*")):
        if not m.is_file() or m.is_symlink() or not _inside(m, manifests):
            continue
        host, ns, name, tag = m.relative_to(manifests).parts
        try:
            if m.stat().st_size > _MAX_MANIFEST:
                raise ValueError("manifest too large")
            data = json.loads(m.read_text())
            layers = data.get("layers") if isinstance(data, dict) else None
            if not isinstance(layers, list):
                raise ValueError("no layers")
        except (OSError, ValueError) as e:
            log.warning("Ollama: skipping manifest %s: %s", m, e)
            continue
        for layer in layers:
            if not isinstance(layer, dict) or layer.get("mediaType") != OLLAMA_MODEL_MEDIA:
                continue
            dm = _DIGEST_RE.match(str(layer.get("digest", "")))
            if not dm:
                log.warning("Ollama: %s has a malformed digest; skipped", m)
                break
            blob = blobs / f"sha256-{dm[1]}"
            if blob.is_file() and not blob.is_symlink() and _inside(blob, blobs):
                yield FoundModel(
                    blob,
                    ORIGIN_OLLAMA,
                    ollama_name(host, ns, name, tag),
                    "gguf",
                    {"manifest": str(m), "digest": f"sha256:{dm[1]}"},
                )
            break


def scan(locations: ForeignLocations) -> list[FoundModel]:
    """Every model found in the given stores (missing folders are simply empty)."""
    found: list[FoundModel] = []
    for root in locations.hf_cache:
        found.extend(_safe(scan_hf_cache, root))
    for root in locations.lm_studio:
        found.extend(_safe(scan_lm_studio, root))
    for root in locations.ollama:
        found.extend(_safe(scan_ollama, root))
    return found


def _safe(fn: Any, root: Path) -> list[FoundModel]:
    try:
        return list(fn(root))
    except OSError as e:
        log.warning("cannot scan %s: %s", root, e)
        return []


def delete_found(path: str, origin: str, extra: dict[str, Any]) -> bool:
    """Delete another app's model (the user confirmed). Returns whether anything was deleted.

    HF cache: the snapshot links and the blobs they point to. LM Studio: the file (all shards) or
    folder. Ollama: the manifest, and the blob when no other manifest uses it.
    """
    p = Path(path)
    try:
        if origin == ORIGIN_OLLAMA:
            return _delete_ollama(p, extra)
        if origin == ORIGIN_HF_CACHE:
            return _delete_hf(p)
        if origin == ORIGIN_LM_STUDIO:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
                return True
            m = re.match(r"^(?P<stem>.+)-00001-of-(?P<n>\d{5})\.gguf$", p.name, re.IGNORECASE)
            n = int(m["n"]) if m else 0
            for q in (
                [p.with_name(f"{m['stem']}-{i:05d}-of-{n:05d}.gguf") for i in range(1, n + 1)]
                if m
                else [p]
            ):
                q.unlink(missing_ok=True)
            return True
    except OSError as e:
        log.warning("could not delete %s: %s", path, e)
    return False


def _delete_hf(p: Path) -> bool:
    links = [q for q in p.iterdir()] if p.is_dir() and not p.is_symlink() else [p]
    deleted = False
    for link in links:
        if link.is_symlink():
            target = link.resolve()
            # blobs live in the repo folder, three levels up from snapshots/REV/FILE
            repo = next((a for a in link.parents if a.name.startswith("models--")), None)
            if repo is not None and target.is_relative_to(repo.resolve() / "blobs"):
                target.unlink(missing_ok=True)
            link.unlink()
            deleted = True
        elif link.is_file():
            link.unlink()
            deleted = True
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    return deleted


def _delete_ollama(blob: Path, extra: dict[str, Any]) -> bool:
    manifest = Path(str(extra.get("manifest", "")))
    digest = str(extra.get("digest", ""))
    if len(manifest.parts) < 5 or not _DIGEST_RE.match(digest):
        return False
    manifests = manifest.parents[3]
    if manifests.name != "manifests" or not _inside(manifest, manifests):
        return False
    manifest.unlink(missing_ok=True)
    still_used = False
    for m in manifests.glob("*/*/*/*"):
        try:
            if digest in m.read_text():
                still_used = True
                break
        except OSError:
            continue
    if not still_used and _inside(blob, manifests.parent / "blobs"):
        blob.unlink(missing_ok=True)
    return True
