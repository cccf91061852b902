"""Ollama-shaped routes (/api/tags, /api/show, /api/chat, /api/generate, /api/embed, /api/ps,
/api/version) on the same port, for apps that only speak Ollama. NDJSON streams; errors are
``{"error": "..."}``. Hearth's own API lives under /api/v1/.

``format``, ``tools`` and ``think`` map onto the core the OpenAI routes use:

- ``format``: ``"json"`` is OpenAI's ``json_object``; a JSON schema object is ``json_schema``
  (enforced by grammar; a schema that cannot compile is a 400).
- ``tools`` (/api/chat only): the same tool plumbing as ``tool_choice: "auto"`` (Ollama has no
  tool_choice). A call comes back whole, as Ollama sends it: ``{"id", "function": {"index",
  "name", "arguments": {object}}}``, in the stream as soon as its block is parsed. History may
  carry assistant ``tool_calls`` with object arguments and ``tool`` messages with ``tool_name``.
- ``think``: reasoning (``<think>`` blocks) goes to ``message.thinking`` (/api/chat) or
  ``thinking`` (/api/generate). When ``think`` is absent it is separated too: Ollama defaults
  ``think`` to true for models that can think, and a model that cannot writes no reasoning.
  ``"low"``/``"medium"``/``"high"`` (gpt-oss levels) count as true. ``think`` is also given to
  the chat template (``enable_thinking``, and ``reasoning_effort`` for a level), so Qwen3-style
  templates switch thinking off for ``think: false``; reasoning that a model writes anyway
  stays in ``content`` inside ``<think>…</think>``, as Ollama shows it, rather than being
  dropped. A ``raw`` /api/generate is never parsed for reasoning; ``format`` applies to it too.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from app import __version__
from app.core import jsonsafe
from app.core.generation import Generation
from app.core.reasoning import CLOSE_TAG, OPEN_TAG, is_harmony_template
from app.core.scheduler import UNSET, parse_keep_alive
from app.core.service import Hearth, ModelStatus
from app.core.tools import Tool
from app.core.types import ChatMessage, Delta, SamplingParams
from app.errors import InvalidRequest, ModelNotFound, UnsupportedParameter
from app.server.body import large_json_response, read_json_body
from app.server.protocols.common import Body, parse_messages, parse_tool_list, schema_constraint
from app.server.state import REQUEST_LOG, SERVICE
from app.server.streaming import StreamBroken, final_error, note_generation, timed

log = logging.getLogger(__name__)

routes = web.RouteTableDef()

OLLAMA_VERSION = "0.12.0"  # the API level these shapes follow


def _now_iso(ts: float | None = None) -> str:
    return (
        datetime.fromtimestamp(ts if ts is not None else time.time(), UTC)
        .isoformat()
        .replace("+00:00", "Z")
    )


def resolve_id(service: Hearth, name: str) -> str:
    """Ollama names carry a tag ("llama3:latest"); Hearth ids may not."""
    try:
        service.library.get(name)
        return name
    except ModelNotFound:
        if name.endswith(":latest"):
            service.library.get(name[: -len(":latest")])
            return name[: -len(":latest")]
        raise


def _details(st: ModelStatus) -> dict[str, Any]:
    m = st.model
    return {
        "parent_model": "",
        "format": m.format,
        "family": m.architecture or "",
        "families": [m.architecture] if m.architecture else [],
        "parameter_size": _param_size(m.parameters),
        "quantization_level": m.quantization or "",
    }


def _param_size(n: int | None) -> str:
    if not n:
        return ""
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.1f}{suffix}"
    return str(n)


def _digest(st: ModelStatus) -> str:
    import hashlib

    return hashlib.sha256(
        f"{st.model.path}|{st.model.size_bytes}|{st.model.mtime}".encode()
    ).hexdigest()


def _tag(model_id: str) -> str:
    return model_id if ":" in model_id else f"{model_id}:latest"


def _sampling(opts: dict[str, Any]) -> tuple[SamplingParams, int | None, tuple[str, ...]]:
    """Ollama ``options`` with Ollama's defaults (temperature 0.8, top_k 40, top_p 0.9, ...)."""
    if not isinstance(opts, dict):
        raise InvalidRequest("'options' must be an object", param="options")
    b = Body(opts)
    sampling = SamplingParams(
        temperature=b.number("temperature", 0.8, lo=0.0, hi=2.0),
        top_p=b.number("top_p", 0.9, lo=0.0, hi=1.0),
        top_k=b.integer("top_k", 40, lo=0, hi=1_000_000) or 0,
        min_p=b.number("min_p", 0.0, lo=0.0, hi=1.0),
        repeat_penalty=b.number("repeat_penalty", 1.1, lo=0.01, hi=10.0),
        presence_penalty=b.number("presence_penalty", 0.0, lo=-2.0, hi=2.0),
        frequency_penalty=b.number("frequency_penalty", 0.0, lo=-2.0, hi=2.0),
        seed=b.integer("seed", None, lo=-(1 << 63), hi=(1 << 64) - 1),
    )
    n = b.integer("num_predict", None, lo=-2, hi=1 << 20)
    max_tokens = None if n is None or n < 0 else n
    if n == 0:
        raise InvalidRequest("'num_predict' must not be 0", param="options.num_predict")
    stop = opts.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise InvalidRequest("'stop' must be a list of strings", param="options.stop")
    return sampling, max_tokens, tuple(s for s in stop if s)


THINK_LEVELS = ("low", "medium", "high")


def _format(b: Body) -> tuple[str, str] | None:
    """``format``: "json" (any JSON) or a JSON schema object, as a generation constraint."""
    fmt = b.data.get("format")
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return ("json_object", "")
    if isinstance(fmt, dict):
        return schema_constraint(fmt, param="format")
    raise InvalidRequest("'format' must be \"json\" or a JSON schema object", param="format")


def _think(b: Body) -> bool:
    """``think``: absent or true separates the reasoning; see the module docstring."""
    v = b.data.get("think")
    if v is None or v is True or v in THINK_LEVELS:
        return True
    if v is False:
        return False
    raise InvalidRequest('\'think\' must be true, false, "low", "medium" or "high"', param="think")


def _think_vars(b: Body) -> dict[str, Any] | None:
    """What ``think`` tells the chat template: ``enable_thinking`` (Qwen3-style templates) or,
    for a level, ``reasoning_effort`` (gpt-oss templates)."""
    v = b.data.get("think")
    if isinstance(v, bool):
        return {"enable_thinking": v}
    if v in THINK_LEVELS:
        return {"enable_thinking": True, "reasoning_effort": v}
    return None


def _openai_messages(raw: Any) -> Any:
    """Ollama history in OpenAI's shape for ``parse_messages``: assistant ``tool_calls`` with
    object arguments get ids and JSON-string arguments; a ``tool`` message (``tool_name``, and
    ``tool_call_id`` in newer clients) answers the earliest unanswered call of that name."""
    if not isinstance(raw, list):
        return raw
    out: list[Any] = []
    pending: list[tuple[str, str]] = []  # (call id, function name), not answered yet
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            out.append(m)
            continue
        if m.get("images"):
            raise UnsupportedParameter(
                "images need a vision model; none is available", param=f"messages[{i}].images"
            )
        m = {k: v for k, v in m.items() if k not in ("thinking", "tool_name", "images")}
        calls = m.get("tool_calls")
        if isinstance(calls, list):
            converted = []
            for j, c in enumerate(calls):
                fn = c.get("function") if isinstance(c, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    raise InvalidRequest(
                        "a tool call needs a function with a name",
                        param=f"messages[{i}].tool_calls[{j}]",
                    )
                args = fn.get("arguments")
                cid = c.get("id") if isinstance(c.get("id"), str) else f"call_{i}_{j}"
                converted.append(
                    {
                        "id": cid,
                        "type": "function",
                        "function": {
                            "name": fn["name"],
                            "arguments": args if isinstance(args, str) else json.dumps(args or {}),
                        },
                    }
                )
                pending.append((cid, fn["name"]))
            m["tool_calls"] = converted
        if m.get("role") == "tool":
            raw_name = raw[i].get("tool_name") or raw[i].get("name")
            name = raw_name if isinstance(raw_name, str) else None
            cid = m.get("tool_call_id")
            if not isinstance(cid, str):
                match = next((p for p in pending if name is None or p[1] == name), None)
                cid = match[0] if match else f"call_{i}"
            pending = [p for p in pending if p[0] != cid]
            m["tool_call_id"] = cid
            if name is not None:
                m["name"] = name
        out.append(m)
    return out


def _reject(b: Body) -> None:
    if b.data.get("images"):
        raise UnsupportedParameter("images need a vision model; none is available", param="images")
    if b.data.get("suffix"):
        raise UnsupportedParameter("'suffix' (fill-in-the-middle) is not supported", param="suffix")
    if b.data.get("context"):
        raise UnsupportedParameter(
            "'context' (deprecated token context) is not supported", param="context"
        )


def _keep_alive(b: Body) -> Any:
    v = b.data.get("keep_alive")
    return UNSET if v is None else parse_keep_alive(v)


class _Shaper:
    """Core deltas -> Ollama's pieces: content, thinking, and tool calls once whole."""

    def __init__(self, think: bool) -> None:
        self.think = think
        self._open = False  # think false: inside a <think> block put back into content
        self._calls: dict[int, list[str]] = {}  # index -> [id, name, arguments so far]
        self._sent: set[int] = set()

    def feed(self, d: Delta) -> tuple[str, str, list[dict[str, Any]]]:
        content, thinking = d.text, d.reasoning
        if not self.think and (thinking or (self._open and content)):
            joined = ""
            if thinking:
                joined = ("" if self._open else OPEN_TAG) + thinking
                self._open = True
            if content:
                joined += CLOSE_TAG + "\n\n" + content
                self._open = False
            content, thinking = joined, ""
        for tc in d.tool_calls:
            if tc.id is not None:
                self._calls[tc.index] = [tc.id, tc.name or "", tc.arguments]
            elif tc.index in self._calls:
                self._calls[tc.index][2] += tc.arguments
        return content, thinking, self._ready(final=d.finish_reason is not None)

    def _ready(self, *, final: bool) -> list[dict[str, Any]]:
        """Calls whose arguments are whole: a JSON object, or ended by a later call or the end."""
        out = []
        last = max(self._calls, default=-1)
        for i in sorted(self._calls):
            if i in self._sent:
                continue
            cid, name, raw = self._calls[i]
            try:
                args = jsonsafe.loads(raw) if raw.strip() else None
            except ValueError:
                args = None
            if not isinstance(args, dict):
                if not final and i == last:
                    break  # arguments still streaming in
                if raw.strip():
                    log.warning("tool call %s: arguments are not a JSON object: %.200r", name, raw)
                args = {}
            self._sent.add(i)
            out.append({"id": cid, "function": {"index": i, "name": name, "arguments": args}})
        return out


def _final_fields(final: Delta, started: float, load_ns: int) -> dict[str, Any]:
    t = final.timings
    u = final.usage
    return {
        "done_reason": final.finish_reason if final.finish_reason in ("stop", "length") else "stop",
        "total_duration": int((time.perf_counter() - started) * 1e9),
        "load_duration": load_ns,
        "prompt_eval_count": u.prompt_tokens if u else 0,
        "prompt_eval_duration": int(t.prompt_ms * 1e6) if t else 0,
        "eval_count": u.completion_tokens if u else 0,
        "eval_duration": int(t.predicted_ms * 1e6) if t else 0,
    }


async def _load_or_unload(
    service: Hearth, model_id: str, keep_alive: Any, key: str
) -> web.Response:
    """An empty prompt/messages loads the model; with keep_alive 0 it unloads it (Ollama)."""
    if keep_alive == 0:
        await service.unload(model_id)
        reason = "unload"
    else:
        await service.load(model_id, ttl=keep_alive)
        reason = "load"
    body: dict[str, Any] = {
        "model": model_id,
        "created_at": _now_iso(),
        "done": True,
        "done_reason": reason,
    }
    body[key] = {"role": "assistant", "content": ""} if key == "message" else ""
    return web.json_response(body)


def _piece(
    key: str, content: str, thinking: str = "", calls: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The output fields of one line: ``message`` (/api/chat) or ``response`` (/api/generate)."""
    if key == "message":
        msg: dict[str, Any] = {"role": "assistant", "content": content}
        if thinking:
            msg["thinking"] = thinking
        if calls:
            msg["tool_calls"] = calls
        return {"message": msg}
    return {"response": content, **({"thinking": thinking} if thinking else {})}


async def _respond(
    request: web.Request,
    gen: Generation,
    model_id: str,
    stream: bool,
    key: str,
    started: float,
    load_ns: int,
    think: bool = True,
) -> web.StreamResponse:
    shaper = _Shaper(think)
    try:
        if not stream:
            texts: list[str] = []
            thoughts: list[str] = []
            calls: list[dict[str, Any]] = []
            final: Delta | None = None
            async for d in timed(request, gen):
                text, thought, ready = shaper.feed(d)
                texts.append(text)
                thoughts.append(thought)
                calls.extend(ready)
                if d.finish_reason:
                    final = d
            failed = final_error(request, final)
            if failed is not None or final is None:
                raise failed or StreamBroken("the generation ended without a result")
            note_generation(request, model_id, final)
            return web.json_response(
                {
                    "model": model_id,
                    "created_at": _now_iso(),
                    **_piece(key, "".join(texts), "".join(thoughts), calls),
                    "done": True,
                    **_final_fields(final, started, load_ns),
                }
            )
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await resp.prepare(request)

        async def line(obj: dict[str, Any]) -> None:
            await resp.write(json.dumps(obj, separators=(",", ":")).encode() + b"\n")

        last: Delta | None = None
        async for d in timed(request, gen):
            text, thought, ready = shaper.feed(d)
            if text or thought or ready:
                await line(
                    {
                        "model": model_id,
                        "created_at": _now_iso(),
                        **_piece(key, text, thought, ready),
                        "done": False,
                    }
                )
            if d.finish_reason:
                last = d
        failed = final_error(request, last)
        if failed is not None or last is None:
            await line({"error": (failed or StreamBroken("the generation was stopped")).message})
        else:
            note_generation(request, model_id, last)
            await line(
                {
                    "model": model_id,
                    "created_at": _now_iso(),
                    **_piece(key, ""),
                    "done": True,
                    **_final_fields(last, started, load_ns),
                }
            )
        await resp.write_eof()
        return resp
    finally:
        gen.cancel()


async def _jit(service: Hearth, model_id: str) -> int:
    """Load ahead of the generation to report load_duration (ns) as Ollama does."""
    if service.scheduler.state(model_id) == "loaded":
        return 0
    t0 = time.perf_counter()
    await service.scheduler.get(model_id, load=True)
    return int((time.perf_counter() - t0) * 1e9)


@routes.get("/api/version")
async def version(request: web.Request) -> web.Response:
    return web.json_response({"version": OLLAMA_VERSION, "hearth": __version__})


@routes.get("/api/tags")
async def tags(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    out = []
    for st in service.models():
        out.append(
            {
                "name": _tag(st.model.id),
                "model": _tag(st.model.id),
                "modified_at": _now_iso(st.model.mtime or st.model.added_at),
                "size": st.model.size_bytes,
                "digest": _digest(st),
                "details": _details(st),
            }
        )
    return web.json_response({"models": out})


@routes.post("/api/show")
async def show(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    b = Body(await read_json_body(request))
    name = b.text("model") or b.text("name") or ""
    if not name:
        raise InvalidRequest("'model' is required", param="model")
    st = service.model_status(resolve_id(service, name))
    m = st.model
    arch = m.architecture or "unknown"
    info: dict[str, Any] = {"general.architecture": arch, "general.parameter_count": m.parameters}
    if m.context_length:
        info[f"{arch}.context_length"] = m.context_length
    caps = ["embedding"] if m.extra.get("embedding") else ["completion", "tools"]
    thinks = OPEN_TAG in (m.chat_template or "") or is_harmony_template(m.chat_template)
    if thinks and "embedding" not in caps:
        caps.append("thinking")  # <think> blocks or harmony channels, which are separated
    return web.json_response(
        {
            "modelfile": f"FROM {m.path}\n",
            "parameters": "",
            "template": m.chat_template or "",
            "details": _details(st),
            "model_info": info,
            "capabilities": caps,
            "modified_at": _now_iso(m.mtime or m.added_at),
        }
    )


@routes.get("/api/ps")
async def ps(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    by_id = {s.model.id: s for s in service.models()}
    out = []
    for i in service.scheduler.loaded():
        st = by_id.get(i.model_id)
        if st is None:
            continue
        out.append(
            {
                "name": _tag(i.model_id),
                "model": _tag(i.model_id),
                "size": i.memory_bytes,
                "digest": _digest(st),
                "details": _details(st),
                # Ollama shows a far-future time for "never"
                "expires_at": _now_iso(i.expires_at) if i.expires_at else "2318-08-08T00:00:00Z",
                "size_vram": 0,
                "context_length": i.context_length,
            }
        )
    return web.json_response({"models": out})


@routes.post("/api/chat")
async def chat(request: web.Request) -> web.StreamResponse:
    started = time.perf_counter()
    service: Hearth = request.app[SERVICE]
    b = Body(await read_json_body(request))
    model_id = resolve_id(service, b.text("model", required=True) or "")
    request[REQUEST_LOG]["model"] = model_id
    _reject(b)
    constraint, think = _format(b), _think(b)
    tools: list[Tool] = parse_tool_list(b.data.get("tools") or None)
    keep = _keep_alive(b)
    if not b.data.get("messages"):
        return await _load_or_unload(service, model_id, keep, "message")
    messages: list[ChatMessage] = parse_messages(
        Body({"messages": _openai_messages(b.data["messages"])})
    )
    sampling, max_tokens, stop = _sampling(b.data.get("options") or {})
    load_ns = await _jit(service, model_id)
    gen = await service.chat(
        model_id,
        messages,
        sampling=sampling,
        max_tokens=max_tokens,
        stop=stop,
        ttl=keep,
        constraint=constraint,
        tools=tools,
        tool_choice="auto" if tools else "none",
        template_vars=_think_vars(b),
    )
    return await _respond(
        request, gen, model_id, b.flag("stream", True), "message", started, load_ns, think
    )


@routes.post("/api/generate")
async def generate(request: web.Request) -> web.StreamResponse:
    started = time.perf_counter()
    service: Hearth = request.app[SERVICE]
    b = Body(await read_json_body(request))
    model_id = resolve_id(service, b.text("model", required=True) or "")
    request[REQUEST_LOG]["model"] = model_id
    _reject(b)
    if b.data.get("tools"):
        raise UnsupportedParameter("'tools' need /api/chat", param="tools")
    constraint, think = _format(b), _think(b)
    keep = _keep_alive(b)
    prompt = b.text("prompt", default="") or ""
    if not prompt:
        return await _load_or_unload(service, model_id, keep, "response")
    if b.data.get("template"):
        raise UnsupportedParameter(
            "a custom 'template' is not supported; use raw", param="template"
        )
    raw = b.flag("raw")
    sampling, max_tokens, stop = _sampling(b.data.get("options") or {})
    load_ns = await _jit(service, model_id)
    if raw:  # the prompt as is: no template, and its output is not parsed for reasoning
        gen = await service.complete(
            model_id,
            prompt,
            sampling=sampling,
            max_tokens=max_tokens,
            stop=stop,
            ttl=keep,
            constraint=constraint,
        )
    else:  # Ollama applies the model's template to system + prompt
        msgs = []
        system = b.text("system")
        if system:
            msgs.append(ChatMessage("system", system))
        msgs.append(ChatMessage("user", prompt))
        gen = await service.chat(
            model_id,
            msgs,
            sampling=sampling,
            max_tokens=max_tokens,
            stop=stop,
            ttl=keep,
            constraint=constraint,
            template_vars=_think_vars(b),
        )
    return await _respond(
        request, gen, model_id, b.flag("stream", True), "response", started, load_ns, think
    )


@routes.post("/api/embed")
async def embed(request: web.Request) -> web.Response:
    started = time.perf_counter()
    service: Hearth = request.app[SERVICE]
    b = Body(await read_json_body(request))
    model_id = resolve_id(service, b.text("model", required=True) or "")
    request[REQUEST_LOG]["model"] = model_id
    raw = b.data.get("input")
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, list) or not items or not all(isinstance(x, str) and x for x in items):
        raise InvalidRequest("'input' must be a non-empty string or list of strings", param="input")
    load_ns = await _jit(service, model_id)
    vectors, n = await service.embed(model_id, items, ttl=_keep_alive(b))
    request[REQUEST_LOG]["prompt_tokens"] = n
    return await large_json_response(
        {
            "model": model_id,
            "embeddings": vectors,
            "total_duration": int((time.perf_counter() - started) * 1e9),
            "load_duration": load_ns,
            "prompt_eval_count": n,
        }
    )


@routes.post("/api/embeddings")
async def embeddings_legacy(request: web.Request) -> web.Response:
    service: Hearth = request.app[SERVICE]
    b = Body(await read_json_body(request))
    model_id = resolve_id(service, b.text("model", required=True) or "")
    prompt = b.text("prompt", required=True) or ""
    if not prompt:
        raise InvalidRequest("'prompt' must not be empty", param="prompt")
    vectors, _ = await service.embed(model_id, [prompt], ttl=_keep_alive(b))
    return web.json_response({"embedding": vectors[0]})
