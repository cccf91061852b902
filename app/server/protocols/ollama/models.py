"""Ollama's model listings (/api/version, /api/tags, /api/show, /api/ps) from the service's
model statuses. Pure (no aiohttp).
Tested by tests/server/clients/test_ollama.py."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from app import __version__
from app.core.engine.scheduler import LoadedInfo
from app.core.gateway.providers.pool import RemoteListing
from app.core.inference.reasoning import OPEN_TAG, is_harmony_template
from app.core.types import ModelStatus
from app.server.protocols.ollama.render import now_iso

OLLAMA_VERSION = "0.12.0"  # the API level these shapes follow
LATEST = ":latest"
NEVER = "2318-08-08T00:00:00Z"  # Ollama shows a far-future time for "never unloads"


def tag(model_id: str) -> str:
    """The name Ollama clients expect: ``id:latest`` unless the id carries a tag."""
    return model_id if ":" in model_id else model_id + LATEST


def version() -> dict[str, Any]:
    return {"version": OLLAMA_VERSION, "hearth": __version__}


def _param_size(n: int | None) -> str:
    if not n:
        return ""
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.1f}{suffix}"
    return str(n)


def details(st: ModelStatus) -> dict[str, Any]:
    m = st.model
    return {
        "parent_model": "",
        "format": m.format,
        "family": m.architecture or "",
        "families": [m.architecture] if m.architecture else [],
        "parameter_size": _param_size(m.parameters),
        "quantization_level": m.quantization or "",
    }


def digest(st: ModelStatus) -> str:
    """A stable stand-in for Ollama's blob digest: the file's path, size and mtime."""
    m = st.model
    return hashlib.sha256(f"{m.path}|{m.size_bytes}|{m.mtime}".encode()).hexdigest()


def tags(
    statuses: Sequence[ModelStatus],
    aliases: Mapping[str, Sequence[str]] | None = None,
    remotes: Sequence[RemoteListing] = (),
) -> dict[str, Any]:
    return {
        "models": [
            {
                "name": tag(st.model.id),
                "model": tag(st.model.id),
                "modified_at": now_iso(st.model.mtime or st.model.added_at),
                "size": st.model.size_bytes,
                "digest": digest(st),
                "details": details(st),
            }
            for st in statuses
        ]
        + [_remote_tag(r) for r in remotes]
        + [_alias_tag(a, ts) for a, ts in (aliases or {}).items()]
    }


def _remote_tag(r: RemoteListing) -> dict[str, Any]:
    """A provider's model in /api/tags (no file here; ``owned_by``, ``state`` are Hearth's)."""
    return {
        "name": tag(r.id),
        "model": tag(r.id),
        "modified_at": now_iso(0),
        "size": 0,
        "digest": hashlib.sha256(f"remote|{r.id}".encode()).hexdigest(),
        "details": {"parent_model": "", "format": "remote", "family": "", "families": []},
        "owned_by": r.provider,
        "state": "remote",
        "context_length": r.model.context_length,
    }


def _alias_tag(alias: str, targets: Sequence[str]) -> dict[str, Any]:
    """An alias in /api/tags: no file of its own; ``targets`` is Hearth's addition."""
    return {
        "name": tag(alias),
        "model": tag(alias),
        "modified_at": now_iso(0),
        "size": 0,
        "digest": hashlib.sha256(f"alias|{alias}".encode()).hexdigest(),
        "details": {"parent_model": "", "format": "alias", "family": "", "families": []},
        "targets": list(targets),
    }


def show_remote(r: RemoteListing) -> dict[str, Any]:
    """/api/show of a provider's model: what its engine said (no file, no template here)."""
    info: dict[str, Any] = {"general.architecture": "remote"}
    if r.model.context_length:
        info["remote.context_length"] = r.model.context_length
    caps = ["embedding"] if "embeddings" in r.model.capabilities else ["completion"]
    if "fim" in r.model.capabilities:
        caps.append("insert")
    return {
        "modelfile": "",
        "parameters": "",
        "template": "",
        "details": {"parent_model": "", "format": "remote", "family": "", "families": []},
        "model_info": info,
        "capabilities": caps,
        "owned_by": r.provider,
        "modified_at": now_iso(0),
    }


# before a FIM model's template in /api/show: a Go template comment, so a client reading it as
# Ollama's sees the .Suffix that Ollama's own FIM templates use
FIM_NOTE = (
    "{{/* fill-in-the-middle: /api/generate takes .Suffix, built with the model's FIM tokens */}}"
)


def show(st: ModelStatus) -> dict[str, Any]:
    m = st.model
    arch = m.architecture or "unknown"
    info: dict[str, Any] = {"general.architecture": arch, "general.parameter_count": m.parameters}
    if m.context_length:
        info[f"{arch}.context_length"] = m.context_length
    caps = ["embedding"] if m.extra.get("embedding") else ["completion", "tools"]
    if "rerank" in m.capabilities:
        caps = ["rerank"] if m.extra.get("reranker") else [*caps, "rerank"]
    thinks = OPEN_TAG in (m.chat_template or "") or is_harmony_template(m.chat_template)
    if thinks and "embedding" not in caps:
        caps.append("thinking")  # <think> blocks or harmony channels, which are separated
    if "vision" in m.capabilities:
        caps.append("vision")
    template = m.chat_template or ""
    if "fim" in m.capabilities:
        caps.append("insert")  # Ollama's word: /api/generate takes a suffix
        # Continue's Ollama provider fills in the middle only when the template names .Suffix
        template = FIM_NOTE + template
    return {
        "modelfile": f"FROM {m.path}\n",
        "parameters": "",
        "template": template,
        "details": details(st),
        "model_info": info,
        "capabilities": caps,
        "modified_at": now_iso(m.mtime or m.added_at),
    }


def ps(loaded: Sequence[LoadedInfo], statuses: Sequence[ModelStatus]) -> dict[str, Any]:
    by_id = {s.model.id: s for s in statuses}
    out = []
    for i in loaded:
        st = by_id.get(i.model_id)
        if st is None:
            continue
        out.append(
            {
                "name": tag(i.model_id),
                "model": tag(i.model_id),
                "size": i.memory_bytes,
                "digest": digest(st),
                "details": details(st),
                "expires_at": now_iso(i.expires_at) if i.expires_at else NEVER,
                "size_vram": 0,
                "context_length": i.context_length,
            }
        )
    return {"models": out}
