"""Per-model load presets (one JSON file): applied to explicit and on-demand (JIT) loads alike."""

from __future__ import annotations

import logging
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from app.core.fsutil import atomic_write_json, file_lock, read_json, remove_stale_writes
from app.core.tools import FAMILIES as TOOL_FAMILIES
from app.core.types import LoadOptions
from app.errors import InvalidRequest

log = logging.getLogger(__name__)

KV_TYPES = ("f16", "q8_0", "q4_0")
FLASH = ("auto", "on", "off")
ROPE = ("none", "linear", "yarn")
# preset keys that are not LoadOptions fields
EXTRA_KEYS = ("ttl", "pinned", "tool_format")
_LIMITS: dict[str, tuple[int, int]] = {
    "context_length": (0, 1 << 22),
    "threads": (0, 1024),
    "batch_size": (1, 1 << 16),
    "ubatch_size": (0, 1 << 16),
    "gpu_layers": (-1, 100_000),
    "parallel": (1, 16),
}


def validate_options(raw: dict[str, Any], *, where: str = "options") -> dict[str, Any]:
    """Check a dict of load options (from JSON: API, CLI, GUI, file). Raises InvalidRequest."""
    if not isinstance(raw, dict):
        raise InvalidRequest(f"'{where}' must be an object", param=where)
    known = {f.name: f for f in fields(LoadOptions)}
    out: dict[str, Any] = {}
    for k, v in raw.items():
        p = f"{where}.{k}"
        if k in EXTRA_KEYS:
            if (
                k == "ttl"
                and v is not None
                and (isinstance(v, bool) or not isinstance(v, int | float))
            ):
                raise InvalidRequest("'ttl' must be a number of seconds (-1 = never)", param=p)
            if k == "pinned" and not isinstance(v, bool):
                raise InvalidRequest("'pinned' must be a boolean", param=p)
            if k == "tool_format" and v not in (None, *TOOL_FAMILIES):
                raise InvalidRequest(f"'tool_format' must be one of {TOOL_FAMILIES}", param=p)
            out[k] = v
            continue
        if k not in known:
            raise InvalidRequest(f"unknown load option '{k}'", param=p)
        if k in _LIMITS:
            lo, hi = _LIMITS[k]
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise InvalidRequest(f"'{k}' must be an integer in [{lo}, {hi}]", param=p)
        elif k in ("use_mmap", "use_mlock"):
            if not isinstance(v, bool):
                raise InvalidRequest(f"'{k}' must be a boolean", param=p)
        elif k == "flash_attention" and v not in FLASH:
            raise InvalidRequest(f"'flash_attention' must be one of {FLASH}", param=p)
        elif k == "kv_type" and v not in KV_TYPES:
            raise InvalidRequest(f"'kv_type' must be one of {KV_TYPES}", param=p)
        elif k == "rope_scaling" and v not in ROPE:
            raise InvalidRequest(f"'rope_scaling' must be one of {ROPE}", param=p)
        elif k in ("rope_freq_base", "rope_freq_scale"):
            if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
                raise InvalidRequest(
                    f"'{k}' must be a non-negative number (0 = the model's)", param=p
                )
            v = float(v)
        elif k == "seed" and v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise InvalidRequest("'seed' must be an integer", param=p)
        out[k] = v
    return out


def apply_options(base: LoadOptions, overrides: dict[str, Any]) -> LoadOptions:
    names = {f.name for f in fields(LoadOptions)}
    return replace(base, **{k: v for k, v in overrides.items() if k in names})


class PresetStore:
    """``presets.json``: {model_id: {option: value}}."""

    def __init__(self, path: Path) -> None:
        self.path = path
        remove_stale_writes(path)  # left by a write that was killed mid-way

    def all(self) -> dict[str, dict[str, Any]]:
        try:
            data = read_json(self.path, {})
        except ValueError:
            log.error("presets file %s is corrupt; ignoring it", self.path)
            return {}
        if not isinstance(data, dict):
            return {}
        out = {}
        for mid, raw in data.items():
            try:
                out[mid] = validate_options(raw, where=mid)
            except InvalidRequest as e:
                log.warning("ignoring the preset of %s: %s", mid, e.message)
        return out

    def get(self, model_id: str) -> dict[str, Any]:
        return self.all().get(model_id, {})

    def set(self, model_id: str, options: dict[str, Any]) -> dict[str, Any]:
        clean = validate_options(options)
        with file_lock(self.path):
            data = self.all()
            if clean:
                data[model_id] = clean
            else:
                data.pop(model_id, None)
            atomic_write_json(self.path, data)
        return clean
