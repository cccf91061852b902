"""The OpenAI wire, as Hearth speaks it to an engine: the internal requests encoded as
request bodies, and streamed chunks decoded into deltas. Pure: no I/O.
Tested by tests/runtimes/remote/test_codec.py."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from app.core.inference import images
from app.core.requests import ChatRequest, CompletionRequest
from app.core.types import (
    ChatMessage,
    Constraint,
    Delta,
    FinishReason,
    SamplingParams,
    TokenLogprob,
    ToolCallDelta,
    Usage,
)
from app.core.util import jsonsafe
from app.errors import UnsupportedParameter

# kinds whose servers take llama.cpp/vLLM sampling fields beyond OpenAI's (a cloud API refuses
# unknown fields, so plain "openai" gets only OpenAI's own)
_EXTRA_SAMPLING = ("vllm", "sglang", "llama.cpp", "hearth", "tgi", "ollama")
_FINISH: dict[str, FinishReason] = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "eos": "stop",
    "eos_token": "stop",
}


def decode(text: str | bytes) -> Any:
    """One JSON document from an engine.

    Raises:
        ValueError: not JSON, or nested deeper than the parser's recursion limit (a hostile
            line of 200,000 ``[`` raises RecursionError inside ``json.loads``).
    """
    try:
        return jsonsafe.fast_loads(text)
    except RecursionError as e:
        raise ValueError("JSON nested too deep") from e


def message(m: ChatMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.images:  # OpenAI content parts, each image a PNG data URL where its marker was
        out["content"] = [
            {"type": "text", "text": v}
            if isinstance(v, str)
            else {"type": "image_url", "image_url": {"url": images.png_data_url(v)}}
            for v in images.split_content(m.content, m.images)
        ]
    if m.name:
        out["name"] = m.name
    if m.tool_calls:
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for c in m.tool_calls
        ]
        if not m.content:
            out["content"] = None
    if m.tool_call_id:
        out["tool_call_id"] = m.tool_call_id
    return out


def sampling(kind: str, s: SamplingParams) -> dict[str, Any]:
    out: dict[str, Any] = {"temperature": s.temperature, "top_p": s.top_p}
    if s.seed is not None:
        out["seed"] = s.seed
    if s.presence_penalty:
        out["presence_penalty"] = s.presence_penalty
    if s.frequency_penalty:
        out["frequency_penalty"] = s.frequency_penalty
    if s.logit_bias:
        out["logit_bias"] = {str(t): b for t, b in s.logit_bias}
    if kind in _EXTRA_SAMPLING:
        if s.top_k:
            out["top_k"] = s.top_k
        if s.min_p:
            out["min_p"] = s.min_p
        if s.repeat_penalty != 1.0:
            # vLLM and SGLang call it repetition_penalty; llama.cpp and Hearth repeat_penalty
            name = "repetition_penalty" if kind in ("vllm", "sglang", "tgi") else "repeat_penalty"
            out[name] = s.repeat_penalty
    return out


def response_format(c: Constraint | None) -> dict[str, Any] | None:
    if c is None:
        return None
    if c.kind == "json_object":
        return {"type": "json_object"}
    if c.kind == "json_schema":
        schema = json.loads(c.value) if c.value else {}
        return {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}
    return None  # "tool_call" is the local planner's; a remote engine gets tool_choice


def json_object_dialect(fmt: Any) -> dict[str, Any]:
    """OpenAI's ``{"type": "json_schema", "json_schema": {"schema"}}`` as llama.cpp's and
    llama-cpp-python's servers also take it: ``{"type": "json_object", "schema"}``."""
    inner = fmt.get("json_schema") if isinstance(fmt, dict) else None
    schema = inner.get("schema") if isinstance(inner, dict) else None
    return {"type": "json_object", "schema": schema if isinstance(schema, dict) else {}}


def chat_body(kind: str, remote_id: str, req: ChatRequest) -> dict[str, Any]:
    refuse_scoring(req)
    s = req.sampling
    body: dict[str, Any] = {
        "model": remote_id,
        "messages": [message(m) for m in req.messages],
        "stream": True,
        "stream_options": {"include_usage": True},  # usage even where the client asked none
        **sampling(kind, s),
    }
    if req.max_tokens is not None:
        body["max_tokens"] = req.max_tokens
    if req.stop:
        body["stop"] = list(req.stop)
    if req.tools:
        body["tools"] = [t.as_openai() for t in req.tools]
        tc = req.tool_choice
        body["tool_choice"] = (
            {"type": "function", "function": {"name": tc.name}} if tc.mode == "named" else tc.mode
        )
        if not tc.parallel:
            body["parallel_tool_calls"] = False
    fmt = response_format(req.constraint)
    if fmt is not None:
        body["response_format"] = fmt
    if req.logprobs is not None:
        body["logprobs"] = True
        body["top_logprobs"] = req.logprobs
    if req.template_vars and kind in ("vllm", "sglang", "llama.cpp", "hearth"):
        body["chat_template_kwargs"] = dict(req.template_vars)
    return body


def refuse_scoring(req: ChatRequest | CompletionRequest) -> None:
    """A remote model streams its answers here: a prompt's log-probabilities (which vLLM
    does not stream) cannot come back through it, so asking for them is a 400, never a drop."""
    param = "echo" if isinstance(req, CompletionRequest) and req.echo else None
    if param is None and req.prompt_logprobs is not None:
        param = "prompt_logprobs"
    if param is not None:
        raise UnsupportedParameter(
            f"'{param}' is not available on a remote model (its answers are streamed, and "
            "prompt log-probabilities are not); ask a local GGUF model",
            param=param,
        )


def completion_body(
    kind: str, remote_id: str, req: CompletionRequest, prompt: str | tuple[int, ...]
) -> dict[str, Any]:
    refuse_scoring(req)
    s = req.sampling
    infill = req.infill
    if infill is not None:
        if infill.extra:
            raise UnsupportedParameter(
                "other files' context is not passed on to a remote model (its OpenAI API takes "
                "only a suffix); leave 'input_extra' out or ask a local model",
                param="input_extra",
            )
        if isinstance(prompt, str):
            prompt += infill.cursor  # llama-server's prompt: the cursor line, after the prefix
    body: dict[str, Any] = {
        "model": remote_id,
        "prompt": prompt if isinstance(prompt, str) else list(prompt),
        "stream": True,
        "stream_options": {"include_usage": True},
        **sampling(kind, s),
    }
    if infill is not None:
        # OpenAI's insert mode; an engine that cannot fill in the middle refuses it itself
        body["suffix"] = infill.suffix
    if req.max_tokens is not None:
        body["max_tokens"] = req.max_tokens
    if req.stop:
        body["stop"] = list(req.stop)
    if req.logprobs is not None:
        body["logprobs"] = req.logprobs
    fmt = response_format(req.constraint)
    if fmt is not None:
        body["response_format"] = fmt
    return body


def anthropic_count_body(remote_id: str, req: ChatRequest) -> dict[str, Any]:
    """``req`` as an Anthropic count_tokens body (what another Hearth counts through its own
    template and tools): system text apart, tool calls and results as content blocks."""
    system = "\n\n".join(m.content for m in req.messages if m.role == "system")
    msgs: list[dict[str, Any]] = []
    for m in req.messages:
        if m.role == "system":
            continue
        if m.role == "tool":
            block = {
                "type": "tool_result",
                "tool_use_id": m.tool_call_id or "",
                "content": m.content,
            }
            msgs.append({"role": "user", "content": [block]})
            continue
        blocks: list[dict[str, Any]] = [{"type": "text", "text": m.content}] if m.content else []
        for c in m.tool_calls:
            try:
                args = json.loads(c.arguments or "{}")
            except ValueError:
                args = {}
            blocks.append({"type": "tool_use", "id": c.id, "name": c.name, "input": args})
        msgs.append({"role": "assistant" if m.role == "assistant" else "user", "content": blocks})
    body: dict[str, Any] = {"model": remote_id, "messages": msgs}
    if system:
        body["system"] = system
    if req.tools:
        body["tools"] = [
            {"name": t.name, "description": t.description, "input_schema": t.parameters}
            for t in req.tools
        ]
    return body


@dataclass(slots=True)
class ChunkReader:
    """Folds an engine's stream chunks into deltas. The finish reason is held until the stream
    ends, so the final delta carries the usage chunk that follows it (``include_usage``)."""

    chat: bool = True
    finish: FinishReason | None = None
    usage: Usage | None = None
    pieces: int = 0  # content chunks: the completion tokens when the engine sends no usage
    started: bool = False  # a chunk with content, a tool call or a finish reason came
    _tool_ids: dict[int, str] = field(default_factory=dict)

    def feed(self, chunk: Any) -> Delta | None:
        """One decoded ``data:`` object -> a delta to pass on (None: nothing to pass yet)."""
        if not isinstance(chunk, dict):
            return None
        u = chunk.get("usage")
        if isinstance(u, dict):
            self.usage = _usage(u)
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return None
        c = choices[0]
        reason = c.get("finish_reason")
        if isinstance(reason, str) and reason:
            self.finish = _FINISH.get(reason, "stop")
            self.started = True
        calls: tuple[ToolCallDelta, ...] = ()
        lps: tuple[TokenLogprob, ...] = ()
        if self.chat:
            d = _dict(c.get("delta"))
            text = _str(d.get("content"))
            think = _str(d.get("reasoning_content")) or _str(d.get("reasoning"))
            calls = tuple(self._tool_calls(d.get("tool_calls")))
            lps = tuple(_chat_logprobs(c.get("logprobs")))
        else:
            text, think = _str(c.get("text")), ""
        if not (text or think or calls or lps):
            return None
        self.started = True
        self.pieces += 1
        return Delta(text=text, reasoning=think, tool_calls=calls, logprobs=lps, token_count=1)

    def _tool_calls(self, raw: Any) -> Iterable[ToolCallDelta]:
        if not isinstance(raw, list):
            return
        for i, tc in enumerate(raw):
            if not isinstance(tc, dict):
                continue
            raw_index = tc.get("index")
            index = raw_index if isinstance(raw_index, int) else i
            fn = _dict(tc.get("function"))
            args = _str(fn.get("arguments"))
            if isinstance(fn.get("arguments"), dict):  # some engines send an object
                args = json.dumps(fn["arguments"])
            if index not in self._tool_ids:
                self._tool_ids[index] = str(tc.get("id") or f"call_{index}")
                name = _str(fn.get("name"))
                yield ToolCallDelta(index, self._tool_ids[index], name, args)
            elif args:
                yield ToolCallDelta(index, arguments=args)

    def final(self, prompt_tokens: int) -> Delta:
        """The last delta, once the stream ended well (``[DONE]`` or a finish reason)."""
        usage = self.usage or Usage(prompt_tokens, self.pieces)
        reason: FinishReason = self.finish or "stop"
        if self._tool_ids and reason == "stop":
            reason = "tool_calls"
        return Delta(finish_reason=reason, usage=usage)


def _str(v: Any) -> str:
    return v if isinstance(v, str) else ""


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _usage(u: dict[str, Any]) -> Usage:
    def num(v: Any) -> int:
        return v if isinstance(v, int) and v >= 0 else 0

    details = u.get("prompt_tokens_details")
    cached = num(details.get("cached_tokens")) if isinstance(details, dict) else 0
    out_details = u.get("completion_tokens_details")
    think = num(out_details.get("reasoning_tokens")) if isinstance(out_details, dict) else 0
    return Usage(num(u.get("prompt_tokens")), num(u.get("completion_tokens")), cached, think)


def _chat_logprobs(raw: Any) -> Iterable[TokenLogprob]:
    content = raw.get("content") if isinstance(raw, dict) else None
    if not isinstance(content, list):
        return
    for item in content:
        if not isinstance(item, dict) or not isinstance(item.get("token"), str):
            continue
        tops = item.get("top_logprobs")
        top = tuple(
            (t["token"], _float(t.get("logprob")), _bytes(t.get("bytes")))
            for t in (tops if isinstance(tops, list) else ())
            if isinstance(t, dict) and isinstance(t.get("token"), str)
        )
        yield TokenLogprob(
            item["token"], _float(item.get("logprob")), _bytes(item.get("bytes")), top
        )


def _float(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0.0


def _bytes(v: Any) -> tuple[int, ...]:
    if isinstance(v, list) and all(isinstance(b, int) and 0 <= b < 256 for b in v):
        return tuple(v)
    return ()


def score(r: dict[str, Any]) -> float:
    """A rerank result's score (``relevance_score``, or ``score``)."""
    v = r.get("relevance_score", r.get("score"))
    return float(v) if isinstance(v, (int, float)) else 0.0


def prompt_tokens(out: Any) -> int:
    """A whole answer's prompt tokens (0 when it says none)."""
    u = out.get("usage") if isinstance(out, dict) else None
    v = u.get("prompt_tokens", u.get("total_tokens")) if isinstance(u, dict) else None
    return v if isinstance(v, int) else 0


def status_in(ev: Any) -> int:
    """The HTTP status an error event names (500 when none)."""
    err = ev.get("error") if isinstance(ev, dict) else None
    code = err.get("code") if isinstance(err, dict) else None
    return code if isinstance(code, int) and 400 <= code < 600 else 500
