"""The Server page's request log reads the request records database: records from
before the window opened, filters through the CLI's own query, the TTFT column, every field on
Enter, and each finished request shown once (its record lands after its event)."""

from __future__ import annotations

import json
import urllib.request
from dataclasses import fields, replace
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.core.events import RequestFinished
from app.core.gateway.records import iso_utc, read_records, status_range
from app.gui.bridge import Bridge
from app.gui.context import GuiContext
from app.gui.models.request_log import COLUMNS, RequestLogModel
from app.gui.views.server.page import ServerPage
from app.gui.views.server.request_log import CONTENT_OFF, RequestLogView
from tests.gui.helpers import SLOW, a_record, write_records

WAIT = 10_000


def cells(model: RequestLogModel, r: int = 0) -> dict[str, str]:
    return {name: model.index(r, c).data() for c, name in enumerate(COLUMNS)}


def routes(model: RequestLogModel) -> list[str]:
    return [cells(model, r)["Route"] for r in range(model.rowCount())]


MIXED = [
    a_record(0, route="/v1/chat/completions", model="a", answered_by="a", ttft_ms=123.4),
    a_record(1, route="/v1/embeddings", model="b", answered_by="b", status=404,
             error_code="model_not_found"),
    a_record(2, route="/v1/chat/completions", model="alias", answered_by="b", status=429,
             error_code="rate_limit_exceeded", key="alice"),
    a_record(3, route="/api/chat", protocol="ollama", model="a", answered_by="a", status=503),
    a_record(4, route="/v1/models", method="GET", model=None, answered_by=None, status=401),
]  # fmt: skip


def test_records_from_before_the_window_opened_are_shown_newest_first(
    qtbot: QtBot, gui_ctx: GuiContext, bridge: Bridge
) -> None:
    db = gui_ctx.paths.requests_db
    write_records(db, MIXED)  # as a server that ran before this app started left them
    page = ServerPage(gui_ctx.server, bridge)
    qtbot.addWidget(page)
    model = page.request_model
    qtbot.waitUntil(lambda: model.rowCount() == len(MIXED), timeout=WAIT)
    assert routes(model) == [r.route for r in reversed(MIXED)]
    assert [model.record_at(i) for i in range(model.rowCount())] == read_records(db)
    # the TTFT column shows the record's value; the other columns its fields
    chat = cells(model, len(MIXED) - 1)
    assert (chat["TTFT ms"], chat["Status"], chat["Model"], chat["Total ms"]) == (
        "123",
        "200",
        "a",
        "500",
    )
    limited = cells(model, 2)
    assert (limited["Status"], limited["Note"], limited["Model"], limited["Key"]) == (
        "429",
        "rate_limit_exceeded",
        "alias → b",
        "alice",
    )
    assert "5 requests" in page.request_log.summary.text()


def test_a_big_log_is_bounded_to_the_newest_rows(
    qtbot: QtBot, gui_ctx: GuiContext, bridge: Bridge
) -> None:
    write_records(gui_ctx.paths.requests_db, [a_record(i) for i in range(30)])
    view = RequestLogView(gui_ctx.paths.requests_db, bridge, cap=10)
    qtbot.addWidget(view)
    qtbot.waitUntil(lambda: view.queries >= 1, timeout=WAIT)
    assert routes(view.model) == [f"/v1/r{i}" for i in range(29, 19, -1)]
    assert "the newest 10" in view.summary.text()


def test_the_filters_narrow_the_rows_with_the_clis_query(
    qtbot: QtBot, gui_ctx: GuiContext, bridge: Bridge
) -> None:
    db = gui_ctx.paths.requests_db
    write_records(db, MIXED)
    view = RequestLogView(db, bridge)
    qtbot.addWidget(view)
    qtbot.waitUntil(lambda: view.model.rowCount() == len(MIXED), timeout=WAIT)

    def narrowed(expected: list[str]) -> None:
        view.apply_filters()  # what the pause after typing does
        qtbot.waitUntil(lambda: routes(view.model) == expected, timeout=WAIT)

    view.status_edit.setText("4xx")
    narrowed(["/v1/models", "/v1/chat/completions", "/v1/embeddings"])
    # the same rows `hearth requests --status 4xx` prints
    shown = [view.model.record_at(i) for i in range(view.model.rowCount())]
    assert shown == read_records(db, status=status_range("4xx"))
    view.status_edit.setText("429")
    narrowed(["/v1/chat/completions"])
    view.status_edit.clear()
    view.model_edit.setText("b")  # the asked-for or the answering model
    narrowed(["/v1/chat/completions", "/v1/embeddings"])
    assert [view.model.record_at(i).status for i in range(2)] == [429, 404]
    view.model_edit.setText("a")
    view.route_edit.setText("CHAT")  # the route contains it, any case
    narrowed(["/api/chat", "/v1/chat/completions"])
    view.model_edit.clear()
    view.route_edit.setText("nothing-like-it")
    narrowed([])
    assert view.summary.text() == "No request matches."

    # a status that is neither a code nor a class: said, and the rows stay
    view.route_edit.clear()
    narrowed(routes_all := [r.route for r in reversed(MIXED)])
    view.status_edit.setText("4x")
    view.apply_filters()
    assert "status must be a code like 429" in view.summary.text()
    assert routes(view.model) == routes_all

    # typing alone re-reads once the typing pauses
    view.status_edit.setText("503")
    qtbot.waitUntil(lambda: routes(view.model) == ["/api/chat"], timeout=WAIT)


def test_enter_on_a_row_shows_every_field_of_its_record(
    qtbot: QtBot, gui_ctx: GuiContext, bridge: Bridge
) -> None:
    db = gui_ctx.paths.requests_db
    full = a_record(
        7, route="/v1/chat/completions", stream=True, key="alice", trace_id="4bf92f3577b34da6",
        cache="miss", queue_ms=1.5, load_ms=0.0, ttft_ms=88.0, provider="local",
        request_text='{"messages": "hi"}', response_text="Hello there",
    )  # fmt: skip
    write_records(db, [a_record(6, route="/v1/models", method="GET"), full])
    view = RequestLogView(db, bridge)
    qtbot.addWidget(view)
    view.show()
    qtbot.waitUntil(lambda: view.model.rowCount() == 2, timeout=WAIT)

    view.table.setFocus()
    view.table.setCurrentIndex(view.model.index(0, 0))
    qtbot.keyClick(view.table, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: view.detail is not None and view.detail.isVisible(), timeout=WAIT)
    d = view.detail
    assert d is not None
    shown = {name: label.text() for name, label in d.values.items()}
    names = [f.name for f in fields(full) if f.name not in ("request_text", "response_text")]
    assert set(names) <= set(shown)
    assert shown["trace_id"] == "4bf92f3577b34da6" and shown["key"] == "alice"
    assert shown["stream"] == "yes" and shown["cache"] == "miss"
    assert shown["ttft_ms"] == "88.0" and shown["status"] == "200"
    assert shown["error_code"] == "—"
    assert shown["time"].startswith(iso_utc(full.time))
    assert d.request_text.toPlainText() == '{"messages": "hi"}'
    assert d.response_text.toPlainText() == "Hello there"

    # a record kept without content says so; the last dialog is replaced, not stacked
    view.table.setCurrentIndex(view.model.index(1, 0))
    qtbot.keyClick(view.table, Qt.Key.Key_Enter)
    qtbot.waitUntil(lambda: view.detail is not d, timeout=WAIT)
    assert view.detail is not None
    assert view.detail.values["route"].text() == "/v1/models"
    assert view.detail.request_text.toPlainText() == CONTENT_OFF

    # a double-click opens it too
    second = view.detail
    view.detail.close()
    cell = view.table.visualRect(view.model.index(0, 2)).center()
    # a real double-click is a press, a release, then the double-click event
    qtbot.mouseClick(view.table.viewport(), Qt.MouseButton.LeftButton, pos=cell)
    qtbot.mouseDClick(view.table.viewport(), Qt.MouseButton.LeftButton, pos=cell)
    qtbot.waitUntil(lambda: view.detail is not second and view.detail is not None, timeout=WAIT)
    assert view.detail is not None and view.detail.values["key"].text() == "alice"


def test_a_finished_request_appears_once_even_when_its_record_lands_after_the_event(
    qtbot: QtBot, gui_ctx: GuiContext, bridge: Bridge
) -> None:
    db = gui_ctx.paths.requests_db
    write_records(db, [a_record(0)])
    view = RequestLogView(db, bridge)
    qtbot.addWidget(view)
    qtbot.waitUntil(lambda: view.model.rowCount() == 1, timeout=WAIT)

    # the event first (the server publishes it as the answer goes out) ...
    late = a_record(1, route="/v1/chat/completions")
    event = RequestFinished(
        "POST", late.route, 200, "m", 10, 20, 0.5, 40.0, cpu_busy=True, arrived_at=late.time
    )
    done = view.queries
    with qtbot.waitSignal(view.queried, timeout=WAIT):
        bridge.request_finished.emit(event)
    qtbot.waitUntil(lambda: view.queries > done, timeout=WAIT)
    assert view.model.rowCount() == 1  # no record yet: nothing shown in its place
    # ... its record a moment later: the log reads again until it is there
    write_records(db, [late])
    qtbot.waitUntil(lambda: view.model.rowCount() == 2, timeout=WAIT)
    assert cells(view.model)["Route"] == "/v1/chat/completions"
    assert cells(view.model)["Note"] == "CPU busy"  # the event's extras, on its record's row

    # more reads (the poll, a second event for the same request) never show it twice
    for _ in range(3):
        n = view.queries
        view.refresh()
        qtbot.waitUntil(lambda n=n: view.queries > n, timeout=WAIT)
    bridge.request_finished.emit(replace(event))
    n = view.queries
    qtbot.waitUntil(lambda: view.queries > n, timeout=WAIT)
    assert view.model.ids() == [2, 1]


@pytest.mark.model
def test_a_real_request_on_the_page_appears_once_with_its_ttft(
    qtbot: QtBot, gui_ctx: GuiContext, bridge: Bridge, smollm2_path: Path
) -> None:
    model_id = gui_ctx.service.models.import_path(smollm2_path)[0].id
    page = ServerPage(gui_ctx.server, bridge)
    qtbot.addWidget(page)
    page.show()
    page.port_spin.setValue(0)
    page.start_server()
    qtbot.waitUntil(lambda: page.url_edit.text() != "", timeout=SLOW)
    body = {
        "model": model_id,
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 4,
        "stream": True,
    }
    req = urllib.request.Request(
        f"{page.url_edit.text()}/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=SLOW / 1000) as resp:  # noqa: S310 - loopback
        assert b"[DONE]" in resp.read()
    model = page.request_model
    qtbot.waitUntil(lambda: model.rowCount() == 1, timeout=SLOW)
    rec = read_records(gui_ctx.paths.requests_db, limit=1)[0]
    assert model.record_at(0) == rec
    r = cells(model)
    assert (r["Route"], r["Status"], r["Model"]) == ("/v1/chat/completions", "200", model_id)
    assert rec.ttft_ms is not None and r["TTFT ms"] == f"{rec.ttft_ms:,.0f}"
    for _ in range(2):  # the poll and later events add nothing for it
        n = page.request_log.queries
        page.request_log.refresh()
        qtbot.waitUntil(lambda n=n: page.request_log.queries > n, timeout=WAIT)
    assert model.rowCount() == 1
