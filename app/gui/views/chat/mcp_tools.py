"""MCP tools on the Chat page: the per-chat tools menu (servers and tools on/off), a
collapsible block per tool call (its arguments, Allow once / Always for this tool / Deny, then
its result), and the glue that runs the core tool loop (app.core.workspace.mcp.toolloop) on the loop
thread. The page adds it through a marked hook; the blocks go wherever ``place`` puts them."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QAction
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QMenu,
    QPlainTextEdit,
    QPushButton,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.core.service import Hearth
from app.core.types import ChatMessage, Delta, SamplingParams
from app.core.workspace.mcp import McpManager, McpTool
from app.core.workspace.mcp.toolloop import (
    Approval,
    CallResult,
    ChatTools,
    LoopState,
    PendingCall,
    run_tool_loop,
)
from app.errors import HearthError

log = logging.getLogger(__name__)

DECISION_TEXT = {
    "allowed": "allowed once",
    "always": "allowed (always for this tool in this chat)",
    "denied": "denied",
    "timeout": "timed out",
    "error": "failed",
}


class ToolCallBlock(QWidget):
    """One call in the transcript: a header that folds the block, the arguments, the approval
    buttons while it waits, then the result."""

    decided = Signal(str)  # once | always | deny

    def __init__(self, call: PendingCall, asking: bool, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.call = call
        where = f"{call.server} · {call.tool}" if call.server else call.tool
        self.toggle = QToolButton()
        self.toggle.setCheckable(True)
        self.toggle.setChecked(True)
        self.toggle.setText(f"Tool call: {where}")
        self.toggle.setToolTip("Show or hide the arguments and the result")
        self.status_label = QLabel("waiting for your approval" if asking else "running…")
        self.args_view = QPlainTextEdit(_pretty(call.arguments))
        self.args_view.setReadOnly(True)
        self.args_view.setMaximumHeight(120)
        self.result_view = QPlainTextEdit()
        self.result_view.setReadOnly(True)
        self.result_view.setMaximumHeight(160)
        self.result_view.setVisible(False)
        self.allow_button = QPushButton("Allow once")
        self.always_button = QPushButton("Always for this tool")
        self.always_button.setToolTip("Allow this tool without asking for the rest of this chat")
        self.deny_button = QPushButton("Deny")
        buttons = QHBoxLayout()
        for b in (self.allow_button, self.always_button, self.deny_button):
            buttons.addWidget(b)
            b.setVisible(asking)
        buttons.addStretch(1)
        self.body = QWidget()
        body = QVBoxLayout(self.body)
        body.setContentsMargins(16, 0, 0, 0)
        body.addWidget(QLabel("Arguments"))
        body.addWidget(self.args_view)
        body.addLayout(buttons)
        body.addWidget(self.result_view)
        head = QHBoxLayout()
        head.addWidget(self.toggle)
        head.addWidget(self.status_label, 1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 4, 0, 4)
        layout.addLayout(head)
        layout.addWidget(self.body)
        self.toggle.toggled.connect(self._on_toggle_toggled)
        self.allow_button.clicked.connect(partial(self._decide, "once"))
        self.always_button.clicked.connect(partial(self._decide, "always"))
        self.deny_button.clicked.connect(partial(self._decide, "deny"))

    @property
    def asking(self) -> bool:
        return not self.allow_button.isHidden()

    def set_result(self, result: CallResult) -> None:
        self._hide_buttons()
        self.status_label.setText(DECISION_TEXT.get(result.decision, result.decision))
        self.result_view.setPlainText(result.content)
        self.result_view.setVisible(True)
        self.toggle.setChecked(False)  # folded once done: the answer reads on

    def set_stopped(self) -> None:
        if self.result_view.isHidden():
            self._hide_buttons()
            self.status_label.setText("stopped")

    def _decide(self, choice: str) -> None:
        self._hide_buttons()
        self.status_label.setText("running…" if choice != "deny" else "denied")
        self.decided.emit(choice)

    def _hide_buttons(self) -> None:
        for b in (self.allow_button, self.always_button, self.deny_button):
            b.setVisible(False)

    def _on_toggle_toggled(self, on: bool) -> None:
        self.body.setVisible(on)


class McpTurn:
    """An answer with tools (quacks like the page's AnswerTurn: ``cancelled``, ``generation``,
    ``cancel`` on the loop thread)."""

    def __init__(self) -> None:
        self.state = LoopState()

    @property
    def cancelled(self) -> bool:
        return self.state.cancelled

    @property
    def generation(self) -> Any:
        return self.state.generation

    @generation.setter
    def generation(self, value: Any) -> None:
        self.state.generation = value

    def cancel(self) -> None:
        self.state.cancel()


class McpChat(QObject):
    """The page's MCP part. ``place(widget)`` puts a call block into the transcript."""

    statuses_changed = Signal()
    # loop thread -> GUI thread (queued)
    _call_shown = Signal(object, object, bool)  # turn, PendingCall, asking
    _call_done = Signal(object, object, object)  # turn, PendingCall, CallResult
    _notice = Signal(object, str)
    _status_event = Signal()

    def __init__(
        self,
        service: Hearth,
        bridge: Any,
        manager: McpManager | None,
        notice: Callable[[str], None],
        place: Callable[[QWidget], None] | None = None,
        parent: QObject | None = None,
    ) -> None:
        """``place``: puts a call block into the transcript; without it blocks go into
        ``panel`` (a column under a transcript that cannot hold widgets)."""
        super().__init__(parent)
        self._service = service
        self._bridge = bridge
        self.manager = manager
        self.panel = QWidget()
        self._panel_layout = QVBoxLayout(self.panel)
        self._panel_layout.setContentsMargins(0, 0, 0, 0)
        self.panel.setVisible(False)
        self._place = place or self._add_to_panel
        self._show_notice = notice
        self.chat_tools = ChatTools()
        self.tools: list[McpTool] = []  # the running servers' tools, as last listed
        self.servers: list[Any] = []  # ServerStatus, as last listed
        self.blocks: dict[str, ToolCallBlock] = {}
        self._turn: McpTurn | None = None
        self._pending: dict[str, asyncio.Future[Approval]] = {}  # loop thread only
        self.button = QToolButton()
        self.button.setText("Tools")
        self.button.setToolTip("MCP tools for this chat (servers come from mcp.json: Settings)")
        self.button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.menu = QMenu(self.button)
        self.button.setMenu(self.menu)
        self._call_shown.connect(self._on_self_call_shown)
        self._call_done.connect(self._on_self_call_done)
        self._notice.connect(self._on_self_notice)
        self._status_event.connect(self.refresh)
        self._rebuild_menu()
        if manager is not None:
            manager.on_change = self._status_event.emit  # loop thread: only emits
            if manager.config_path.exists():  # off the GUI thread; the chat never waits
                bridge.run(manager.ensure_started(), on_done=lambda _: self.refresh())

    # -- state -------------------------------------------------------------------------------
    def active(self) -> bool:
        """The next answer carries tools (some enabled tool of a running server)."""
        return self.manager is not None and bool(self.chat_tools.enabled(self.tools))

    def refresh(self) -> None:
        if self.manager is None:
            return
        m = self.manager
        self._bridge.call(lambda: (m.statuses(), m.tools()), on_done=self._on_listed)

    def new_chat(self) -> None:
        """A fresh chat: switches back on, "always" forgotten, blocks gone."""
        self.chat_tools = ChatTools()
        for b in self.blocks.values():
            b.setParent(None)
            b.deleteLater()
        self.blocks.clear()
        self.panel.setVisible(False)
        self._rebuild_menu()

    def saved_blocks(self, extras: dict[str, Any]) -> list[ToolCallBlock]:
        """A reopened answer's calls, folded, each with the result it had (read-only)."""
        results = {r.get("id"): r for r in extras.get("tool_results") or () if isinstance(r, dict)}
        out = []
        for c in extras.get("tool_calls") or ():
            if not isinstance(c, dict) or not c.get("id"):
                continue
            name, server = str(c.get("name", "")), str(c.get("server", ""))
            tool = name[len(server) + 2 :] if server and name.startswith(server + "__") else name
            call = PendingCall(str(c["id"]), name, server, tool, str(c.get("arguments", "{}")))
            block = ToolCallBlock(call, asking=False)
            r = results.get(c["id"])
            if r is None:
                block.set_stopped()
            else:
                decision = r.get("decision", "error")
                block.set_result(
                    CallResult(call.id, bool(r.get("ok")), str(r.get("content", "")), decision)
                )
            out.append(block)
        return out

    def _add_to_panel(self, block: QWidget) -> None:
        self._panel_layout.addWidget(block)
        self.panel.setVisible(True)

    def set_server_enabled(self, server: str, on: bool) -> None:
        (self.chat_tools.servers_off.discard if on else self.chat_tools.servers_off.add)(server)
        self._rebuild_menu()

    def set_tool_enabled(self, name: str, on: bool) -> None:
        (self.chat_tools.tools_off.discard if on else self.chat_tools.tools_off.add)(name)
        self._rebuild_menu()

    # -- an answer ---------------------------------------------------------------------------
    def new_turn(self) -> McpTurn:
        self._turn = McpTurn()
        return self._turn

    async def answer(
        self,
        turn: McpTurn,
        emit: Callable[[str], None],
        model_id: str,
        messages: Sequence[ChatMessage],
        sampling: SamplingParams,
        max_tokens: int | None,
        emit_reasoning: Callable[[str], None] | None = None,
        prepare: Callable[[Sequence[ChatMessage]], Awaitable[Sequence[ChatMessage]]] | None = None,
    ) -> Delta:
        """The tool loop (loop thread) in place of the page's plain stream_answer; ``prepare``
        puts attached files into the messages once the model is loaded."""
        if self.manager is None:
            raise HearthError("no MCP servers are configured")
        if prepare is not None:
            if not self._service.routing.is_routable(model_id):
                await self._service.models.load(model_id)
            messages = await prepare(messages)
        ui = _LoopUI(self, turn, emit, emit_reasoning)
        return await run_tool_loop(
            self._service,
            self.manager,
            turn.state,
            ui,
            self.chat_tools,
            model_id=model_id,
            messages=messages,
            sampling=sampling,
            max_tokens=max_tokens,
            max_rounds=int(self.manager.limit("max_rounds")),
        )

    def finished(self, turn: Any) -> tuple[list[ChatMessage], dict[str, Any]]:
        """After an answer: the messages it adds before the final text (assistant calls and tool
        results, for the history) and the extras for the saved assistant message."""
        if not isinstance(turn, McpTurn):
            return [], {}
        for b in self.blocks.values():
            b.set_stopped()
        return list(turn.state.messages), turn.state.extras()

    # -- loop thread -------------------------------------------------------------------------
    def _approval(self, call: PendingCall) -> asyncio.Future[Approval]:
        fut: asyncio.Future[Approval] = asyncio.get_running_loop().create_future()
        self._pending[call.id] = fut
        fut.add_done_callback(lambda _: self._pending.pop(call.id, None))
        return fut

    def _resolve(self, call_id: str, choice: Approval) -> None:
        fut = self._pending.get(call_id)
        if fut is not None and not fut.done():
            fut.set_result(choice)

    # -- GUI thread --------------------------------------------------------------------------
    def decide(self, call_id: str, choice: str) -> None:
        """What the block's buttons do (tests click them)."""
        self._bridge.call(self._resolve, call_id, choice)

    def _on_self_call_shown(self, turn: McpTurn, call: PendingCall, asking: bool) -> None:
        if turn is not self._turn:
            return
        block = ToolCallBlock(call, asking)
        block.decided.connect(partial(self.decide, call.id))
        self.blocks[call.id] = block
        self._place(block)

    def _on_self_call_done(self, turn: McpTurn, call: PendingCall, result: CallResult) -> None:
        block = self.blocks.get(call.id)
        if turn is self._turn and block is not None:
            block.set_result(result)

    def _on_self_notice(self, turn: McpTurn, text: str) -> None:
        if turn is self._turn:
            self._show_notice(text)

    def _on_listed(self, listed: tuple[list[Any], list[McpTool]]) -> None:
        self.servers, self.tools = listed
        self._rebuild_menu()
        self.statuses_changed.emit()

    def _rebuild_menu(self) -> None:
        self.menu.clear()
        if not self.servers:
            a = self.menu.addAction("No MCP servers: add them in Settings › MCP servers")
            a.setEnabled(False)
        for st in self.servers:
            head = QAction(f"{st.name}  ({st.summary})", self.menu)
            head.setCheckable(True)
            head.setChecked(st.name not in self.chat_tools.servers_off)
            head.setEnabled(st.state == "running")
            head.toggled.connect(partial(self.set_server_enabled, st.name))
            self.menu.addAction(head)
            server_on = st.name not in self.chat_tools.servers_off
            for t in st.tools:
                act = QAction(f"    {t.tool}", self.menu)
                act.setToolTip(t.description)
                act.setCheckable(True)
                act.setChecked(t.name not in self.chat_tools.tools_off)
                act.setEnabled(server_on and st.state == "running")
                act.toggled.connect(partial(self.set_tool_enabled, t.name))
                self.menu.addAction(act)
        n = len(self.chat_tools.enabled(self.tools))
        self.button.setText(f"Tools ({n})" if n else "Tools")


class _LoopUI:
    """The core loop's LoopUI for one answer: runs on the loop thread, only emits signals."""

    def __init__(
        self,
        owner: McpChat,
        turn: McpTurn,
        emit: Callable[[str], None],
        emit_reasoning: Callable[[str], None] | None,
    ) -> None:
        self._owner, self._turn = owner, turn
        self._emit, self._emit_reasoning = emit, emit_reasoning

    def text(self, text: str) -> None:
        self._emit(text)

    def reasoning(self, text: str) -> None:
        if self._emit_reasoning is not None:
            self._emit_reasoning(text)

    def call_shown(self, call: PendingCall, asking: bool) -> None:
        self._owner._call_shown.emit(self._turn, call, asking)

    def approve(self, call: PendingCall) -> asyncio.Future[Approval]:
        return self._owner._approval(call)

    def call_done(self, call: PendingCall, result: CallResult) -> None:
        self._owner._call_done.emit(self._turn, call, result)

    def notice(self, text: str) -> None:
        self._owner._notice.emit(self._turn, text)


def _pretty(arguments: str) -> str:
    try:
        return json.dumps(json.loads(arguments), indent=2, ensure_ascii=False)
    except ValueError:
        return arguments
