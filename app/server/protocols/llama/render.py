"""llama-server's ``/infill`` answers (its ``/completion`` shape): the whole object
(``content``, ``stop``, ``tokens_predicted``, ``tokens_evaluated``, ``stop_type``,
``stopping_word``, ``timings``...), or SSE ``data: {...}`` events: one per piece of text with
``stop: false``, then the final object with ``content: ""`` and ``stop: true`` (no ``[DONE]``,
as llama-server ends these streams). Errors in OpenAI's shape, which llama-server's follows.
Tested by tests/server/protocols/llama/test_infill_adapter.py and
tests/server/fim/test_fim_wire.py."""

from __future__ import annotations

from typing import Any

from app.core.inference.generation import Completion
from app.core.requests import CompletionRequest
from app.core.types import Delta, Timings
from app.errors import HearthError
from app.server.protocols.base import Context, Frame, StreamRenderer
from app.server.protocols.openai.render import error_body


def stop_type(final: Delta) -> str:
    """llama-server's ``stop_type``: eos, word (a stop string), limit (n_predict or a time or
    indent stop), none."""
    if final.finish_reason == "length":
        return "limit"
    if final.finish_reason == "stop":
        return "word" if final.stop_string else "eos"
    return "none"


def timings(t: Timings | None) -> dict[str, Any]:
    """llama-server's ``timings`` object."""
    t = t or Timings()
    return {
        "cache_n": t.cache_n,
        "prompt_n": t.prompt_n,
        "prompt_ms": round(t.prompt_ms, 3),
        "prompt_per_token_ms": round(t.prompt_ms / t.prompt_n, 3) if t.prompt_n else 0.0,
        "prompt_per_second": round(t.prompt_per_second, 3),
        "predicted_n": t.predicted_n,
        "predicted_ms": round(t.predicted_ms, 3),
        "predicted_per_token_ms": round(t.predicted_ms / t.predicted_n, 3)
        if t.predicted_n
        else 0.0,
        "predicted_per_second": round(t.predicted_per_second, 3),
    }


def settings(req: CompletionRequest) -> dict[str, Any]:
    """``generation_settings``: what the answer was generated with."""
    s, infill = req.sampling, req.infill
    return {
        "n_predict": -1 if req.max_tokens is None else req.max_tokens,
        "temperature": s.temperature,
        "top_k": s.top_k,
        "top_p": s.top_p,
        "min_p": s.min_p,
        "repeat_penalty": s.repeat_penalty,
        "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty,
        "seed": -1 if s.seed is None else s.seed,
        "stop": list(req.stop),
        "n_indent": infill.indent if infill is not None else 0,
        "t_max_prompt_ms": req.max_prompt_ms or -1,
        "t_max_predict_ms": req.max_predict_ms or -1,
    }


def final_object(
    req: CompletionRequest, final: Delta, content: str, has_new_line: bool, ctx: Context
) -> dict[str, Any]:
    usage = final.usage
    return {
        "index": 0,
        "content": content,
        "tokens": [],
        "id_slot": -1,
        "stop": True,
        "model": ctx.model,
        "tokens_predicted": usage.completion_tokens if usage else 0,
        "tokens_evaluated": usage.prompt_tokens if usage else 0,
        "generation_settings": settings(req),
        "has_new_line": has_new_line,
        "truncated": False,
        "stop_type": stop_type(final),
        "stopping_word": final.stop_string or "",
        "tokens_cached": usage.cached_tokens if usage else 0,
        "timings": timings(final.timings),
    }


def infill_response(req: CompletionRequest, result: Completion, ctx: Context) -> dict[str, Any]:
    """The whole answer (``"stream": false``)."""
    return final_object(req, result.final, result.text, "\n" in result.text, ctx)


class InfillStream(StreamRenderer):
    """SSE events of one infill: text pieces, then the final object."""

    framing = "sse"

    def __init__(self, req: CompletionRequest, ctx: Context, prompt_tokens: int) -> None:
        self.req = req
        self.ctx = ctx
        self.prompt_tokens = prompt_tokens
        self.predicted = 0
        self.has_new_line = False

    def _piece(self, text: str) -> Frame:
        return Frame(
            {
                "index": 0,
                "content": text,
                "tokens": [],
                "stop": False,
                "id_slot": -1,
                "tokens_predicted": self.predicted,
                "tokens_evaluated": self.prompt_tokens,
            }
        )

    def delta(self, i: int, d: Delta) -> list[Frame]:
        self.predicted += d.token_count
        if not d.text:
            return []
        self.has_new_line = self.has_new_line or "\n" in d.text
        return [self._piece(d.text)]

    def end_choice(self, i: int, final: Delta) -> list[Frame]:
        frames = self.delta(i, final) if final.text else []
        body = final_object(self.req, final, "", self.has_new_line, self.ctx)
        return [*frames, Frame(body)]

    def error(self, err: HearthError) -> list[Frame]:
        return [Frame(error_body(err))]
