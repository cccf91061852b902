"""Per-model load presets (one JSON file): applied to explicit and on-demand (JIT) loads alike.
Tested by tests/core/engine/test_load_options.py and tests/core/engine/test_scheduler_policy.py."""

from __future__ import annotations

import logging
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from app.core.engine.load_options import check_option
from app.core.inference.tools import FAMILIES as TOOL_FAMILIES
from app.core.types import LoadOptions
from app.core.util.fsutil import atomic_write_json, file_lock, read_json, remove_stale_writes
from app.errors import InvalidRequest

log = logging.getLogger(__name__)

CHAT_KEY = "chat"  # the Chat page's settings for the model (sampling, system prompt): an object
# preset keys that are not LoadOptions fields
EXTRA_KEYS = ("ttl", "pinned", "tool_format", CHAT_KEY)


def validate_options(raw: dict[str, Any], *, where: str = "options") -> dict[str, Any]:
    """Check a dict of load options (from JSON: API, CLI, GUI, file) against the option table,
    plus a preset's own keys (``EXTRA_KEYS``). Raises InvalidRequest."""
    if not isinstance(raw, dict):
        raise InvalidRequest(f"'{where}' must be an object", param=where)
    out: dict[str, Any] = {}
    for k, v in raw.items():
        p = f"{where}.{k}"
        if k not in EXTRA_KEYS:
            out[k] = check_option(k, v, param=p)
            continue
        if k == "ttl" and v is not None and (isinstance(v, bool) or not isinstance(v, int | float)):
            raise InvalidRequest("'ttl' must be a number of seconds (-1 = never)", param=p)
        if k == "pinned" and not isinstance(v, bool):
            raise InvalidRequest("'pinned' must be a boolean", param=p)
        if k == "tool_format" and v not in (None, *TOOL_FAMILIES):
            raise InvalidRequest(f"'tool_format' must be one of {TOOL_FAMILIES}", param=p)
        if k == CHAT_KEY and not isinstance(v, dict):
            raise InvalidRequest(f"'{CHAT_KEY}' must be an object", param=p)
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
