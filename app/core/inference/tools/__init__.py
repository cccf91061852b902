"""Tool calling: the tool spec and its family (spec), a grammar constraint that forces a valid
call (spec), a streaming parser per family (parser), the family formats (formats) and the
incremental JSON scanner under them (scanner), and how a request's tools reach the model
(plan)."""

from __future__ import annotations

from app.core.inference.tools.calls import ParseEvent, StartedCall
from app.core.inference.tools.parser import ToolCallParser
from app.core.inference.tools.plan import ToolSetup
from app.core.inference.tools.spec import (
    FAMILIES,
    GENERIC_TOOL_PROMPT,
    Tool,
    detect_family,
    generic_tool_prompt,
    template_handles_tools,
    tool_call_constraint,
)
from app.core.inference.tools.whole import parse_block

__all__ = [
    "FAMILIES",
    "GENERIC_TOOL_PROMPT",
    "ParseEvent",
    "StartedCall",
    "Tool",
    "ToolCallParser",
    "ToolSetup",
    "detect_family",
    "generic_tool_prompt",
    "parse_block",
    "template_handles_tools",
    "tool_call_constraint",
]
