"""What each kind of OpenAI-compatible engine says about itself, read from its answers: which
engine it is, its state, the models it serves with their context lengths, and its errors.

Pure functions on recorded answers (``Answer``: status and parsed body), so the HTTP client
(client.py) performs the requests and this module only reads them. Every function is total:
bodies are whatever the far side sent (any JSON, text, None) and never make it raise.
Tested by tests/runtimes/remote/test_kinds.py."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.core.gateway.providers.base import Answer, RemoteModel
from app.core.gateway.providers.store import KINDS

MODELS = "models"  # the key of GET {base_url}/models in an answers mapping
# MODELS first, then root-relative paths that tell the engines apart when the kind is unknown
DETECT_PATHS: tuple[str, ...] = (MODELS, "/health", "/props", "/api/version", "/info")
MAX_FOLLOWUPS = 64
MAX_MODELS = 1024
MAX_MESSAGE = 300
MAX_ID = 512

_PROBE: dict[str, tuple[str, ...]] = {
    "openai": (MODELS,),
    "vllm": (MODELS,),  # max_model_len is in /v1/models; /health is an empty 200
    "sglang": (MODELS,),
    "llama.cpp": (MODELS, "/health", "/props"),
    "ollama": (MODELS, "/api/tags"),
    "hearth": (MODELS, "/health"),
    "tgi": (MODELS, "/info"),
}
_DEFAULT_CAPS = RemoteModel("x").capabilities
_HEARTH_CAPS = ("completion", "chat", "embeddings", "rerank", "vision", "fim")
_NO_ANSWER = Answer(0, "no answer")


def root_of(base_url: str) -> str:
    """The engine's root: its OpenAI base URL without a trailing ``/v1``."""
    if not isinstance(base_url, str):
        return ""
    url = base_url.strip().rstrip("/")
    return url[: -len("/v1")] if url.lower().endswith("/v1") else url


def probe_paths(kind: str) -> tuple[str, ...]:
    """What a probe of a known kind GETs (MODELS first); an unknown kind is detected."""
    return (
        _PROBE.get(kind, DETECT_PATHS) if isinstance(kind, str) and kind in KINDS else DETECT_PATHS
    )


# -- reading bodies ----------------------------------------------------------------------------
def _get(answers: Mapping[str, Answer], key: str) -> Answer:
    try:
        a = answers.get(key)
    except Exception:  # a mapping of the wrong shape counts as no answer
        return _NO_ANSWER
    if isinstance(a, tuple) and len(a) == 2 and isinstance(a[0], int):
        return Answer(a[0], a[1])
    return _NO_ANSWER


def _ok(answers: Mapping[str, Answer], key: str) -> dict[str, Any] | None:
    """The body of a 200 answer when it is a JSON object."""
    a = _get(answers, key)
    return a.body if a.status == 200 and isinstance(a.body, dict) else None


def _int(v: Any) -> int | None:
    """A positive token count, or None (bools, floats, strings and absurd numbers are not)."""
    return v if type(v) is int and 0 < v < 2**31 else None


def _text(v: Any) -> str | None:
    return v.strip() or None if isinstance(v, str) else None


def _clip(s: str) -> str:
    return s if len(s) <= MAX_MESSAGE else s[:MAX_MESSAGE] + "…"


def _valid_id(v: Any) -> str | None:
    # the engine's own spelling is kept; only what no model id can be is refused
    if isinstance(v, str) and 0 < len(v) <= MAX_ID and v.isprintable() and v.strip() == v:
        return v
    return None


def _entries(body: Any) -> list[dict[str, Any]] | None:
    """The model entries of an OpenAI list (``{"data": [...]}``), or None when it is not one."""
    if not isinstance(body, dict) or not isinstance(body.get("data"), list):
        return None
    return [e for e in body["data"][:MAX_MODELS] if isinstance(e, dict)]


def _owners(answers: Mapping[str, Answer]) -> set[str]:
    a = _get(answers, MODELS)
    entries = _entries(a.body) if a.status == 200 else None
    return {e["owned_by"] for e in entries or () if isinstance(e.get("owned_by"), str)}


# -- detection ---------------------------------------------------------------------------------
def detect(answers: Mapping[str, Answer]) -> str:
    """Which engine answered (one of KINDS); "openai" when nothing says more. Each engine's own
    word wins (``owned_by`` in its model list), then what only one engine answers."""
    owners = _owners(answers)
    for owner, kind in (("hearth", "hearth"), ("llamacpp", "llama.cpp")):
        if owner in owners:
            return kind
    for owner in ("vllm", "sglang"):
        if owner in owners:
            return owner
    health = _ok(answers, "/health")
    version = _ok(answers, "/api/version")
    if (health and {"loaded", "loading", "version"} <= health.keys()) or (
        version and "hearth" in version
    ):
        return "hearth"
    props = _ok(answers, "/props")
    if props and isinstance(props.get("default_generation_settings"), dict):
        return "llama.cpp"
    h = _get(answers, "/health")
    if h.status == 503 and "loading model" in error_message(503, h.body).lower():
        return "llama.cpp"  # every llama-server path answers this until the model is loaded
    info = _ok(answers, "/info")
    if info and (
        info.get("router") == "text-generation-router"
        or ("model_id" in info and _int(info.get("max_total_tokens")))
    ):
        return "tgi"
    if version and isinstance(version.get("version"), str):
        return "ollama"
    return "openai"


def followups(kind: str, answers: Mapping[str, Answer]) -> list[tuple[str, str, str, Any]]:
    """Second-round requests ``(key, method, root-relative path, json body or None)``: the probe
    paths of ``kind`` not answered yet, and Ollama's ``POST /api/show`` per model (key
    ``show:NAME``: its context length and capabilities). At most MAX_FOLLOWUPS."""
    keys = _keys(answers)
    out: list[tuple[str, str, str, Any]] = [
        (p, "GET", p, None) for p in probe_paths(kind) if p != MODELS and p not in keys
    ]
    if kind == "ollama":
        for name in _ollama_names(answers):
            key = f"show:{name}"
            if key not in keys:
                out.append((key, "POST", "/api/show", {"model": name}))
    return out[:MAX_FOLLOWUPS]


def _keys(answers: Mapping[str, Answer]) -> set[str]:
    try:
        return {k for k in answers if isinstance(k, str)}
    except Exception:
        return set()


def _ollama_names(answers: Mapping[str, Answer]) -> list[str]:
    """Model names from /api/tags (``models[].name``), else from the OpenAI list."""
    tags = _ok(answers, "/api/tags")
    raw: list[Any] = []
    if tags and isinstance(tags.get("models"), list):
        raw = [m.get("name") or m.get("model") for m in tags["models"] if isinstance(m, dict)]
    if not raw:
        a = _get(answers, MODELS)
        raw = [e.get("id") for e in (_entries(a.body) or ()) if a.status == 200]
    names: list[str] = []
    for v in raw:
        if (n := _valid_id(v)) and n not in names:
            names.append(n)
    return names[:MAX_MODELS]


# -- state and models --------------------------------------------------------------------------
def interpret(
    kind: str, answers: Mapping[str, Answer]
) -> tuple[str, tuple[RemoteModel, ...], str | None]:
    """``(state, models, error)`` from a probe's answers: ready (the model list answered 200),
    starting (up but loading: 503), unreachable (no answer), unauthorized (401/403) or error."""
    a = _get(answers, MODELS)
    if kind == "ollama" and a.status != 200 and _ok(answers, "/api/tags"):
        a = Answer(200, {"data": [{"id": n} for n in _ollama_names(answers)]})  # pre-/v1 Ollama
    if a.status == 0:
        return "unreachable", (), _clip(_text(a.body) or "no answer")
    if a.status in (401, 403):
        return "unauthorized", (), error_message(a.status, a.body)
    h = _get(answers, "/health")
    if a.status == 503 or (a.status == 200 and kind == "llama.cpp" and h.status == 503):
        return "starting", (), error_message(503, a.body if a.status == 503 else h.body)
    if a.status != 200:
        return "error", (), f"GET /models: HTTP {a.status}: {error_message(a.status, a.body)}"
    entries = _entries(a.body)
    if entries is None:
        return "error", (), "GET /models did not answer a model list"
    return "ready", _models(kind, entries, answers), None


def _models(
    kind: str, entries: list[dict[str, Any]], answers: Mapping[str, Answer]
) -> tuple[RemoteModel, ...]:
    props = _ok(answers, "/props") if kind == "llama.cpp" else None
    dgs = props.get("default_generation_settings") if props else None
    props_ctx = _int(dgs.get("n_ctx")) if isinstance(dgs, dict) else None
    info = _ok(answers, "/info") if kind == "tgi" else None
    out: dict[str, RemoteModel] = {}
    for e in entries:
        mid = _valid_id(e.get("id"))
        if mid is None or mid in out:
            continue
        ctx = _int(e.get("max_model_len")) or _int(e.get("context_length"))
        caps, stated = _DEFAULT_CAPS, False
        if kind == "llama.cpp":
            meta = e["meta"] if isinstance(e.get("meta"), dict) else {}
            # the slot context the server runs with, before what the model was trained for
            ctx = _int(meta.get("n_ctx")) or (props_ctx if len(entries) == 1 else None) or ctx
            ctx = ctx or _int(meta.get("n_ctx_train"))
            vision = _llama_vision(e, props if len(entries) == 1 else None)
            if vision is not None:
                caps, stated = _DEFAULT_CAPS + (("vision",) if vision else ()), True
        elif kind == "hearth":
            caps, stated = _hearth_caps(e.get("capabilities"))
        elif kind == "ollama":
            ctx, caps, stated = _ollama_show(_ok(answers, f"show:{mid}"))
        elif kind == "tgi" and info:
            ctx = (
                _int(info.get("max_total_tokens"))
                or _int(info.get("max_input_tokens"))
                or _int(info.get("max_input_length"))
            )
        out[mid] = RemoteModel(mid, ctx, caps, stated)
    return tuple(out.values())


def _llama_vision(entry: dict[str, Any], props: dict[str, Any] | None) -> bool | None:
    """Whether a llama.cpp server's model takes images: its router entry's
    ``architecture.input_modalities``, else a one-model server's ``/props`` ``modalities``;
    None when neither says."""
    arch = entry.get("architecture")
    mods = arch.get("input_modalities") if isinstance(arch, dict) else None
    if isinstance(mods, list):
        return "image" in mods
    said = props.get("modalities") if props else None
    if isinstance(said, dict) and isinstance(said.get("vision"), bool):
        return bool(said["vision"])
    return None


def _hearth_caps(v: Any) -> tuple[tuple[str, ...], bool]:
    """A Hearth's ``capabilities`` (and whether it listed them)."""
    if not isinstance(v, list):
        return _DEFAULT_CAPS, False
    caps = tuple(c for c in _HEARTH_CAPS if c in v)
    return (caps, True) if caps else (_DEFAULT_CAPS, False)


def _ollama_show(show: dict[str, Any] | None) -> tuple[int | None, tuple[str, ...], bool]:
    """Context length and capabilities from an /api/show answer: ``num_ctx`` when the model's
    parameters set it (what Ollama runs it with), else ``model_info["<arch>.context_length"]``;
    and whether the answer listed capabilities."""
    if show is None:
        return None, _DEFAULT_CAPS, False
    ctx = None
    params = show.get("parameters")
    if isinstance(params, str):
        for line in params.splitlines()[:200]:
            k, v = (line.split(None, 1) + ["", ""])[:2]
            # ASCII digits, short: int() refuses "²" and strings past its digit limit
            if k == "num_ctx" and v.strip().isascii() and v.strip().isdigit() and len(v) < 12:
                ctx = _int(int(v.strip()))
    info = show.get("model_info")
    if ctx is None and isinstance(info, dict):
        arch = info.get("general.architecture")
        ctx = _int(info.get(f"{arch}.context_length")) if isinstance(arch, str) else None
        if ctx is None:
            found = [_int(v) for k, v in info.items() if str(k).endswith(".context_length")]
            ctx = next((c for c in found if c), None)
    raw = show.get("capabilities")
    caps: tuple[str, ...] = ()
    if isinstance(raw, list):
        if "completion" in raw:
            caps += ("completion", "chat")
        if "embedding" in raw:
            caps += ("embeddings", "rerank")
        elif "reranking" in raw:  # a cross-encoder (newer Ollama)
            caps += ("rerank",)
        if "vision" in raw and "completion" in raw:
            caps += ("vision",)
        if "insert" in raw and "completion" in raw:  # Ollama's word for fill-in-the-middle
            caps += ("fim",)
    return ctx, caps or _DEFAULT_CAPS, bool(caps)


# -- errors ------------------------------------------------------------------------------------
def error_message(status: int, body: Any) -> str:
    """The upstream's own message from any engine's error shape (OpenAI, vLLM old and new,
    llama.cpp, TGI, Ollama, FastAPI's ``detail``), the text of a plain body (clipped), or
    ``HTTP <status>`` when the body says nothing."""
    msg = _message(body, 0)
    return _clip(msg) if msg else f"HTTP {status}"


def _message(body: Any, depth: int) -> str | None:
    if depth > 3:
        return None
    if isinstance(body, bytes | bytearray):
        body = bytes(body[: MAX_MESSAGE * 4]).decode("utf-8", "replace")
    if isinstance(body, str):
        return _text(body)
    if isinstance(body, list):
        return _message(body[0], depth + 1) if body else None
    if not isinstance(body, dict):
        return None
    err = body.get("error")
    if isinstance(err, dict):
        return _message(err, depth + 1) or _text(err.get("type"))
    if isinstance(err, str) and _text(err):
        return _text(err)  # TGI {"error", "error_type"}, Ollama {"error"}, vLLM's 401
    for key in ("message", "msg", "detail"):
        v = body.get(key)
        if isinstance(v, str) and _text(v):
            return _text(v)
        if key == "detail" and isinstance(v, list):  # FastAPI validation: [{"msg", "loc"}]
            msgs = [m for d in v[:5] if (m := _message(d, depth + 1))]
            if msgs:
                return "; ".join(msgs)
    return None


def stream_error(event: Any) -> str | None:
    """The message of an error met inside an SSE stream (``data: {"error": ...}`` from
    llama.cpp, vLLM, TGI; vLLM's old ``{"object": "error", ...}``; an Anthropic-style
    ``{"type": "error"}``), or None when the event is an ordinary chunk."""
    if not isinstance(event, dict):
        return None
    err = event.get("error")
    if err or event.get("object") == "error" or event.get("type") == "error":
        return _clip(_message(event, 0) or "the engine reported an error")
    return None
