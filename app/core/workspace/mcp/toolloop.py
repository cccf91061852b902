"""The Chat page's tool loop: stream an answer with the chat's enabled MCP tools; when it ends
with tool calls, ask for each call's approval (allow once, always for this tool in this chat,
deny), run the allowed ones, send the results back as tool messages and let the model answer
again, at most ``max_rounds`` times. Pure core (no Qt): the page supplies a ``LoopUI``."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar

from app.core.inference.generation import Generation
from app.core.requests import ChatRequest, ToolChoice
from app.core.service import Hearth
from app.core.types import ChatMessage, Delta, SamplingParams, ToolCall
from app.core.workspace.mcp.manager import CallOutcome, McpManager, McpTool

log = logging.getLogger(__name__)
T = TypeVar("T")

Approval = Literal["once", "always", "deny"]
Decision = Literal["allowed", "always", "denied", "timeout", "error"]
DEFAULT_MAX_ROUNDS = 8
AUTO = ToolChoice()
DENIED_TEXT = "The user denied this tool call. Do not call it again for this request."


@dataclass(frozen=True, slots=True)
class PendingCall:
    """A call the model made, as the transcript shows it."""

    id: str
    name: str  # as the model called it: server__tool
    server: str
    tool: str
    arguments: str  # JSON text, as the model wrote it

    def record(self) -> dict[str, Any]:
        """Its entry in the assistant message's ``extras["tool_calls"]``."""
        return {
            "id": self.id,
            "name": self.name,
            "server": self.server,
            "arguments": self.arguments,
        }


@dataclass(frozen=True, slots=True)
class CallResult:
    id: str
    ok: bool
    content: str
    decision: Decision

    def record(self) -> dict[str, Any]:
        """Its entry in ``extras["tool_results"]``."""
        return {"id": self.id, "ok": self.ok, "content": self.content, "decision": self.decision}


class LoopUI(Protocol):
    """What the page does for the loop (every method is called on the loop thread)."""

    def text(self, text: str) -> None: ...

    def reasoning(self, text: str) -> None: ...

    def call_shown(self, call: PendingCall, asking: bool) -> None: ...

    def approve(self, call: PendingCall) -> Awaitable[Approval]: ...

    def call_done(self, call: PendingCall, result: CallResult) -> None: ...

    def notice(self, text: str) -> None: ...


@dataclass
class ChatTools:
    """One chat's tool switches: servers and tools on by default; ``always``: tools the user
    allowed for the rest of this chat."""

    servers_off: set[str] = field(default_factory=set)
    tools_off: set[str] = field(default_factory=set)
    always: set[str] = field(default_factory=set)

    def enabled(self, tools: Sequence[McpTool]) -> list[McpTool]:
        return [
            t for t in tools if t.server not in self.servers_off and t.name not in self.tools_off
        ]


@dataclass
class LoopState:
    """One answer's loop. ``cancel`` (on the loop thread) stops the generation, a pending
    approval and a running call alike. Collects what the answer adds to the conversation."""

    cancelled: bool = False
    generation: Generation | None = None
    messages: list[ChatMessage] = field(default_factory=list)  # assistant calls + tool results
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    tool_results: list[dict[str, Any]] = field(default_factory=list)
    rounds: int = 0
    _waiting: set[asyncio.Future[Any]] = field(default_factory=set)

    def cancel(self) -> None:
        self.cancelled = True
        if self.generation is not None:
            self.generation.cancel()
        for f in list(self._waiting):
            f.cancel()

    def extras(self) -> dict[str, Any]:
        """The assistant message's extras (empty when no tool was called)."""
        if not self.tool_calls:
            return {}
        return {"tool_calls": list(self.tool_calls), "tool_results": list(self.tool_results)}

    async def wait(self, aw: Awaitable[T]) -> T:
        """Await ``aw`` so that ``cancel`` ends it (raises CancelledError then)."""
        fut = asyncio.ensure_future(aw)
        if self.cancelled:  # stopped between two awaits: do not start what it would wait on
            fut.cancel()
        self._waiting.add(fut)
        try:
            return await fut
        finally:
            self._waiting.discard(fut)


async def run_tool_loop(
    service: Hearth,
    manager: McpManager,
    state: LoopState,
    ui: LoopUI,
    chat_tools: ChatTools,
    *,
    model_id: str,
    messages: Sequence[ChatMessage],
    sampling: SamplingParams,
    max_tokens: int | None,
    max_rounds: int = DEFAULT_MAX_ROUNDS,
    first_choice: ToolChoice = AUTO,
) -> Delta:
    """Answer ``messages`` with the chat's enabled tools; returns the last round's final delta
    ("cancelled" when stopped). ``first_choice`` applies to the first round (later rounds:
    auto, so the model can answer)."""
    if not service.routing.is_routable(model_id):
        await service.models.load(model_id)
    convo = list(messages)
    choice = first_choice
    while True:
        if state.cancelled:
            return Delta(finish_reason="cancelled")
        tools = tuple(t.as_tool() for t in chat_tools.enabled(manager.tools()))
        final, text, calls = await _one_round(
            service, state, ui, model_id, convo, sampling, max_tokens, tools, choice
        )
        choice = ToolChoice()
        if not calls or final.finish_reason != "tool_calls":
            return final
        if state.rounds >= max_rounds:
            ui.notice(
                f"Stopped after {max_rounds} tool rounds (mcp.max_rounds): the model kept "
                "calling tools."
            )
            return final
        state.rounds += 1
        said = ChatMessage("assistant", text, tool_calls=tuple(calls))
        convo.append(said)
        state.messages.append(said)
        for call in calls:
            result = await _run_call(manager, state, ui, chat_tools, call)
            if result is None:
                return Delta(finish_reason="cancelled")
            answer = ChatMessage("tool", result.content, name=call.name, tool_call_id=call.id)
            convo.append(answer)
            state.messages.append(answer)


async def _one_round(
    service: Hearth,
    state: LoopState,
    ui: LoopUI,
    model_id: str,
    convo: list[ChatMessage],
    sampling: SamplingParams,
    max_tokens: int | None,
    tools: tuple[Any, ...],
    choice: ToolChoice,
) -> tuple[Delta, str, list[ToolCall]]:
    req = ChatRequest(
        model_id,
        tuple(convo),
        sampling=sampling,
        max_tokens=max_tokens,
        tools=tools,
        tool_choice=choice if tools else ToolChoice(),
    )
    gen = (await service.chat(req)).first
    state.generation = gen
    if state.cancelled:
        gen.cancel()
    final: Delta | None = None
    parts: list[str] = []
    building: dict[int, list[str]] = {}  # index -> [id, name, arguments]
    try:
        async for d in gen:
            if d.reasoning:
                ui.reasoning(d.reasoning)
            if d.text:
                parts.append(d.text)
                ui.text(d.text)
            for tc in d.tool_calls:
                slot = building.setdefault(tc.index, ["", "", ""])
                slot[0] = tc.id or slot[0]
                slot[1] = tc.name or slot[1]
                slot[2] += tc.arguments
            if d.finish_reason is not None:
                final = d
    finally:
        gen.cancel()
        state.generation = None
    if final is None:
        final = Delta(finish_reason="cancelled" if state.cancelled else "error")
    calls = [
        ToolCall(cid or f"call_{state.rounds}_{i}", name, args or "{}")
        for i, (cid, name, args) in sorted(building.items())
    ]
    return final, "".join(parts), calls


async def _run_call(
    manager: McpManager,
    state: LoopState,
    ui: LoopUI,
    chat_tools: ChatTools,
    call: ToolCall,
) -> CallResult | None:
    """Ask, run and record one call; None when the answer was stopped meanwhile."""
    mt = manager.find(call.name)
    pending = PendingCall(
        call.id, call.name, mt.server if mt else "", mt.tool if mt else call.name, call.arguments
    )
    state.tool_calls.append(pending.record())
    asking = call.name not in chat_tools.always
    ui.call_shown(pending, asking)
    try:
        approval: Approval = await state.wait(ui.approve(pending)) if asking else "always"
    except asyncio.CancelledError:
        if state.cancelled:
            return None
        raise
    if approval == "deny":
        result = CallResult(call.id, False, DENIED_TEXT, "denied")
    else:
        if approval == "always":
            chat_tools.always.add(call.name)
        try:
            args = json.loads(call.arguments or "{}")
        except ValueError:
            args = None
        if not isinstance(args, dict):
            outcome = CallOutcome("error", "Error: the arguments are not a JSON object.")
        else:
            try:
                outcome = await state.wait(manager.call(call.name, args))
            except asyncio.CancelledError:
                if state.cancelled:
                    return None
                raise
        decision: Decision = (
            "timeout"
            if outcome.status == "timeout"
            else "error"
            if outcome.status == "error"
            else ("always" if approval == "always" or not asking else "allowed")
        )
        result = CallResult(call.id, outcome.ok, outcome.content, decision)
    state.tool_results.append(result.record())
    ui.call_done(pending, result)
    return result


def messages_from_extras(extras: dict[str, Any]) -> list[ChatMessage]:
    """A saved answer's tool exchange (its ``tool_calls`` / ``tool_results`` extras) as the
    messages that go before its text, so a reopened conversation sends the model what it saw:
    one assistant turn with every call, then each call's result."""
    calls = [c for c in extras.get("tool_calls") or () if isinstance(c, dict) and c.get("id")]
    if not calls:
        return []
    results = {r.get("id"): r for r in extras.get("tool_results") or () if isinstance(r, dict)}
    out = [
        ChatMessage(
            "assistant",
            "",
            tool_calls=tuple(
                ToolCall(str(c["id"]), str(c.get("name", "")), str(c.get("arguments", "{}")))
                for c in calls
            ),
        )
    ]
    for c in calls:
        r = results.get(c["id"])
        content = str(r.get("content", "")) if r is not None else "The call did not finish."
        out.append(
            ChatMessage("tool", content, name=str(c.get("name", "")), tool_call_id=str(c["id"]))
        )
    return out
