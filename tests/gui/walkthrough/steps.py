"""The walkthrough's steps, in the order a new user meets them: the welcome, importing models
(one from a terminal, one in the window), loading one, a chat, a failed turn, a restart, the
Settings page under the wheel and the Server page after traffic. Each checks what the user
should see and saves a screenshot named by its step."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QWidget

from tests.gui.walkthrough.harness import (
    HearthApp,
    check,
    grab,
    settle,
    wait_until,
    with_dialog,
)
from tests.gui.walkthrough.wheel import scroll_with_wheel

log = logging.getLogger("walkthrough")

REPO = Path(__file__).resolve().parents[3]
QUESTION = "Write a Python function that reverses a string. Put the code in a code block."
# a pasted text longer than the 2,048-token context: the engine refuses the turn
TOO_LONG = "hello " * 3000
SLOW = 600.0  # s: a load or an answer on a small, busy machine
# HTML the markdown renderer writes only for formatted text (not a plain paragraph)
FORMATTED = ("<pre", "<code", "<li", "<h1", "<h2", "<h3", "<strong", "<em", "<table")


@dataclass
class Walk:
    """One walkthrough: where its pictures go and what it has found so far."""

    out: Path
    app: HearthApp
    assets: Path | None = None  # the README's screenshots go here too (``--assets``)
    notes: list[str] = field(default_factory=list)
    smollm2: str = ""
    minilm: str = ""
    transcript: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def window(self) -> Any:
        return self.app.window

    def shot(self, name: str, widget: QWidget | None = None) -> Path:
        settle()
        return grab(widget or self.window, self.out / f"{name}.png")

    def readme(self, name: str, path: Path | None = None) -> None:
        """Keep ``path`` (else a grab of the window now) as README screenshot ``name``."""
        if self.assets is None:
            return
        target = self.assets / f"screenshot-{name}.png"
        if path is None:
            self.shot(f"readme-{name}")
            path = self.out / f"readme-{name}.png"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(path.read_bytes())
        log.info("README screenshot %s", target)

    def note(self, text: str) -> None:
        log.warning("%s", text)
        self.notes.append(text)


def shown(chat: Any) -> list[tuple[str, str, str]]:
    """Each message of the Chat page as the user sees it: role, text, the line under it."""
    return [(v.role, v.markdown(), v.notice) for v in chat.transcript.messages()]


def ask(chat: Any, text: str) -> str:
    """Send ``text`` and wait for the answer; returns its finish reason."""
    done: list[str] = []
    chat.answer_finished.connect(done.append)
    try:
        check(chat.send(text), f"the Chat page did not send {text[:40]!r}")
        wait_until(lambda: done, "the answer", SLOW)
    finally:
        chat.answer_finished.disconnect(done.append)
    return done[0]


# -- a. first run -----------------------------------------------------------------------------------
def welcome(walk: Walk, *, suggestions: bool = True) -> None:
    w = walk.window
    lib = w.library_page
    check(w.current_page == "Library", f"a first run opens on the Library, not {w.current_page}")
    wait_until(lambda: lib.showing_empty_message, "the welcome on an empty library")
    wait_until(
        lambda: w.welcome.loaded or w.welcome.retry_button.isVisible(),
        "the welcome's suggested models (or its offline message)",
    )
    check(w.welcome.isVisible(), "the welcome is not on screen")
    if suggestions:
        check(w.welcome.loaded, "the welcome listed no suggested models")
    walk.shot("a-welcome")


# -- b. importing models ----------------------------------------------------------------------------
def import_models(walk: Walk, smollm2: Path, minilm: Path) -> None:
    """SmolLM2 by ``hearth import`` in another process while the window is open (the Library
    follows without a click), MiniLM through the window's own import (the file dialog's and a
    drop's path)."""
    w = walk.window
    lib = w.library_page
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen")
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "import", str(smollm2)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    wait_until(lambda: proc.poll() is not None, "`hearth import` to finish", 120)
    said = proc.stdout.read() if proc.stdout else ""
    check(proc.returncode == 0, f"`hearth import` failed ({proc.returncode}): {said}")
    wait_until(
        lambda: lib.table_model.rowCount() == 1,
        "the Library to show the model `hearth import` added, without a click",
        30,
    )
    walk.smollm2 = lib.table_model.ids()[0]
    walk.shot("b1-imported-from-terminal")

    lib.import_files([str(minilm)])
    wait_until(lambda: lib.table_model.rowCount() == 2, "the window's own import of MiniLM")
    walk.minilm = next(i for i in lib.table_model.ids() if i != walk.smollm2)
    walk.shot("b2-imported-in-window")


# -- c. loading -------------------------------------------------------------------------------------
def load_model(walk: Walk) -> None:
    w = walk.window
    lib = w.library_page
    mid = walk.smollm2
    lib.select(mid)
    dialog = lib.open_load_dialog(mid)
    check(dialog is not None, "the Load dialog did not open")
    assert dialog is not None
    wait_until(lambda: dialog.estimate is not None, "the Load dialog's memory estimate", 60)
    walk.shot("c1-load-dialog", dialog)
    dialog_picture = dialog.grab()
    dialog.start_load()
    wait_until(lambda: lib.table_model.state_of(mid) == "loaded", "SmolLM2 to load", SLOW)
    lib.select(mid)
    walk.shot("c2-loaded")
    walk.readme("library")
    w.show_page("Models in memory")
    wait_until(lambda: w.memory_page.table_model.rowCount() == 1, "Models in memory to list it")
    settle(1.0)  # the memory bar's first sample
    path = with_dialog(w.grab(), dialog_picture, walk.out / "c3-models-with-load-dialog.png")
    walk.readme("models", path)


# -- d. a chat with markdown and a code block ------------------------------------------------------
def chat(walk: Walk) -> None:
    w = walk.window
    w.show_page("Chat")
    page = w.chat_page
    wait_until(lambda: page.current_model_id() == walk.smollm2, "Chat to offer SmolLM2")
    page.temperature_spin.setValue(0.0)
    page.max_tokens_spin.setValue(200)
    reason = ask(page, QUESTION)
    check(reason in ("stop", "length"), f"the answer ended with {reason!r}")
    view = page.transcript.last_message("assistant")
    check(view is not None and view.markdown().strip(), "no answer is shown")
    md = view.body.incremental
    formatted = [t for t in FORMATTED if t in md.html]
    check(formatted, f"the answer shows no formatted element; it was: {view.markdown()[:200]!r}")
    if md.codes:
        log.info("the answer has %d code block(s), rendered", len(md.codes))
    else:
        walk.note(
            "SmolLM2's answer had no fenced code block (formatted elements shown: "
            f"{', '.join(formatted)}); the chat screenshot shows what it wrote."
        )
    walk.shot("d-chat-code-block")
    walk.readme("chat")


# -- e. a failed turn -------------------------------------------------------------------------------
def failed_turn(walk: Walk) -> None:
    page = walk.window.chat_page
    reason = ask(page, TOO_LONG)
    check(reason == "error", f"an over-long prompt ended with {reason!r}, not an error")
    view = page.transcript.messages()[-1]
    check(view.notice.startswith("Error:"), f"the failed turn shows {view.notice!r}")
    check(view.notice_label.isVisibleTo(view), "the failed turn's error is not shown")
    page.transcript.scroll_to_end()
    walk.shot("e-failed-turn")


# -- f. restart and reopen --------------------------------------------------------------------------
def restart(walk: Walk) -> None:
    """Quit fully, start a new window over the same data folder, reopen the conversation with a
    click: the transcript is what was on screen before."""
    page = walk.window.chat_page
    walk.transcript = before = shown(page)
    check(len(before) >= 4, f"expected two turns before the restart, saw {len(before)} messages")
    walk.app.quit()
    walk.app = HearthApp()
    w = walk.window
    check(w.current_page == "Chat", f"Hearth reopened on {w.current_page}, not on Chat")
    w.show_page("Chat")
    session = w.chat_page.session
    check(session is not None, "the Chat page keeps no conversations")
    assert session is not None
    wait_until(lambda: len(session.sidebar.ids()) == 1, "the saved conversation in the sidebar")
    lw = session.sidebar.list_widget
    QTest.mouseClick(
        lw.viewport(), Qt.MouseButton.LeftButton, pos=lw.visualItemRect(lw.item(0)).center()
    )
    wait_until(lambda: len(shown(w.chat_page)) == len(before), "the conversation to reopen")
    after = shown(w.chat_page)
    for i, (a, b) in enumerate(zip(before, after, strict=True)):
        check(a == b, f"message {i} differs after the restart:\nbefore {a!r}\nafter  {b!r}")
    walk.shot("f-reopened-after-restart")


# -- g. Settings under the wheel --------------------------------------------------------------------
def settings_wheel(walk: Walk) -> None:
    w = walk.window
    w.show_page("Settings")
    page = w.settings_page
    box = page.runtime_box
    if box is not None:  # its report makes the page taller when it arrives
        wait_until(lambda: not box.checking, "the Runtime report", 60)
    wait_until(lambda: page.isEnabled(), "the Settings page to read the file")
    settle()
    file = walk.app.paths.settings_file
    on_disk = file.read_bytes() if file.exists() else b""
    widgets = [
        page.context_spin,
        page.max_auto_context_spin,
        page.threads_spin,
        page.parallel_spin,
        page.prompt_cache_combo,
        page.budget_spin,
        page.jit_ttl_spin,
        page.theme_combo,
        page.close_action_combo,
    ]
    values = [_value(v) for v in widgets]
    w.nav.setFocus()  # as after a click in the sidebar: no value widget has the focus
    walk.shot("g1-settings-before-wheel")
    moved = scroll_with_wheel(w.stack.currentWidget(), widgets)
    check(moved, "the Settings page did not scroll under the wheel")
    for widget, old in zip(widgets, values, strict=True):
        check(_value(widget) == old, f"the wheel changed {widget.objectName() or widget}")
    check(not page.unsaved, "the wheel left unsaved changes on the Settings page")
    check(
        (file.read_bytes() if file.exists() else b"") == on_disk,
        "the wheel changed settings.json",
    )
    walk.shot("g2-settings-after-wheel")


def _value(widget: Any) -> object:
    return widget.currentIndex() if hasattr(widget, "currentIndex") else widget.value()


# -- h. the Server page after traffic --------------------------------------------------------------
def server_traffic(walk: Walk) -> None:
    from tests.gui.helpers import free_port

    w = walk.window
    w.show_page("Server")
    sp = w.server_page
    sp.port_spin.setValue(free_port())
    sp.start_server()
    wait_until(lambda: sp.running and sp.base_url, "the server to start", 60)
    url = str(sp.base_url)
    seen_before = sp.request_model.rowCount()
    statuses: list[int] = []
    failures: list[BaseException] = []

    def post(path: str, body: dict[str, Any]) -> None:
        req = urllib.request.Request(
            f"{url}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=300) as r:
                r.read()
                statuses.append(r.status)
        except urllib.error.HTTPError as e:
            statuses.append(e.code)

    def client() -> None:
        try:
            for text in ("Hi!", "Name three rivers.", "Tell me a joke."):
                msgs = [{"role": "user", "content": text}]
                post(
                    "/chat/completions", {"model": walk.smollm2, "messages": msgs, "max_tokens": 24}
                )
            post("/embeddings", {"model": walk.minilm, "input": ["a warm hearth", "a cold night"]})
            post("/chat/completions", {"model": "no-such-model", "messages": msgs})
        except BaseException as e:  # shown as the step's failure below
            failures.append(e)

    t = threading.Thread(target=client, daemon=True)
    t.start()
    wait_until(lambda: not t.is_alive(), "the HTTP requests", SLOW)
    check(not failures, f"a request failed to send: {failures}")
    check(statuses[:4] == [200] * 4, f"chat and embeddings answered {statuses[:4]}")
    check(statuses[4] >= 400, f"the request for a missing model answered {statuses[4]}")
    wait_until(
        lambda: sp.request_model.rowCount() - seen_before >= 5, "the request log to list them"
    )
    codes = [sp.request_model.record_at(r).status for r in range(sp.request_model.rowCount())]
    check(any(c >= 400 for c in codes), f"the request log shows no error: {codes}")
    check(sp.speed_chart.decode_summary.latest, "the speed chart shows no generation")
    walk.shot("h-server-after-traffic")
    walk.readme("server")
    connect_page(walk)


def connect_page(walk: Walk, tool: str = "continue") -> None:
    w = walk.window
    w.show_page("Connect")
    page = w.connect_page
    page.select_tool(tool)
    wait_until(
        lambda: not page.pending and page.state is not None and page.state.running,
        "the Connect page to see the running server",
    )
    walk.shot("h-connect")
    walk.readme("connect")
