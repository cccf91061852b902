"""The Server page starts and stops the real server; real HTTP requests show up in its table."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.request
from typing import Any

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from pytestqt.qtbot import QtBot

from app.core.events import RequestFinished
from app.gui.main_window import MainWindow
from app.gui.models.request_log import COLUMNS, RequestLogModel
from app.gui.views.server.charts.speed import format_speed
from tests.gui.helpers import SLOW, a_record, free_port


def row(model: RequestLogModel, r: int = 0) -> dict[str, str]:
    return {name: model.index(r, c).data() for c, name in enumerate(COLUMNS)}


def fetch_in_thread(url: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """Do the HTTP call off the GUI thread (the GUI must keep running to log it)."""
    result: dict[str, Any] = {}

    def go() -> None:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                result["status"] = resp.status
                result["json"] = json.loads(resp.read())
        except Exception as e:  # reported to the test through result
            result["error"] = e

    threading.Thread(target=go, daemon=True).start()
    return result


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_start_request_log_copy_and_stop(window: MainWindow, qtbot: QtBot) -> None:
    window.show_page("Server")
    page = window.server_page
    port = free_port()
    page.port_spin.setValue(port)

    qtbot.mouseClick(page.start_button, Qt.MouseButton.LeftButton)
    url = f"http://127.0.0.1:{port}/v1"
    qtbot.waitUntil(lambda: page.status_label.text() == f"Running at {url}", timeout=SLOW)
    assert page.url_edit.text() == url
    assert port_open(port)
    assert not page.start_button.isEnabled() and page.stop_button.isEnabled()
    assert not page.port_spin.isEnabled()  # the address is fixed while serving
    assert window.server_status.text() == f"Server: {url}"

    QGuiApplication.clipboard().clear()
    qtbot.mouseClick(page.copy_button, Qt.MouseButton.LeftButton)
    assert QGuiApplication.clipboard().text() == url

    result = fetch_in_thread(f"{url}/models")
    qtbot.waitUntil(lambda: page.request_model.rowCount() == 1, timeout=SLOW)
    assert result.get("status") == 200, result
    r = row(page.request_model)
    assert (r["Method"], r["Route"], r["Status"]) == ("GET", "/v1/models", "200")
    assert page.request_table.model() is page.request_model

    qtbot.mouseClick(page.stop_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: page.status_label.text() == "Stopped", timeout=SLOW)
    assert page.url_edit.text() == ""
    assert not port_open(port)
    assert page.start_button.isEnabled() and not page.stop_button.isEnabled()
    assert window.server_status.text() == "Server: stopped"


@pytest.mark.model
def test_a_chat_request_is_logged_with_tokens(
    window: MainWindow, qtbot: QtBot, imported: str
) -> None:
    page = window.server_page
    page.port_spin.setValue(0)  # any free port
    page.start_server()
    qtbot.waitUntil(lambda: page.url_edit.text() != "", timeout=SLOW)
    body = {
        "model": imported,
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 8,
    }
    result = fetch_in_thread(f"{page.url_edit.text()}/chat/completions", body)
    qtbot.waitUntil(
        lambda: any(
            row(page.request_model, i)["Route"] == "/v1/chat/completions"
            for i in range(page.request_model.rowCount())
        ),
        timeout=SLOW,
    )
    # the log entry is published as the response goes out: the client may still be reading it
    qtbot.waitUntil(lambda: "json" in result or "error" in result, timeout=SLOW)
    assert result.get("status") == 200, result
    usage = result["json"]["usage"]
    r = row(page.request_model)
    assert r["Model"] == imported
    assert r["Tokens"] == f"{usage['prompt_tokens']} in / {usage['completion_tokens']} out"
    assert float(r["tok/s"]) > 0


LONG_PROMPT = " ".join(
    f"Note {i}: the kettle is on the stove, the cat is on the mat, and the tea is warm."
    for i in range(40)
)  # about 900 tokens: two whole 512-token prefill chunks can come from the prompt cache


def wait_answer(result: dict[str, Any], qtbot: QtBot) -> dict[str, Any]:
    qtbot.waitUntil(lambda: "json" in result or "error" in result, timeout=SLOW)
    assert result.get("status") == 200, result
    return dict(result["json"])


@pytest.mark.model
def test_the_speed_chart_plots_each_generation_as_measured(
    window: MainWindow, qtbot: QtBot, imported: str
) -> None:
    page = window.server_page
    chart = page.speed_chart
    assert chart.is_empty and chart.toolTip() == "No generations yet"
    page.port_spin.setValue(0)
    page.start_server()
    qtbot.waitUntil(lambda: page.url_edit.text() != "", timeout=SLOW)
    url = page.url_edit.text()

    wait_answer(fetch_in_thread(f"{url}/models"), qtbot)
    qtbot.waitUntil(lambda: page.request_model.rowCount() == 1, timeout=SLOW)
    assert chart.is_empty  # listing models is no generation

    body = {
        "model": imported,
        "messages": [{"role": "user", "content": LONG_PROMPT}],
        "max_tokens": 8,
        "temperature": 0,
    }
    answers = []
    for n in (1, 2):  # the same long prompt twice: the second reuses the first's prompt cache
        answers.append(wait_answer(fetch_in_thread(f"{url}/chat/completions", body), qtbot))
        qtbot.waitUntil(lambda n=n: len(chart.points) == n, timeout=SLOW)
    # the log shows the records, committed a moment after the events the charts plot
    qtbot.waitUntil(lambda: page.request_model.rowCount() == 3, timeout=SLOW)

    for point, answer, r in zip(
        chart.points, answers, (row(page.request_model, 1), row(page.request_model, 0)), strict=True
    ):
        # the point is what the server measured and answered (timings are rounded to 3 places)
        timings = answer["timings"]
        assert point.decode_tps == pytest.approx(timings["predicted_per_second"], abs=1e-3)
        assert point.prompt_tps == pytest.approx(timings["prompt_per_second"], abs=1e-3)
        assert point.decode_tps > 0 and point.prompt_tps > 0
        assert r["tok/s"] == f"{point.decode_tps:.1f}"  # the same request's table row
    assert chart.decode_summary.latest == chart.points[-1].decode_tps
    assert chart.prompt_summary.latest == chart.points[-1].prompt_tps
    # the label shows the number as the chart formats it (whole tok/s from 100 up)
    assert format_speed(chart.points[-1].decode_tps) in chart.decode_summary.text()

    first, second = (a["usage"] for a in answers)
    assert first["prompt_tokens"] > 600
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    cached = second["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 512
    assert answers[1]["timings"]["cache_n"] == cached
    assert row(page.request_model, 1)["Tokens"] == (
        f"{first['prompt_tokens']:,} in / {first['completion_tokens']:,} out"
    )
    assert row(page.request_model, 0)["Tokens"] == (
        f"{second['prompt_tokens']:,} in ({cached:,} cached) / {second['completion_tokens']:,} out"
    )
    # the cache chart shows the same requests' hit rates and batch sizes
    cache = page.cache_chart.points
    assert [p.hit_rate for p in cache] == pytest.approx(
        [0.0, 100 * cached / second["prompt_tokens"]]
    )
    for point, answer in zip(cache, answers, strict=True):
        batch = answer["timings"]["batch_size"]  # 1.0: each was decoded alone
        assert point.batch_size == (pytest.approx(batch, abs=0.01) if batch > 0 else None)
    assert page.cache_chart.hits_text().startswith(
        f"latest {100 * cached / second['prompt_tokens']:.0f}%"
    )

    # the Ollama API logs the same measurements
    ollama_body = {
        "model": imported,
        "messages": body["messages"],
        "stream": False,
        "options": {"num_predict": 8, "temperature": 0},
    }
    base = url.removesuffix("/v1")
    ollama = wait_answer(fetch_in_thread(f"{base}/api/chat", ollama_body), qtbot)
    qtbot.waitUntil(lambda: len(chart.points) == 3, timeout=SLOW)
    qtbot.waitUntil(lambda: page.request_model.rowCount() == 4, timeout=SLOW)
    point = chart.points[-1]
    assert point.decode_tps == pytest.approx(
        ollama["eval_count"] / ollama["eval_duration"] * 1e9, rel=1e-3
    )
    assert point.prompt_tps > 0
    assert "cached) / " in row(page.request_model)["Tokens"]
    assert not chart.grab().isNull()


def test_a_busy_port_is_reported_inline(window: MainWindow, qtbot: QtBot) -> None:
    page = window.server_page
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        page.port_spin.setValue(busy.getsockname()[1])
        page.start_server()
        qtbot.waitUntil(lambda: page.banner.kind == "error", timeout=SLOW)
    assert "already in use" in page.banner.text()
    assert page.status_label.text() == "Stopped"
    assert page.start_button.isEnabled()


def test_request_log_model_is_newest_first_and_capped() -> None:
    model = RequestLogModel(cap=3)
    model.reset([(i, a_record(i)) for i in (2, 1, 0)])
    assert model.prepend([(i, a_record(i)) for i in (4, 3)]) == 2
    assert model.rowCount() == 3
    assert [row(model, r)["Route"] for r in range(3)] == ["/v1/r4", "/v1/r3", "/v1/r2"]
    assert model.prepend([(4, a_record(4)), (3, a_record(3))]) == 0  # never shown twice
    r = row(model)
    assert (r["Method"], r["Status"], r["Model"], r["Tokens"], r["tok/s"], r["Total ms"]) == (
        "POST",
        "200",
        "m",
        "10 in / 20 out",
        "40.0",
        "500",
    )
    assert len(r["Time"]) == len("2023-11-14 22:13")  # not today: the date too
    model.prepend([(5, a_record(5, time=time.time(), route="/health", method="GET", model=None,
                                answered_by=None, prompt_tokens=0, completion_tokens=0,
                                tokens_per_second=None))])  # fmt: skip
    r = row(model)
    assert (r["Model"], r["Tokens"], r["tok/s"], r["TTFT ms"]) == ("", "", "", "")
    assert len(r["Time"]) == 8  # today: HH:MM:SS
    model.prepend(
        [(6, a_record(6, prompt_tokens=1200, cached_tokens=1024, completion_tokens=24,
                      ttft_ms=123.4, model="alias", answered_by="m", key="alice",
                      status=429, error_code="rate_limit_exceeded"))]
    )  # fmt: skip
    r = row(model)
    assert r["Tokens"] == "1,200 in (1,024 cached) / 24 out"
    assert (r["TTFT ms"], r["Model"], r["Key"], r["Note"]) == (
        "123",
        "alias → m",
        "alice",
        "rate_limit_exceeded",
    )
    live = RequestFinished(
        "POST", "/v1/r6", 429, "m", 1200, 24, 0.9, 50.0, prompt_tokens_per_second=2500.0,
        cached_tokens=1024, arrived_at=1_700_000_006.0,
    )  # fmt: skip
    model.note_live(live)  # what the event adds to its record's row
    assert "prompt 2,500.0 tok/s" in model.index(0, 0).data(Qt.ItemDataRole.ToolTipRole)
