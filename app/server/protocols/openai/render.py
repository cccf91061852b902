"""OpenAI chat completions, legacy completions and embeddings, rendered: results and deltas ->
wire (whole answers, SSE chunks, usage, logprobs), and OpenAI's error shape.

Pure translation (no aiohttp): the routes in ``app/server/routes/openai.py`` write what comes
back through the one streaming path.
Tested by tests/server/protocols/openai/test_adapter.py and
tests/server/protocols/openai/test_scoring_fields.py.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Sequence
from typing import Any

from app import __version__
from app.core.inference.generation import Completion
from app.core.requests import ChatRequest, CompletionRequest, EmbeddingRequest, Embeddings
from app.core.types import Delta, PromptToken, TokenLogprob, ToolCallDelta
from app.errors import HearthError
from app.server.protocols.base import Context, Frame, Protocol, StreamRenderer
from app.server.protocols.common import token_logprobs, tool_parse_field
from app.server.protocols.openai.fields import StreamOptions

FINGERPRINT = f"hearth-{__version__}"


class OpenAI(Protocol):
    name = "openai"

    def error_body(self, err: HearthError) -> dict[str, Any]:
        return error_body(err)


def error_body(err: HearthError) -> dict[str, Any]:
    return {
        "error": {"message": err.message, "type": err.type, "param": err.param, "code": err.code}
    }


def usage(finals: Sequence[Delta]) -> dict[str, Any]:
    """OpenAI's usage object, summed over every generation of the request."""
    p = c = cached = reasoning = 0
    for d in finals:
        if d.usage:
            p += d.usage.prompt_tokens
            c += d.usage.completion_tokens
            cached += d.usage.cached_tokens
            reasoning += d.usage.reasoning_tokens
    return {
        "prompt_tokens": p,
        "completion_tokens": c,
        "total_tokens": p + c,
        "prompt_tokens_details": {"cached_tokens": cached},
        "completion_tokens_details": {"reasoning_tokens": reasoning},
    }


def chat_logprobs(lps: Sequence[TokenLogprob]) -> dict[str, Any]:
    """OpenAI's chat shape: content[].token/logprob/bytes/top_logprobs."""
    return {"content": token_logprobs(lps), "refusal": None}


def completion_logprobs(lps: Sequence[TokenLogprob], offset: int = 0) -> dict[str, Any]:
    """The legacy completions shape: parallel arrays and text offsets."""
    return {
        "tokens": [t.token for t in lps],
        "token_logprobs": [t.logprob for t in lps],
        "top_logprobs": [{s: lp for s, lp, _ in t.top} for t in lps],
        "text_offset": text_offsets([t.token for t in lps], offset),
    }


def text_offsets(texts: Sequence[str], start: int = 0) -> list[int]:
    """Where each token's text begins in the answer's text (legacy ``text_offset``)."""
    out, pos = [], start
    for t in texts:
        out.append(pos)
        pos += len(t)
    return out


def echo_logprobs(tokens: Sequence[PromptToken]) -> dict[str, Any]:
    """The echoed prompt's part of the legacy logprobs arrays: the first token has no
    log-probability and no alternatives (null), as OpenAI's legacy endpoint answers."""
    return {
        "tokens": [t.text for t in tokens],
        "token_logprobs": [t.logprob for t in tokens],
        "top_logprobs": [
            None
            if t.logprob is None
            else dict(zip(t.top_text, (lp for _, lp in t.top), strict=True))
            for t in tokens
        ],
        "text_offset": text_offsets([t.text for t in tokens]),
    }


def _joined(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    return {k: a[k] + b[k] for k in a}


def prompt_logprobs(tokens: Sequence[PromptToken]) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's ``prompt_logprobs``: null for the first token; then per place, keyed by token id,
    the prompt's own token and the most likely ones: ``{"logprob", "rank", "decoded_token"}``."""
    out: list[dict[str, dict[str, Any]] | None] = []
    for t in tokens:
        if t.logprob is None:
            out.append(None)
            continue
        place = {str(t.id): {"logprob": t.logprob, "rank": t.rank, "decoded_token": t.text}}
        for r, ((a, lp), text) in enumerate(zip(t.top, t.top_text, strict=True), start=1):
            place.setdefault(str(a), {"logprob": lp, "rank": r, "decoded_token": text})
        out.append(place)
    return out


def _echo_length(req: CompletionRequest, i: int, r: Completion) -> int:
    """The echoed text's length in choice ``i``: where the generated tokens' offsets begin."""
    prompt = req.prompts[i // req.n] if req.prompts else ""
    return len(prompt) if isinstance(prompt, str) else sum(len(t.text) for t in r.prompt)


def _completion_choice_logprobs(
    req: CompletionRequest, i: int, r: Completion
) -> dict[str, Any] | None:
    if req.logprobs is None:
        return None
    if not req.echo:
        return completion_logprobs(r.logprobs)
    generated = completion_logprobs(r.logprobs, _echo_length(req, i, r))
    return _joined(echo_logprobs(r.prompt), generated)


def _reasoning_fields(ctx: Context, text: str) -> dict[str, str]:
    """reasoning_content (DeepSeek's name, read by most clients), and `reasoning` if asked."""
    if not text:
        return {}
    out = {"reasoning_content": text}
    if ctx.reasoning_also:
        out["reasoning"] = text
    return out


def _timings(finals: Sequence[Delta]) -> dict[str, Any] | None:
    return finals[0].timings.as_dict() if finals and finals[0].timings else None


def chat_response(req: ChatRequest, results: Sequence[Completion], ctx: Context) -> dict[str, Any]:
    finals = [r.final for r in results]
    return {
        "id": "chatcmpl-" + ctx.id,
        "object": "chat.completion",
        "created": int(ctx.created),
        "model": ctx.model,
        "system_fingerprint": FINGERPRINT,
        "choices": [
            {
                "index": i,
                "message": {
                    "role": "assistant",
                    # content is null when the answer is only tool calls
                    "content": None if r.tool_calls and not r.text.strip() else r.text,
                    "refusal": None,
                    **_reasoning_fields(ctx, r.reasoning),
                    **(
                        {
                            "tool_calls": [
                                {
                                    "id": c.id,
                                    "type": "function",
                                    "function": {"name": c.name, "arguments": c.arguments},
                                }
                                for c in r.tool_calls
                            ]
                        }
                        if r.tool_calls
                        else {}
                    ),
                },
                "logprobs": chat_logprobs(r.logprobs) if req.logprobs is not None else None,
                "finish_reason": r.final.finish_reason,
                **tool_parse_field(r.final),
            }
            for i, r in enumerate(results)
        ],
        "usage": usage(finals),
        "timings": _timings(finals),
        **(
            {"prompt_logprobs": prompt_logprobs(results[0].prompt) if results else None}
            if req.prompt_logprobs is not None
            else {}
        ),
    }


def _tool_call_delta(tc: ToolCallDelta) -> dict[str, Any]:
    """First delta of an index: id, type, name and empty arguments; later: index + fragment."""
    if tc.id is not None:
        return {
            "index": tc.index,
            "id": tc.id,
            "type": "function",
            "function": {"name": tc.name, "arguments": ""},
        }
    return {"index": tc.index, "function": {"arguments": tc.arguments}}


class _ChunkStream(StreamRenderer):
    """What OpenAI's two streams share: the fields every chunk repeats, ``usage: null`` on each
    chunk when the client asked for usage, the usage chunk, ``[DONE]``, the error event."""

    object = ""
    prefix = ""

    def __init__(self, so: StreamOptions, ctx: Context) -> None:
        self.ctx = ctx
        self.include_usage = so.include_usage
        self.base = {
            "id": self.prefix + ctx.id,
            "object": self.object,
            "created": int(ctx.created),
            "model": ctx.model,
            "system_fingerprint": FINGERPRINT,
        }
        self.extra = {"usage": None} if so.include_usage else {}

    def _frame(self, choice: dict[str, Any]) -> Frame:
        return Frame({**self.base, "choices": [choice], **self.extra})

    def _usage_chunk(self, finals: Sequence[Delta]) -> dict[str, Any]:
        chunk: dict[str, Any] = {**self.base, "choices": [], "usage": usage(finals)}
        timings = _timings(finals)
        if timings:
            chunk["timings"] = timings
        return chunk

    def close(self, finals: Sequence[Delta]) -> list[Frame]:
        out = [Frame(self._usage_chunk(finals))] if self.include_usage else []
        out.append(Frame("[DONE]"))
        return out

    def error(self, err: HearthError) -> list[Frame]:
        # the one error event a broken stream gets; never [DONE] after it
        return [Frame(error_body(err))]


class ChatStream(_ChunkStream):
    """``chat.completion.chunk`` events; choices one after the other, each with its index."""

    object = "chat.completion.chunk"
    prefix = "chatcmpl-"

    def __init__(self, req: ChatRequest, so: StreamOptions, ctx: Context) -> None:
        super().__init__(so, ctx)
        self.begun: set[int] = set()

    def _chunk(
        self,
        i: int,
        delta: dict[str, Any],
        finish: str | None = None,
        lps: Sequence[TokenLogprob] = (),
    ) -> Frame:
        lp = chat_logprobs(lps) if lps else None
        return self._frame({"index": i, "delta": delta, "logprobs": lp, "finish_reason": finish})

    def _begin(self, i: int) -> list[Frame]:
        if i in self.begun:
            return []
        self.begun.add(i)
        return [self._chunk(i, {"role": "assistant", "content": ""})]

    def delta(self, i: int, d: Delta) -> list[Frame]:
        out = self._begin(i)
        if d.reasoning:
            out.append(self._chunk(i, _reasoning_fields(self.ctx, d.reasoning)))
        if d.text or d.logprobs:
            out.append(self._chunk(i, {"content": d.text}, lps=d.logprobs))
        if d.tool_calls:
            out.append(self._chunk(i, {"tool_calls": [_tool_call_delta(t) for t in d.tool_calls]}))
        return out

    def end_choice(self, i: int, final: Delta) -> list[Frame]:
        last = self._chunk(i, {}, final.finish_reason)
        last.data["choices"][0].update(tool_parse_field(final))
        return [*self._begin(i), last]


def completion_response(
    req: CompletionRequest, results: Sequence[Completion], ctx: Context
) -> dict[str, Any]:
    finals = [r.final for r in results]
    return {
        "id": "cmpl-" + ctx.id,
        "object": "text_completion",
        "created": int(ctx.created),
        "model": ctx.model,
        "system_fingerprint": FINGERPRINT,
        "choices": [
            {
                "index": i,
                "text": r.text,
                "logprobs": _completion_choice_logprobs(req, i, r),
                "finish_reason": r.final.finish_reason,
                **(
                    {"prompt_logprobs": prompt_logprobs(r.prompt)}
                    if req.prompt_logprobs is not None
                    else {}
                ),
            }
            for i, r in enumerate(results)
        ],
        "usage": usage(finals),
    }


class CompletionStream(_ChunkStream):
    """``text_completion`` events, choice after choice (prompt k // n, sample k % n)."""

    object = "text_completion"
    prefix = "cmpl-"

    def __init__(self, req: CompletionRequest, so: StreamOptions, ctx: Context) -> None:
        super().__init__(so, ctx)
        self.logprobs = req.logprobs is not None
        self.echo = req.echo
        self.offset: dict[int, int] = {}

    def _event(self, i: int, text: str, lp: Any, finish: str | None) -> Frame:
        return self._frame({"index": i, "text": text, "logprobs": lp, "finish_reason": finish})

    def delta(self, i: int, d: Delta) -> list[Frame]:
        if d.prompt and self.echo:
            # the echoed prompt and its logprobs come in the choice's first chunk (as OpenAI's)
            self.offset[i] = len(d.text)
            lp = echo_logprobs(d.prompt) if self.logprobs else None
            return [self._event(i, d.text, lp, None)]
        if not (d.text or d.logprobs):
            return []
        offset = self.offset.get(i, 0)
        lp = completion_logprobs(d.logprobs, offset) if self.logprobs else None
        self.offset[i] = offset + sum(len(t.token) for t in d.logprobs)
        return [self._event(i, d.text, lp, None)]

    def end_choice(self, i: int, final: Delta) -> list[Frame]:
        return [self._event(i, "", None, final.finish_reason)]

    def _usage_chunk(self, finals: Sequence[Delta]) -> dict[str, Any]:
        # the legacy stream has always carried the last prompt's timings, null or not
        return {**super()._usage_chunk(finals), "timings": _timings(finals[-1:])}


def embeddings_response(
    req: EmbeddingRequest, result: Embeddings, fmt: str, model: str
) -> dict[str, Any]:
    """The embeddings list (base64: little-endian float32, as OpenAI's SDK decodes it)."""
    data = []
    for i, v in enumerate(result.vectors):
        emb: Any = v
        if fmt == "base64":
            emb = base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode()
        data.append({"object": "embedding", "index": i, "embedding": emb})
    n = result.prompt_tokens
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": n, "total_tokens": n},
    }
