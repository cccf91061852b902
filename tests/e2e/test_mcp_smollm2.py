"""The tool loop with a real model: SmolLM2 under tool_choice "required" (a grammar-forced call)
calls a tool of a real stdio MCP server, the call runs once allowed, its result goes back as a
tool message, and the loop ends (answer, or the round cap's notice).

Opt-in (HEARTH_MCP_SMOLLM2=1): it takes 30-60 s on a 2-core machine (the forced call's grammar
compiles for ~13 s), past this part's CI share; the approval paths are covered in
tests/core/workspace/mcp/test_toolloop.py with a scripted model."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable
from pathlib import Path

import pytest

from app.core.library.index import ModelLibrary
from app.core.requests import ToolChoice
from app.core.service import assemble
from app.core.types import ChatMessage, LoadOptions, SamplingParams
from app.core.workspace.mcp import McpManager
from app.core.workspace.mcp.toolloop import (
    Approval,
    CallResult,
    ChatTools,
    LoopState,
    PendingCall,
    run_tool_loop,
)
from app.runtimes.llama.runtime import LlamaCppRuntime
from tests.support import probes
from tests.support.mcp_fixtures import stdio_entry, write_config


class AllowAll:
    def __init__(self) -> None:
        self.shown: list[PendingCall] = []
        self.done: list[CallResult] = []
        self.notices: list[str] = []
        self.texts: list[str] = []

    def text(self, text: str) -> None:
        self.texts.append(text)

    def reasoning(self, text: str) -> None:
        pass

    def call_shown(self, call: PendingCall, asking: bool) -> None:
        self.shown.append(call)

    def approve(self, call: PendingCall) -> Awaitable[Approval]:
        fut: asyncio.Future[Approval] = asyncio.get_running_loop().create_future()
        fut.set_result("once")
        return fut

    def call_done(self, call: PendingCall, result: CallResult) -> None:
        self.done.append(result)

    def notice(self, text: str) -> None:
        self.notices.append(text)


@pytest.mark.model
@pytest.mark.skipif(not os.environ.get("HEARTH_MCP_SMOLLM2"), reason="opt-in: HEARTH_MCP_SMOLLM2=1")
async def test_smollm2_calls_a_real_mcp_tool_under_required(
    smollm2_path: Path, tmp_path: Path
) -> None:
    lib = ModelLibrary(tmp_path / "lib.json", tmp_path / "models")
    lib.import_path(smollm2_path)
    (model,) = lib.list()
    runtime = LlamaCppRuntime(probe_file=probes.shared())
    hearth = assemble(
        lib, {"gguf": runtime}, load_defaults=lambda: LoadOptions(context_length=2048, parallel=1)
    )
    manager = McpManager(write_config(tmp_path / "mcp.json", {"calc": stdio_entry()}))
    await manager.start()
    ui = AllowAll()
    state = LoopState()
    tools = ChatTools(tools_off={"calc__slow", "calc__fail", "calc__pid", "calc__echo"})
    try:
        final = await run_tool_loop(
            hearth,
            manager,
            state,
            ui,
            tools,
            model_id=model.id,
            messages=[ChatMessage("user", "Add 2 and 3 with the tool.")],
            sampling=SamplingParams(temperature=0.0),
            max_tokens=40,
            max_rounds=1,
            first_choice=ToolChoice("required", parallel=False),
        )
    finally:
        await manager.stop()
        await hearth.close()
    assert ui.shown, (final, "".join(ui.texts))
    assert ui.shown[0].name == "calc__add"  # the only tool on: the grammar's pick
    args = json.loads(ui.shown[0].arguments)
    assert set(args) <= {"a", "b"}
    first = ui.done[0]
    assert first.decision in ("allowed", "error")  # the server validated what the model wrote
    if first.ok:
        assert first.content == str(args["a"] + args["b"])
    said, result = state.messages[:2]
    assert (
        said.tool_calls and result.role == "tool" and result.tool_call_id == said.tool_calls[0].id
    )
    assert final.finish_reason in ("stop", "length", "tool_calls")
    if final.finish_reason == "tool_calls":
        assert ui.notices and "1 tool rounds" in ui.notices[0]
