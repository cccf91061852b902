"""MCP tools on the Chat page, through the real service and worker (a scripted engine writes the
model's hermes tool calls) and a real stdio MCP server: the Tools menu, Allow once and Deny
clicked in the call block, Stop while a call waits for approval, and a server killed mid-chat."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.core.library.index import ModelLibrary
from app.core.service import assemble
from app.core.types import LoadOptions, Runtime
from app.core.util.loop import LoopThread
from app.core.workspace.mcp import McpManager
from app.core.workspace.mcp.toolloop import DENIED_TEXT
from app.gui.bridge import Bridge
from app.gui.views.chat.page import ChatPage
from tests.gui.helpers import SLOW
from tests.support.fakes import FakeRuntime
from tests.support.gguf_files import write_model
from tests.support.mcp_fixtures import stdio_entry, write_config

TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if tools %}<tool_call>{{ tools | tojson }}</tool_call>{% endif %}<|im_start|>assistant\n"
)
ANSWER = ["The sum", " is 5."]
CALL = ["<tool_call>\n", json.dumps({"name": "local__add", "arguments": {"a": 2, "b": 3}}),
        "\n</tool_call>"]  # fmt: skip


class Core:
    def __init__(self, tmp: Path) -> None:
        lib = ModelLibrary(tmp / "lib.json", tmp / "models")
        lib.import_path(write_model(tmp / "src" / "m.gguf", chat_template=TEMPLATE))
        self.runtime = FakeRuntime(delay=0.0)
        self.service = assemble(
            lib, {"gguf": cast(Runtime, self.runtime)}, load_defaults=LoadOptions
        )
        self.loop = LoopThread("test-mcp").start()
        self.manager = McpManager(write_config(tmp / "mcp.json", {"local": stdio_entry()}))

    def script(self, pieces: list[str]) -> None:
        self.runtime.pieces = pieces
        for lm in self.runtime.models:
            lm.engine.pieces = list(pieces)


@pytest.fixture(scope="module")
def core(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Core]:
    c = Core(tmp_path_factory.mktemp("mcpchat"))
    try:
        yield c
    finally:
        try:
            c.loop.call(c.manager.stop(), timeout=60)
            c.loop.call(c.service.close(), timeout=60)
        finally:
            c.loop.stop()


@pytest.fixture
def page(qtbot: QtBot, core: Core) -> Iterator[ChatPage]:
    bridge = Bridge(core.loop, core.service.events)
    p = ChatPage(core.service, bridge, mcp=core.manager)
    qtbot.addWidget(p)
    qtbot.waitUntil(lambda: p.current_model_id() is not None and p.mcp.active(), timeout=SLOW)
    yield p
    p.clear()
    bridge.close()


def send(page: ChatPage, text: str = "What is 2 + 3?") -> None:
    page.prompt_edit.setPlainText(text)
    page._on_send_button_clicked()


def block_of(page: ChatPage, qtbot: QtBot) -> Any:
    qtbot.waitUntil(lambda: len(page.mcp.blocks) == 1, timeout=SLOW)
    return next(iter(page.mcp.blocks.values()))


def test_the_tools_menu_lists_servers_and_switches_tools(page: ChatPage) -> None:
    labels = [a.text() for a in page.mcp.menu.actions()]
    assert labels[0].startswith("local  (running · ") and "    add" in labels
    add = next(a for a in page.mcp.menu.actions() if a.text() == "    add")
    add.setChecked(False)
    assert "local__add" in page.mcp.chat_tools.tools_off and page.mcp.active()
    page.mcp.menu.actions()[0].setChecked(False)  # the whole server off
    assert not page.mcp.active()
    page.mcp.new_chat()  # a new chat: everything on again
    assert page.mcp.active() and page.mcp.button.text().startswith("Tools (")


def test_allow_once_shows_arguments_then_result_and_the_answer(
    page: ChatPage, core: Core, qtbot: QtBot
) -> None:
    core.script(CALL)
    send(page)
    block = block_of(page, qtbot)
    assert block.asking and json.loads(block.args_view.toPlainText()) == {"a": 2, "b": 3}
    assert block.toggle.text() == "Tool call: local · add"
    core.script(ANSWER)
    with qtbot.waitSignal(page.answer_finished, timeout=SLOW) as done:
        qtbot.mouseClick(block.allow_button, Qt.MouseButton.LeftButton)
    assert done.args[0] == "stop"
    assert block.result_view.toPlainText() == "5" and block.status_label.text() == "allowed once"
    assert not block.asking and not block.toggle.isChecked()  # folded once done
    block.toggle.setChecked(True)
    assert not block.body.isHidden()
    assert page.answer_text == "The sum is 5."
    roles = [m.role for m in page.history]
    assert roles == ["user", "assistant", "tool", "assistant"]
    assert page.history[2].content == "5"
    assert page.last_extras["tool_results"][0]["decision"] == "allowed"
    assert page.last_extras["tool_calls"][0]["server"] == "local"


def test_deny_in_the_block_tells_the_model(page: ChatPage, core: Core, qtbot: QtBot) -> None:
    core.script(CALL)
    send(page)
    block = block_of(page, qtbot)
    core.script(["Fine."])
    with qtbot.waitSignal(page.answer_finished, timeout=SLOW):
        qtbot.mouseClick(block.deny_button, Qt.MouseButton.LeftButton)
    assert block.status_label.text() == "denied"
    assert page.history[2].role == "tool" and page.history[2].content == DENIED_TEXT
    assert page.last_extras["tool_results"][0]["decision"] == "denied"


def test_stop_cancels_a_pending_approval(page: ChatPage, core: Core, qtbot: QtBot) -> None:
    core.script(CALL)
    send(page)
    block = block_of(page, qtbot)
    with qtbot.waitSignal(page.answer_finished, timeout=SLOW) as done:
        qtbot.mouseClick(page.stop_button, Qt.MouseButton.LeftButton)
    assert done.args[0] == "cancelled"
    assert block.status_label.text() == "stopped" and not block.asking
    assert not page.streaming and page.send_button.isEnabled()


def test_a_server_killed_mid_chat_is_shown_and_the_chat_goes_on(
    page: ChatPage, core: Core, qtbot: QtBot
) -> None:
    pid = int(core.loop.call(core.manager.call("local__pid", {}), timeout=60).content)
    os.kill(pid, signal.SIGKILL)
    core.script(CALL)
    send(page)
    block = block_of(page, qtbot)
    core.script(["Sorry, the tool failed."])
    with qtbot.waitSignal(page.answer_finished, timeout=SLOW) as done:
        qtbot.mouseClick(block.allow_button, Qt.MouseButton.LeftButton)
    assert done.args[0] == "stop" and page.answer_text == "Sorry, the tool failed."
    assert block.status_label.text() == "failed"
    qtbot.waitUntil(lambda: "error" in page.mcp.menu.actions()[0].text(), timeout=SLOW)
    assert "crashed" in page.mcp.menu.actions()[0].text()
    assert not page.mcp.active()  # its tools are no longer offered
    core.loop.call(core.manager.restart("local"), timeout=60)


def test_calls_sit_in_their_answer_are_saved_and_come_back_on_reopen(
    qtbot: QtBot, core: Core, tmp_path: Path
) -> None:
    from app.core.workspace.conversations import ConversationStore
    from app.gui.views.chat.transcript import MessageView

    store = ConversationStore(tmp_path / "conversations.sqlite")
    bridge = Bridge(core.loop, core.service.events)
    page = ChatPage(core.service, bridge, conversations=store, mcp=core.manager)
    qtbot.addWidget(page)
    qtbot.waitUntil(lambda: page.current_model_id() is not None and page.mcp.active(), timeout=SLOW)
    core.script(CALL)
    send(page)
    block = block_of(page, qtbot)
    answer_id = page.transcript.ids()[-1]
    assert block.parent() is page.transcript.message(answer_id)  # inline, in its answer
    core.script(ANSWER)
    with qtbot.waitSignal(page.answer_finished, timeout=SLOW):
        qtbot.mouseClick(block.allow_button, Qt.MouseButton.LeftButton)
    assert page.session is not None and page.session.conversation is not None
    conv_id = page.session.conversation.id
    saved = store.load(conv_id).path()
    assert [m.role for m in saved] == ["user", "assistant"]
    assert saved[1].extras["tool_calls"][0]["name"] == "local__add"
    assert saved[1].extras["tool_results"][0]["content"] == "5"
    page.clear()
    bridge.close()

    bridge = Bridge(core.loop, core.service.events)
    again = ChatPage(core.service, bridge, conversations=store, mcp=core.manager)
    qtbot.addWidget(again)
    assert again.session is not None
    again.session.open(conv_id)
    # the model is sent the exchange it saw: the call and its result before the answer
    assert [m.role for m in again.history] == ["user", "assistant", "tool", "assistant"]
    assert again.history[1].tool_calls[0].name == "local__add"
    assert again.history[2].content == "5" and again.history[3].content == "The sum is 5."
    view = again.transcript.message(again.history_ids[-1])
    assert isinstance(view, MessageView)
    shown = view.findChildren(type(block))
    assert len(shown) == 1 and shown[0].result_view.toPlainText() == "5"
    assert shown[0].status_label.text() == "allowed once" and not shown[0].asking
    # deleting the answer takes its tool exchange out of the history too
    again.delete_message(again.history_ids[-1])
    assert [m.role for m in again.history] == ["user"]
    again.clear()
    bridge.close()


def test_text_written_with_the_calls_is_sent_back_once(
    page: ChatPage, core: Core, qtbot: QtBot
) -> None:
    core.script(["Let me add them.", *CALL])
    send(page)
    block = block_of(page, qtbot)
    core.script(ANSWER)
    with qtbot.waitSignal(page.answer_finished, timeout=SLOW):
        qtbot.mouseClick(block.allow_button, Qt.MouseButton.LeftButton)
    assert page.answer_text.startswith("Let me add them.")  # shown as it streamed
    said = [m.content for m in page.history if m.role == "assistant"]
    assert "".join(said).count("Let me add them.") == 1, said
    assert page.history[-1].content.strip() == "The sum is 5."
