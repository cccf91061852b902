"""llama-server's ``/infill`` body -> a fill-in-the-middle :class:`CompletionRequest`.

``input_prefix`` and ``input_suffix`` (required), ``input_extra`` (other files, each
``{"filename", "text"}``), ``prompt`` (the cursor line's text, kept whole after the prefix),
``n_predict`` (-1: no bound), llama-server's sampling fields with its defaults (temperature 0.8,
top_k 40, top_p 0.95, min_p 0.05), ``stop``, ``n_indent``, ``t_max_prompt_ms`` and
``t_max_predict_ms``, ``samplers`` (the samplers a list leaves out do not run; Hearth's fixed
order, llama.cpp's ``infill`` sampler included). Every other field is classified in
fields_registry.py.
Tested by tests/server/protocols/llama/test_infill_adapter.py and
tests/server/fim/test_fim_wire.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.core.inference.fim.infill import DEFAULT_FILENAME
from app.core.requests import CompletionRequest, Infill
from app.core.types import SamplingParams
from app.errors import InvalidRequest
from app.server.protocols.common import MAX_TOKENS_LIMIT, Body, check_stop, parse_ttl
from app.server.protocols.fields_registry import LLAMA_INFILL, refuse_unhonoured

MAX_EXTRA = 256  # other files in one request
MAX_MS = 3_600_000.0  # an hour: the longest time limit taken
# llama-server's sampling defaults (common_params_sampling) where the body says nothing
DEFAULTS = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)


@dataclass(frozen=True, slots=True)
class ParsedInfill:
    """The request and whether it is streamed (SSE ``data:`` events)."""

    request: CompletionRequest
    stream: bool


def parse_infill(data: dict[str, Any]) -> ParsedInfill:
    b = Body(data)
    refuse_unhonoured(data, LLAMA_INFILL)
    prefix = b.text("input_prefix", required=True) or ""
    suffix = b.text("input_suffix", required=True) or ""
    infill = Infill(
        suffix=suffix,
        extra=_extra(b.data.get("input_extra")),
        cursor=b.text("prompt", default="") or "",
        indent=b.integer("n_indent", 0, lo=0, hi=1024) or 0,
        param="input_suffix",
    )
    req = CompletionRequest(
        model=b.text("model") or "",
        prompts=(prefix,),
        sampling=_sampling(b),
        max_tokens=_n_predict(b),
        stop=check_stop(b.data.get("stop"), "stop"),
        ttl=parse_ttl(b),
        infill=infill,
        max_prompt_ms=_ms(b, "t_max_prompt_ms"),
        max_predict_ms=_ms(b, "t_max_predict_ms"),
    )
    return ParsedInfill(req, b.flag("stream"))


def _extra(raw: Any) -> tuple[tuple[str, str], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or len(raw) > MAX_EXTRA:
        raise InvalidRequest(
            f"'input_extra' must be an array of at most {MAX_EXTRA} "
            '{"filename": string, "text": string} objects',
            param="input_extra",
        )
    out = []
    for i, chunk in enumerate(raw):
        text = chunk.get("text") if isinstance(chunk, dict) else None
        name = chunk.get("filename", DEFAULT_FILENAME) if isinstance(chunk, dict) else None
        if not isinstance(text, str):
            raise InvalidRequest(
                "each 'input_extra' chunk needs a 'text' string", param=f"input_extra[{i}].text"
            )
        if not isinstance(name, str):
            raise InvalidRequest(
                "a chunk's 'filename' must be a string", param=f"input_extra[{i}].filename"
            )
        out.append((name, text))
    return tuple(out)


def _n_predict(b: Body) -> int | None:
    """``n_predict`` (or ``max_tokens``): -1 for no bound, 0 to check the prompt only."""
    for key in ("n_predict", "max_tokens"):
        if b.has(key):
            n = b.integer(key, -1, lo=-1, hi=MAX_TOKENS_LIMIT)
            return None if n is None or n < 0 else n
    return None


def _ms(b: Body, key: str) -> float | None:
    """A time limit in milliseconds; 0 or less: none (as llama-server reads it)."""
    v = b.number(key, 0.0, lo=-MAX_MS, hi=MAX_MS)
    return v if v > 0 else None


# llama.cpp's sampler names (and one-letter forms) Hearth has; each runs in Hearth's fixed
# order (penalties, top-k, top-p, min-p, infill, temperature), whatever order the list gives
SAMPLERS = {
    "penalties": "e",
    "top_k": "k",
    "top_p": "p",
    "nucleus": "p",
    "min_p": "m",
    "infill": "i",
    "temperature": "t",
    "temp": "t",
}
# the others: each does nothing with its default settings (whose changes are refused)
OTHER_SAMPLERS = {"dry", "top_n_sigma", "typ_p", "typ", "typical_p", "xtc"}


def _samplers(raw: Any) -> set[str] | None:
    """The samplers a body's ``samplers`` runs (their letters), or None when it names none."""
    if raw is None:
        return None
    if isinstance(raw, str):  # llama.cpp's letters, as "edkypmxt"
        return set(raw) & set(SAMPLERS.values())
    if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
        raise InvalidRequest("'samplers' must be a list of sampler names", param="samplers")
    unknown = [x for x in raw if x not in SAMPLERS and x not in OTHER_SAMPLERS]
    if unknown:
        raise InvalidRequest(f"unknown sampler '{unknown[0]}'", param="samplers")
    return {SAMPLERS[x] for x in raw if x in SAMPLERS}


def _sampling(b: Body) -> SamplingParams:
    s = _values(b)
    chosen = _samplers(b.data.get("samplers"))
    if chosen is None:
        return s
    # a sampler the list leaves out does not run, as in llama-server's chain
    return SamplingParams(
        temperature=s.temperature if "t" in chosen else 1.0,
        top_k=s.top_k if "k" in chosen else 0,
        top_p=s.top_p if "p" in chosen else 1.0,
        min_p=s.min_p if "m" in chosen else 0.0,
        repeat_penalty=s.repeat_penalty if "e" in chosen else 1.0,
        presence_penalty=s.presence_penalty if "e" in chosen else 0.0,
        frequency_penalty=s.frequency_penalty if "e" in chosen else 0.0,
        seed=s.seed,
        infill="i" in chosen,
    )


def _values(b: Body) -> SamplingParams:
    d = DEFAULTS
    seed = b.integer("seed", -1, lo=-1, hi=(1 << 64) - 1)
    repeat = b.number("repeat_penalty", d.repeat_penalty, lo=0.0, hi=10.0)
    if repeat <= 0:
        raise InvalidRequest("'repeat_penalty' must be greater than 0", param="repeat_penalty")
    return SamplingParams(
        temperature=b.number("temperature", d.temperature, lo=0.0, hi=2.0),
        top_p=b.number("top_p", d.top_p, lo=0.0, hi=1.0),
        # llama-server: top_k 0 or less is off
        top_k=max(0, b.integer("top_k", d.top_k, lo=-1, hi=1_000_000) or 0),
        min_p=b.number("min_p", d.min_p, lo=0.0, hi=1.0),
        repeat_penalty=repeat,
        presence_penalty=b.number("presence_penalty", 0.0, lo=-2.0, hi=2.0),
        frequency_penalty=b.number("frequency_penalty", 0.0, lo=-2.0, hi=2.0),
        seed=None if seed is None or seed < 0 else seed,  # -1: a random seed
    )
