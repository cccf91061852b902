"""Where each value on the Settings page lives in ``Settings``: how it is shown and how the
shown value is written back (the one table ``SettingsForm`` works from).
Tested by tests/gui/views/settings/test_apply.py and tests/gui/views/settings/test_page.py."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from PySide6.QtWidgets import QWidget

from app.gui.views.settings.form import SettingsForm
from app.settings import Settings

GIB = 1024**3
Read = Callable[[Settings], Any]
Write = Callable[[Settings, Any], Settings]


def _server(name: str) -> tuple[Read, Write]:
    return (
        lambda s: getattr(s.server, name),
        lambda s, v: replace(s, server=replace(s.server, **{name: v})),
    )


def _load(name: str) -> tuple[Read, Write]:
    return (
        lambda s: getattr(s.load, name),
        lambda s, v: replace(s, load=replace(s.load, **{name: v})),
    )


def _ui(name: str) -> tuple[Read, Write]:
    return (
        lambda s: getattr(s.ui, name),
        lambda s, v: replace(s, ui=replace(s.ui, **{name: v})),
    )


def _budget_write(s: Settings, v: Any) -> Settings:
    return replace(s, load=replace(s.load, memory_budget_bytes=round(v * GIB)))


def _ttl_write(s: Settings, v: Any) -> Settings:
    return replace(s, load=replace(s.load, jit_ttl_s=int(v) * 60))


FIELDS: dict[str, tuple[Read, Write]] = {
    "start_at_launch": _server("start_at_launch"),
    "tls_cert": _server("tls_cert"),
    "tls_key": _server("tls_key"),
    "jit_loading": _server("jit_loading"),
    "context_length": _load("context_length"),
    "max_auto_context": _load("max_auto_context"),
    "threads": _load("threads"),
    "parallel": _load("parallel"),
    "jit_keep_forever": _load("jit_keep_forever"),
    "prompt_cache": (
        lambda s: s.prompt_cache.mode,
        lambda s, v: replace(s, prompt_cache=replace(s.prompt_cache, mode=str(v))),
    ),
    # shown rounded (GiB, minutes); a value left untouched is kept exactly as on disk
    "memory_budget": (lambda s: s.load.memory_budget_bytes / GIB, _budget_write),
    "jit_ttl": (lambda s: round(s.load.jit_ttl_s / 60), _ttl_write),
    "theme": _ui("theme"),
    "close_action": _ui("close_action"),
    "log_content": (
        lambda s: s.records.log_content,
        lambda s, v: replace(s, records=replace(s.records, log_content=bool(v))),
    ),
}


def add_fields(form: SettingsForm, widgets: Mapping[str, QWidget], default_models_dir: str) -> None:
    """Add each of ``widgets`` (by its name in ``FIELDS``) to ``form``, and the models folder,
    whose default stays "the default" ("") wherever HEARTH_HOME moves it."""
    for name, widget in widgets.items():
        if name == "models_dir":
            form.add(
                name,
                widget,
                lambda s: s.models_dir or default_models_dir,
                lambda s, v: replace(s, models_dir="" if v == default_models_dir else v),
            )
        else:
            form.add(name, widget, *FIELDS[name])
