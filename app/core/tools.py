"""Tool calling: which format a model writes calls in, a generic prompt for models whose template
ignores tools, a grammar that forces a valid call, and a streaming parser per family.

Families (detected from the chat template, overridable per model):
- ``hermes``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Hermes, Qwen 2/2.5/3,
  and Hearth's generic prompt for templates without tools)
- ``llama3``: a bare JSON object ``{"name": ..., "parameters": {...}}`` or ``<|python_tag|>...``
- ``mistral``: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}]``
- ``qwen3coder``: ``<tool_call><function=NAME><parameter=K>V</parameter></function></tool_call>``
- ``harmony`` (gpt-oss): ``<|channel|>commentary to=functions.NAME ... <|message|>{...}<|call|>``
- ``deepseek``: ``<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{...}\\n```<｜tool▁call▁end｜>``
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

FAMILIES = ("hermes", "llama3", "mistral", "qwen3coder", "harmony", "deepseek")

GENERIC_TOOL_PROMPT = (
    "You can call functions. The available functions, as JSON schemas:\n{tools}\n\n"
    "To call a function, answer with one block per call, exactly:\n"
    '<tool_call>\n{{"name": "<function name>", "arguments": {{<arguments as JSON>}}}}\n</tool_call>\n'
    "Call a function only when it helps; otherwise answer normally."
)


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]

    def as_openai(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


def detect_family(template: str | None) -> str:
    """The tool-call format a chat template teaches its model (hermes when unsure)."""
    t = template or ""
    if "<function=" in t and "<parameter=" in t:
        return "qwen3coder"
    if "<tool_call>" in t:
        return "hermes"
    if "[TOOL_CALLS]" in t:
        return "mistral"
    if "<|python_tag|>" in t or ("ipython" in t and "<|eot_id|>" in t):
        return "llama3"
    if "<|channel|>" in t or "<|call|>" in t:
        return "harmony"
    if "tool▁call▁begin" in t or "tool▁calls▁begin" in t:
        return "deepseek"
    return "hermes"


def template_handles_tools(template: str | None) -> bool:
    return bool(template) and "tools" in (template or "")


def generic_tool_prompt(tools: list[Tool]) -> str:
    return GENERIC_TOOL_PROMPT.format(tools="\n".join(json.dumps(t.as_openai()) for t in tools))


def tool_call_constraint(tools: list[Tool], *, parallel: bool) -> tuple[str, str]:
    """A constraint that forces hermes-style calls: the call object's JSON schema (one
    alternative per tool, arguments by that tool's own schema) for the runtime to compile."""
    alternatives = []
    for t in tools:
        params = t.parameters or {}
        if not params.get("properties") and params.get("type", "object") == "object":
            params = {"type": "object", "properties": {}, "additionalProperties": False}
        alternatives.append(
            {
                "type": "object",
                "properties": {"name": {"const": t.name}, "arguments": params},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    schema = alternatives[0] if len(alternatives) == 1 else {"oneOf": alternatives}
    return ("tool_call", json.dumps({"schema": schema, "parallel": parallel}))


@dataclass
class ToolCall:
    index: int
    id: str
    name: str
    arguments: str = ""


@dataclass
class ParseEvent:
    """What the parser found in a piece of streamed text."""

    text: str = ""
    started: list[ToolCall] = field(default_factory=list)  # new calls: id/name, no arguments yet
    arguments: list[tuple[int, str]] = field(default_factory=list)  # (index, fragment)


def _new_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


# (start marker, end marker) of one call block, per family
_BLOCKS = {
    "hermes": ("<tool_call>", "</tool_call>"),
    "qwen3coder": ("<tool_call>", "</tool_call>"),
    "mistral": ("[TOOL_CALLS]", None),
    "llama3": ("<|python_tag|>", None),
    "harmony": ("<|channel|>commentary to=functions.", "<|call|>"),
    "deepseek": ("<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>"),
}


class ToolCallParser:
    """Streams text through and turns the family's call blocks into tool-call deltas.

    Text that may be the start of a call marker is held back; a call's arguments are emitted when
    its block closes (or at the end of the stream for formats without a closing marker). A
    malformed block is passed through as text rather than dropped.
    """

    def __init__(self, family: str) -> None:
        self.family = family if family in FAMILIES else "hermes"
        self.start, self.end = _BLOCKS[self.family]
        self._buf = ""
        self._in_block = False
        self.calls: list[ToolCall] = []
        self._answer_started = False

    def feed(self, text: str) -> ParseEvent:
        ev = ParseEvent()
        self._buf += text
        while self._buf:
            if not self._in_block:
                i = self._buf.find(self.start)
                if i == -1 and self.family == "llama3" and not self._answer_started:
                    j = len(self._buf) - len(self._buf.lstrip())
                    if (
                        self._buf[j : j + 1] == "{"
                    ):  # Llama 3.x also answers calls as a bare JSON object
                        self._buf = self._buf[j:]
                        self._in_block = True
                        continue
                if i == -1:
                    hold = _partial(self._buf, self.start)
                    out = self._buf[: len(self._buf) - hold]
                    if self.family == "llama3" and not self._answer_started and not out.strip():
                        return ev  # wait: a bare JSON call may follow the whitespace
                    ev.text += out
                    self._answer_started = self._answer_started or bool(out.strip())
                    self._buf = self._buf[len(self._buf) - hold :]
                    return ev
                ev.text += self._buf[:i]
                self._answer_started = self._answer_started or bool(self._buf[:i].strip())
                self._buf = self._buf[i + len(self.start) :]
                self._in_block = True
                continue
            if self.end is None:
                return ev  # runs to the end of the stream
            j = self._buf.find(self.end)
            if j == -1:
                return ev
            block, self._buf = self._buf[:j], self._buf[j + len(self.end) :]
            self._in_block = False
            self._emit(block, ev)
        return ev

    def flush(self) -> ParseEvent:
        ev = ParseEvent()
        if self._in_block:
            block, self._buf = self._buf, ""
            self._in_block = False
            self._emit(block, ev)
        else:
            ev.text, self._buf = self._buf, ""
        return ev

    def _emit(self, block: str, ev: ParseEvent) -> None:
        try:
            parsed = parse_block(self.family, block)
        except (ValueError, KeyError, TypeError):
            parsed = None
        if not parsed:
            ev.text += self.start + block + (self.end or "")
            return
        for name, args in parsed:
            call = ToolCall(len(self.calls), _new_id(), name, args)
            self.calls.append(call)
            ev.started.append(ToolCall(call.index, call.id, call.name))
            ev.arguments.append((call.index, args))


def _partial(buf: str, marker: str) -> int:
    for k in range(min(len(marker) - 1, len(buf)), 0, -1):
        if buf.endswith(marker[:k]):
            return k
    return 0


def _args(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)


def _json_calls(obj: Any) -> list[tuple[str, str]]:
    items = obj if isinstance(obj, list) else [obj]
    out = []
    for it in items:
        if not isinstance(it, dict) or not isinstance(it.get("name"), str):
            raise ValueError("not a call")
        args = it.get("arguments", it.get("parameters", {}))
        out.append((it["name"], _args(args)))
    return out


def parse_block(family: str, block: str) -> list[tuple[str, str]]:
    """(name, arguments JSON) for each call in one block of ``family``'s format."""
    b = block.strip()
    if family in ("hermes", "mistral", "llama3"):
        if family == "llama3" and not b.startswith(("{", "[")):
            # <|python_tag|>name.call(key="value") is the built-in tool form; keep JSON only
            m = re.fullmatch(r"([\w.]+)\((.*)\)", b, re.S)
            if not m:
                raise ValueError("unrecognized llama3 call")
            kwargs = dict(re.findall(r'(\w+)\s*=\s*"([^"]*)"', m.group(2)))
            return [(m.group(1), json.dumps(kwargs))]
        dec = json.JSONDecoder()
        calls: list[tuple[str, str]] = []
        pos = 0
        while pos < len(b):  # several objects may follow each other (llama3 parallel calls)
            obj, end = dec.raw_decode(b, pos)
            calls.extend(_json_calls(obj))
            pos = end
            while pos < len(b) and b[pos] in " \n\t;,":
                pos += 1
        return calls
    if family == "qwen3coder":
        m = re.search(r"<function=([^>\s]+)>(.*?)</function>", b, re.S)
        if not m:
            raise ValueError("no function")
        params = {}
        for k, v in re.findall(r"<parameter=([^>\s]+)>(.*?)</parameter>", m.group(2), re.S):
            v = v.strip("\n")
            try:
                params[k] = json.loads(v)
            except ValueError:
                params[k] = v
        return [(m.group(1), json.dumps(params, ensure_ascii=False))]
    if family == "harmony":
        m = re.match(r"([\w.-]+)\s*(?:<\|constrain\|>\s*json)?\s*<\|message\|>(.*)", b, re.S)
        if not m:
            raise ValueError("no harmony call")
        return [(m.group(1), _args(json.loads(m.group(2))))]
    if family == "deepseek":
        m = re.match(r"(?:function)?<｜tool▁sep｜>([^\n]+)\n```(?:json)?\n(.*?)\n```", b, re.S)
        if not m:
            raise ValueError("no deepseek call")
        return [(m.group(1).strip(), _args(json.loads(m.group(2))))]
    raise ValueError(f"unknown family {family}")
