"""A call of a tool the request did not offer (under ``auto`` the model invents a name) comes
back from the service as the text it is, with the reason ``unknown_tool``; a call of an offered
tool in the same output is still a call."""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

from app.core.library.index import ModelLibrary
from app.core.service import assemble
from app.core.types import ChatMessage, LoadOptions, Runtime, Tool
from tests.support.fakes import FakeRuntime
from tests.support.gguf_files import write_model
from tests.support.service_calls import chat

KNOWN = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
INVENTED = '<tool_call>\n{"name": "launch_rockets", "arguments": {"count": 3}}\n</tool_call>'
WEATHER = Tool("get_weather", "Weather for a city", {"type": "object"})


async def test_an_invented_tool_is_text_with_the_reason(tmp_path: Path) -> None:
    runtime = FakeRuntime(delay=0.0, pieces=list(KNOWN + INVENTED))
    lib = ModelLibrary(tmp_path / "library.json", tmp_path / "models")
    h = assemble(lib, {"gguf": cast(Runtime, runtime)}, load_defaults=LoadOptions)
    try:
        model, _ = h.models.import_path(write_model(tmp_path / "Tiny-Q8_0.gguf"))
        ask = [ChatMessage("user", "Weather in Paris?")]
        got = await (await chat(h, model.id, ask, tools=[WEATHER], tool_choice="auto")).collect()
    finally:
        await h.close()
    assert [(c.name, json.loads(c.arguments)) for c in got.tool_calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    assert got.final.tool_parse is not None and got.final.tool_parse.reason == "unknown_tool"
    # nothing of the invented call vanishes; the model is stopped once it is whole
    assert got.text == INVENTED[: INVENTED.rindex("}") + 1]
    assert got.final.finish_reason == "tool_calls"
