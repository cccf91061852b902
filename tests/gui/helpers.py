"""Small helpers the GUI tests share (fixtures live in conftest.py)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from app.core.gateway.records import RecordStore, RequestRecord

SLOW = 180_000  # ms: model loads and generations on a small, possibly busy CI machine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def a_record(i: int = 0, **fields: object) -> RequestRecord:
    """A request record as the server writes them (``fields`` override)."""
    base: dict[str, object] = {
        "time": 1_700_000_000.0 + i,
        "route": f"/v1/r{i}",
        "protocol": "openai",
        "model": "m",
        "answered_by": "m",
        "provider": "local",
        "key": None,
        "stream": False,
        "status": 200,
        "error_code": None,
        "prompt_tokens": 10,
        "completion_tokens": 20,
        "total_ms": 500.0,
        "tokens_per_second": 40.0,
        "method": "POST",
    }
    return RequestRecord(**(base | fields))  # type: ignore[arg-type]


def write_records(db: Path, records: list[RequestRecord]) -> None:
    """Commit ``records`` to the database at ``db`` (in order: later ones are newer)."""
    store = RecordStore(db)
    for r in records:
        store.add(r)
    store.close()  # writes what is queued, then stops


def show_settings(window: Any, qtbot: Any) -> None:
    """Show the Settings page and let its Runtime report (made on first show, in a thread)
    arrive: the page's layout grows when it does, and a click aimed before that can miss."""
    window.show_page("Settings")
    box = window.settings_page.runtime_box
    if box is not None:
        qtbot.waitUntil(lambda: not box.checking, timeout=60_000)


def contrast(a: Any, b: Any) -> float:
    """WCAG 2's contrast ratio of two QColors (AA asks 4.5 for text)."""

    def luminance(c: Any) -> float:
        def channel(v: float) -> float:
            return v / 12.92 if v <= 0.04045 else ((v + 0.055) / 1.055) ** 2.4

        return (
            0.2126 * channel(c.redF()) + 0.7152 * channel(c.greenF()) + 0.0722 * channel(c.blueF())
        )

    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)
