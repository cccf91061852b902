"""The loaded-models table model and its keep-alive texts, without a view or a service."""

from __future__ import annotations

from app.core.engine.scheduler import LoadedInfo
from app.core.types import LoadOptions
from app.gui.models.memory import (
    COLUMNS,
    LoadedModelsTableModel,
    MemorySnapshot,
    countdown,
    keep_alive_text,
    ttl_text,
)

NOW = 1_000_000.0


def info(model_id: str = "m", **changes: object) -> LoadedInfo:
    base: dict[str, object] = dict(
        model_id=model_id,
        runtime="llama.cpp",
        context_length=4096,
        loaded_at=NOW - 60,
        last_used=NOW - 10,
        pending=0,
        memory_bytes=300 * 1024**2,
        ttl=300.0,
        expires_at=NOW + 272,
        pinned=False,
        options=LoadOptions(context_length=4096),
    )
    base.update(changes)
    return LoadedInfo(**base)  # type: ignore[arg-type]


def test_countdown_formats() -> None:
    assert countdown(272) == "4:32"
    assert countdown(271.2) == "4:32"  # rounds up: 0:00 only when due
    assert countdown(3723) == "1:02:03"
    assert countdown(-5) == "0:00"


def test_keep_alive_text_covers_each_state() -> None:
    assert keep_alive_text(info(), NOW) == "Unloads in 4:32"
    assert keep_alive_text(info(pinned=True, expires_at=None), NOW) == "Pinned"
    assert keep_alive_text(info(ttl=None, expires_at=None), NOW) == "Never"
    assert keep_alive_text(info(pending=2, expires_at=None), NOW) == "Busy"
    assert keep_alive_text(info(expires_at=NOW - 1), NOW) == "Unloading…"
    assert ttl_text(None) == "never" and ttl_text(900) == "15 min idle"
    assert ttl_text(0) == "as soon as idle" and ttl_text(90) == "90 s idle"


def test_table_model_rows_and_countdown_tick() -> None:
    clock = [NOW]
    model = LoadedModelsTableModel(clock=lambda: clock[0])
    model.set_models([info("a"), info("b", pinned=True, pending=1, expires_at=None)])
    assert model.rowCount() == 2 and model.columnCount() == len(COLUMNS)
    row = {c: model.index(0, i).data() for i, c in enumerate(COLUMNS)}
    assert row["Model"] == "a" and row["Context"] == "4,096" and row["Memory"] == "300.0 MiB"
    assert row["Keep-alive"] == "Unloads in 4:32" and row["Requests"] == ""
    assert model.index(1, COLUMNS.index("Requests")).data() == "1"
    assert model.index(1, COLUMNS.index("Keep-alive")).data() == "Pinned"

    changed: list[tuple[int, int]] = []
    model.dataChanged.connect(lambda tl, br, *_: changed.append((tl.column(), br.column())))
    clock[0] += 2
    model.tick()
    assert changed == [(COLUMNS.index("Keep-alive"), COLUMNS.index("Keep-alive"))]
    assert model.index(0, COLUMNS.index("Keep-alive")).data() == "Unloads in 4:30"

    # the same models update in place (a view keeps its selection); others reset
    resets: list[bool] = []
    model.modelReset.connect(lambda: resets.append(True))
    model.set_models([info("a", pending=3), info("b")])
    assert resets == [] and model.index(0, COLUMNS.index("Requests")).data() == "3"
    model.set_models([info("b")])
    assert resets == [True] and model.ids() == ["b"]


def test_snapshot_find() -> None:
    snap = MemorySnapshot((info("a"), info("b")), used=1, budget=2)
    assert snap.find("b") is not None and snap.find("c") is None
