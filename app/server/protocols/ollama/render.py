"""Ollama's answers from core results: NDJSON lines of a stream (a tool call once whole, the
reasoning in ``thinking`` or back in the content for ``think: false``, each line's tokens'
``logprobs`` when asked for), the one object of a ``"stream": false`` answer, and the
load/unload and embedding answers, and Ollama's error shape ``{"error": "..."}``. Pure (no
aiohttp).
Tested by tests/server/protocols/ollama/test_adapter.py."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from app.core.inference.generation import Completion
from app.core.inference.reasoning import CLOSE_TAG, OPEN_TAG
from app.core.requests import Embeddings
from app.core.types import Delta, TokenLogprob
from app.core.util import jsonsafe
from app.errors import HearthError
from app.server.protocols.base import Context, Frame, Protocol, StreamRenderer
from app.server.protocols.common import token_logprobs, tool_parse_field
from app.server.protocols.ollama.parse import Key

log = logging.getLogger(__name__)


def error_body(err: HearthError) -> dict[str, Any]:
    return {"error": err.message}


class Ollama(Protocol):
    name = "ollama"

    def error_body(self, err: HearthError) -> dict[str, Any]:
        return error_body(err)


def now_iso(ts: float | None = None) -> str:
    """Ollama's ``created_at``/``modified_at``: UTC, ISO 8601, ``Z``."""
    when = datetime.fromtimestamp(ts if ts is not None else time.time(), UTC)
    return when.isoformat().replace("+00:00", "Z")


def _call(i: int, call_id: str, name: str, raw: str) -> dict[str, Any]:
    """A whole call in Ollama's shape: arguments as an object (``{}`` when they are not one)."""
    try:
        args = jsonsafe.loads(raw) if raw.strip() else {}
    except ValueError:
        args = None
    if not isinstance(args, dict):
        log.warning("tool call %s: arguments are not a JSON object: %.200r", name, raw)
        args = {}
    return {"id": call_id, "function": {"index": i, "name": name, "arguments": args}}


class _Shaper:
    """Deltas -> Ollama's pieces: content, thinking, and each tool call once it is whole."""

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
        return content, thinking, self.ready(final=d.finish_reason is not None)

    def ready(self, *, final: bool) -> list[dict[str, Any]]:
        """Calls whose arguments are whole: a JSON object, or ended by a later call or the end."""
        out = []
        last = max(self._calls, default=-1)
        for i in sorted(self._calls):
            if i in self._sent:
                continue
            cid, name, raw = self._calls[i]
            if not final and i == last:
                try:
                    whole = isinstance(jsonsafe.loads(raw), dict) if raw.strip() else False
                except ValueError:
                    whole = False
                if not whole:
                    break  # arguments still streaming in
            self._sent.add(i)
            out.append(_call(i, cid, name, raw))
        return out


def _piece(
    key: Key, content: str, thinking: str = "", calls: Sequence[dict[str, Any]] = ()
) -> dict[str, Any]:
    """The output fields of one line: ``message`` (/api/chat) or ``response`` (/api/generate)."""
    if key == "message":
        msg: dict[str, Any] = {"role": "assistant", "content": content}
        if thinking:
            msg["thinking"] = thinking
        if calls:
            msg["tool_calls"] = list(calls)
        return {"message": msg}
    return {"response": content, **({"thinking": thinking} if thinking else {})}


def _logprobs(lps: Sequence[TokenLogprob]) -> dict[str, Any]:
    """Ollama's top-level ``logprobs``: absent when there are none (off, as Ollama omits it)."""
    return {"logprobs": token_logprobs(lps)} if lps else {}


def final_fields(final: Delta, ctx: Context, now_ns: int) -> dict[str, Any]:
    """``done_reason`` and Ollama's counters (durations in ns since the request arrived)."""
    t, u = final.timings, final.usage
    return {
        "done_reason": final.finish_reason if final.finish_reason in ("stop", "length") else "stop",
        **tool_parse_field(final),
        "total_duration": now_ns - ctx.started_ns,
        "load_duration": ctx.load_ns,
        "prompt_eval_count": u.prompt_tokens if u else 0,
        "prompt_eval_duration": int(t.prompt_ms * 1e6) if t else 0,
        "eval_count": u.completion_tokens if u else 0,
        "eval_duration": int(t.predicted_ms * 1e6) if t else 0,
    }


def _shown(r: Completion, think: bool) -> tuple[str, str]:
    """(content, thinking) of a whole result; with ``think`` false the reasoning stays in the
    content, inside its tags, as the stream writes it."""
    if think or not r.reasoning:
        return r.text, r.reasoning
    tail = CLOSE_TAG + "\n\n" + r.text if r.text else ""
    return OPEN_TAG + r.reasoning + tail, ""


def whole_response(
    key: Key,
    think: bool,
    results: Sequence[Completion],
    ctx: Context,
    *,
    clock: Callable[[], float] = time.time,
    perf_ns: Callable[[], int] = time.perf_counter_ns,
) -> dict[str, Any]:
    """The one object of a ``"stream": false`` answer."""
    r = results[0]
    content, thinking = _shown(r, think)
    calls = [_call(i, c.id, c.name, c.arguments) for i, c in enumerate(r.tool_calls)]
    return {
        "model": ctx.model,
        "created_at": now_iso(clock()),
        **_piece(key, content, thinking, calls),
        "done": True,
        **final_fields(r.final, ctx, perf_ns()),
        **_logprobs(r.logprobs),
    }


class NdjsonStream(StreamRenderer):
    """Ollama's stream: a ``"done": false`` line per piece (a tool call once whole), a last
    ``"done": true`` line with the counters; a broken stream ends with ``{"error": "..."}``."""

    framing = "ndjson"

    def __init__(
        self,
        key: Key,
        think: bool,
        ctx: Context,
        *,
        clock: Callable[[], float] = time.time,
        perf_ns: Callable[[], int] = time.perf_counter_ns,
    ) -> None:
        self.key = key
        self.ctx = ctx
        self.shaper = _Shaper(think)
        self.clock = clock
        self.perf_ns = perf_ns

    def _line(
        self,
        content: str,
        thinking: str = "",
        calls: Sequence[dict[str, Any]] = (),
        lps: Sequence[TokenLogprob] = (),
    ) -> Frame:
        return Frame(
            {
                "model": self.ctx.model,
                "created_at": now_iso(self.clock()),
                **_piece(self.key, content, thinking, calls),
                "done": False,
                **_logprobs(lps),
            }
        )

    def delta(self, i: int, d: Delta) -> list[Frame]:
        content, thinking, calls = self.shaper.feed(d)
        # a line for the logprobs alone too: their tokens' text is held back (a stop string's
        # start, a tool call's arguments), as Ollama sends them while its parsers buffer
        if content or thinking or calls or d.logprobs:
            return [self._line(content, thinking, calls, d.logprobs)]
        return []

    def end_choice(self, i: int, final: Delta) -> list[Frame]:
        # calls whose arguments never became a JSON object still go out, before the end
        calls = self.shaper.ready(final=True)
        done = {
            "model": self.ctx.model,
            "created_at": now_iso(self.clock()),
            **_piece(self.key, ""),
            "done": True,
            **final_fields(final, self.ctx, self.perf_ns()),
        }
        return [*([self._line("", "", calls)] if calls else []), Frame(done)]

    def error(self, err: HearthError) -> list[Frame]:
        return [Frame(error_body(err))]


def load_response(model: str, key: Key, unloaded: bool) -> dict[str, Any]:
    """The answer to an empty prompt/messages: the model was loaded (or unloaded)."""
    return {
        "model": model,
        "created_at": now_iso(),
        "done": True,
        "done_reason": "unload" if unloaded else "load",
        **({"message": {"role": "assistant", "content": ""}} if key == "message" else {}),
        **({"response": ""} if key == "response" else {}),
    }


def embed_response(result: Embeddings, model: str, ctx: Context, now_ns: int) -> dict[str, Any]:
    return {
        "model": model,
        "embeddings": result.vectors,
        "total_duration": now_ns - ctx.started_ns,
        "load_duration": ctx.load_ns,
        "prompt_eval_count": result.prompt_tokens,
    }
