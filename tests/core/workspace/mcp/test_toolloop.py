"""The chat's tool loop through the real service and worker (a scripted engine writes the
model's hermes tool calls) and a real stdio MCP server: allow once, always (asked once), deny
(the model reads the denial), a timeout, the round cap, and Stop during a pending approval."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import pytest
import pytest_asyncio

from app.core.library.index import ModelLibrary
from app.core.service import Hearth, assemble
from app.core.types import ChatMessage, LoadOptions, SamplingParams
from app.core.workspace.mcp import McpManager
from app.core.workspace.mcp.toolloop import (
    DENIED_TEXT,
    Approval,
    CallResult,
    ChatTools,
    LoopState,
    PendingCall,
    run_tool_loop,
)
from tests.support.fakes import FakeRuntime
from tests.support.gguf_files import write_model
from tests.support.mcp_fixtures import stdio_entry, write_config

pytestmark = pytest.mark.asyncio(loop_scope="module")

TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if tools %}<tool_call>{{ tools | tojson }}</tool_call>{% endif %}<|im_start|>assistant\n"
)
ANSWER = ("The sum", " is 5.")


def call_block(name: str, args: dict[str, Any]) -> list[str]:
    return ["<tool_call>\n", json.dumps({"name": name, "arguments": args}), "\n</tool_call>"]


class Setup:
    def __init__(self, hearth: Hearth, runtime: FakeRuntime, manager: McpManager, model: str):
        self.hearth, self.runtime, self.manager, self.model = hearth, runtime, manager, model

    def script(self, pieces: list[str] | tuple[str, ...]) -> None:
        """What the model writes next (its engine reads the pieces at each step)."""
        self.runtime.pieces = pieces
        for lm in self.runtime.models:
            lm.engine.pieces = list(pieces)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def setup(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Setup]:
    tmp = tmp_path_factory.mktemp("loop")
    lib = ModelLibrary(tmp / "lib.json", tmp / "models")
    lib.import_path(write_model(tmp / "src" / "m.gguf", chat_template=TEMPLATE))
    (model,) = lib.list()
    runtime = FakeRuntime(delay=0.0)
    hearth = assemble(lib, {"gguf": runtime}, load_defaults=LoadOptions)
    manager = McpManager(write_config(tmp / "mcp.json", {"local": stdio_entry()}))
    await manager.start()
    try:
        yield Setup(hearth, runtime, manager, model.id)
    finally:
        await manager.stop()
        await hearth.close()


class UI:
    """Records what the transcript would show; answers approvals from ``answers``. After an
    approval it scripts the model's next round (``then``)."""

    def __init__(self, s: Setup, answers: list[Approval], then: list[str] | tuple[str, ...]):
        self.s, self.answers, self.then = s, list(answers), then
        self.texts: list[str] = []
        self.shown: list[tuple[PendingCall, bool]] = []
        self.done: list[CallResult] = []
        self.notices: list[str] = []
        self.asked = asyncio.Event()

    def text(self, text: str) -> None:
        self.texts.append(text)

    def reasoning(self, text: str) -> None:
        pass

    def call_shown(self, call: PendingCall, asking: bool) -> None:
        self.shown.append((call, asking))
        if not asking:
            self.s.script(self.then)

    def approve(self, call: PendingCall) -> Awaitable[Approval]:
        self.asked.set()
        fut: asyncio.Future[Approval] = asyncio.get_running_loop().create_future()
        if self.answers:
            fut.set_result(self.answers.pop(0))
            self.s.script(self.then)
        return fut  # no answer left: pending until cancelled

    def call_done(self, call: PendingCall, result: CallResult) -> None:
        self.done.append(result)

    def notice(self, text: str) -> None:
        self.notices.append(text)


async def ask(s: Setup, ui: UI, tools: ChatTools, state: LoopState | None = None, **kw: Any):
    state = state or LoopState()
    final = await run_tool_loop(
        s.hearth,
        s.manager,
        state,
        ui,
        tools,
        model_id=s.model,
        messages=[ChatMessage("user", "What is 2 + 3?")],
        sampling=SamplingParams(temperature=0.0),
        max_tokens=64,
        **kw,
    )
    return final, state


async def test_allow_once_runs_the_call_and_the_model_answers_from_it(setup: Setup) -> None:
    setup.script(call_block("local__add", {"a": 2, "b": 3}))
    ui = UI(setup, ["once"], ANSWER)
    final, state = await ask(setup, ui, ChatTools())
    assert final.finish_reason == "stop" and "".join(ui.texts) == "The sum is 5."
    ((call, asking),) = ui.shown
    assert asking and (call.server, call.tool) == ("local", "add")
    assert json.loads(call.arguments) == {"a": 2, "b": 3}
    assert ui.done == [CallResult(call.id, True, "5", "allowed")]
    said, result = state.messages
    assert said.role == "assistant" and said.tool_calls[0].name == "local__add"
    assert (result.role, result.content, result.tool_call_id) == ("tool", "5", call.id)
    # the second round's prompt carried the tool's result to the model
    (lm,) = setup.runtime.models
    prompt = "".join(chr(t - 10) for t in lm.submitted[-1].prompt_tokens if t >= 10)
    assert "<|im_start|>tool\n5<|im_end|>" in prompt
    assert state.extras() == {
        "tool_calls": [
            {"id": call.id, "name": "local__add", "server": "local", "arguments": call.arguments}
        ],
        "tool_results": [{"id": call.id, "ok": True, "content": "5", "decision": "allowed"}],
    }


async def test_always_asks_once_per_chat(setup: Setup) -> None:
    tools = ChatTools()
    setup.script(call_block("local__add", {"a": 2, "b": 3}))
    first = UI(setup, ["always"], ANSWER)
    await ask(setup, first, tools)
    assert tools.always == {"local__add"}
    setup.script(call_block("local__add", {"a": 1, "b": 1}))
    second = UI(setup, [], ANSWER)  # an approval asked here would hang the test
    final, state = await ask(setup, second, tools)
    assert final.finish_reason == "stop" and not second.asked.is_set()
    assert second.shown[0][1] is False
    assert state.tool_results[0]["decision"] == "always" and state.tool_results[0]["content"] == "2"


async def test_deny_sends_the_model_the_denial(setup: Setup) -> None:
    setup.script(call_block("local__add", {"a": 2, "b": 3}))
    ui = UI(setup, ["deny"], ("OK, I will not.",))
    final, state = await ask(setup, ui, ChatTools())
    assert final.finish_reason == "stop"
    assert ui.done[0].decision == "denied" and not ui.done[0].ok
    assert state.messages[-1].role == "tool" and state.messages[-1].content == DENIED_TEXT
    (lm,) = setup.runtime.models
    prompt = "".join(chr(t - 10) for t in lm.submitted[-1].prompt_tokens if t >= 10)
    assert DENIED_TEXT in prompt


async def test_a_slow_tool_times_out_and_the_chat_goes_on(setup: Setup) -> None:
    setup.manager.call_timeout_s = 0.3
    try:
        setup.script(call_block("local__slow", {"seconds": 2}))
        ui = UI(setup, ["once"], ANSWER)
        final, state = await ask(setup, ui, ChatTools())
    finally:
        setup.manager.call_timeout_s = 60.0
    assert final.finish_reason == "stop" and "".join(ui.texts) == "The sum is 5."
    assert ui.done[0].decision == "timeout" and "timed out" in ui.done[0].content


async def test_the_round_cap_ends_the_loop_with_a_notice(setup: Setup) -> None:
    block = call_block("local__add", {"a": 1, "b": 2})
    setup.script(block)
    ui = UI(setup, ["once", "once", "once"], block)  # the model never stops calling
    final, state = await ask(setup, ui, ChatTools(), max_rounds=2)
    assert state.rounds == 2 and len(ui.done) == 2
    assert final.finish_reason == "tool_calls"
    assert ui.notices and "2 tool rounds" in ui.notices[0]


async def test_switched_off_tools_are_not_offered(setup: Setup) -> None:
    setup.script(ANSWER)
    ui = UI(setup, [], ANSWER)
    await ask(setup, ui, ChatTools(tools_off={"local__add"}))
    (lm,) = setup.runtime.models
    prompt = "".join(chr(t - 10) for t in lm.submitted[-1].prompt_tokens if t >= 10)
    assert "local__echo" in prompt and "local__add" not in prompt
    await ask(setup, ui, ChatTools(servers_off={"local"}))
    prompt = "".join(chr(t - 10) for t in lm.submitted[-1].prompt_tokens if t >= 10)
    assert "<tool_call>" not in prompt  # no tools at all


async def test_stop_cancels_a_pending_approval(setup: Setup) -> None:
    setup.script(call_block("local__add", {"a": 2, "b": 3}))
    ui = UI(setup, [], ANSWER)  # never answered
    state = LoopState()
    task = asyncio.ensure_future(ask(setup, ui, ChatTools(), state))
    await asyncio.wait_for(ui.asked.wait(), 60)
    state.cancel()
    final, _ = await asyncio.wait_for(task, 60)
    assert final.finish_reason == "cancelled" and ui.done == []


async def test_stop_cancels_a_running_call(setup: Setup) -> None:
    setup.script(call_block("local__slow", {"seconds": 5}))
    state = LoopState()

    class StopOnApproval(UI):
        def approve(self, call: PendingCall) -> Awaitable[Approval]:
            fut = super().approve(call)
            asyncio.get_running_loop().call_soon(state.cancel)  # Stop, as the call starts
            return fut

    ui = StopOnApproval(setup, ["once"], ANSWER)
    final, _ = await asyncio.wait_for(ask(setup, ui, ChatTools(), state), 60)
    assert final.finish_reason == "cancelled"
    assert ui.done == []  # the call never finished: no result was recorded or sent
