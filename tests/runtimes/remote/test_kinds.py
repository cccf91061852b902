"""Remote engines' quirks (app/runtimes/remote/kinds.py) on recorded answers: the files under
tests/fixtures/engines/ (README there says which are real and which transcribed from source),
plus one probe of a real Hearth server on a loopback port."""

from __future__ import annotations

import json
import random
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from app.core.gateway.providers.base import STATES, Answer, RemoteModel
from app.core.gateway.providers.store import KINDS
from app.runtimes.remote import kinds
from app.runtimes.remote.kinds import (
    DETECT_PATHS,
    MODELS,
    detect,
    error_message,
    followups,
    interpret,
    probe_paths,
    root_of,
    stream_error,
)

ENGINES = Path(__file__).resolve().parents[2] / "fixtures" / "engines"
CHAT = ("completion", "chat")
EMBED = ("embeddings", "rerank")


def rec(kind: str, name: str) -> Any:
    return json.loads((ENGINES / kind / f"{name}.json").read_text())


def ok(kind: str, name: str) -> Answer:
    return Answer(200, rec(kind, name))


NOT_FOUND = Answer(404, "404 page not found")
EMPTY_200 = Answer(200, "")  # vLLM, SGLang and TGI answer /health with an empty 200


def detect_round(**paths: Answer) -> dict[str, Answer]:
    """What a detection probe got: every DETECT_PATH, 404 unless given (key "/x" as x_)."""
    given = {
        ("/" + k.rstrip("_").replace("_", "/") if k != MODELS else k): v for k, v in paths.items()
    }
    return {p: given.get(p, NOT_FOUND) for p in DETECT_PATHS}


# -- detection ---------------------------------------------------------------------------------
def test_root_and_paths() -> None:
    assert root_of("http://10.0.0.5:8000/v1") == "http://10.0.0.5:8000"
    assert root_of("http://h:8000/v1/") == "http://h:8000"
    assert root_of("https://h/openai/v1") == "https://h/openai"
    assert root_of("http://h:11434") == "http://h:11434"
    assert root_of(None) == ""  # type: ignore[arg-type]
    assert DETECT_PATHS[0] == MODELS and {"/health", "/props", "/api/version", "/info"} <= set(
        DETECT_PATHS
    )
    for k in KINDS:
        assert probe_paths(k)[0] == MODELS
    assert probe_paths("llama.cpp") == (MODELS, "/health", "/props")
    assert "/info" in probe_paths("tgi") and "/api/tags" in probe_paths("ollama")
    assert probe_paths("nonsense") == DETECT_PATHS


@pytest.mark.parametrize(
    ("kind", "answers"),
    [
        ("vllm", detect_round(models=ok("vllm", "models"), health=EMPTY_200)),
        ("sglang", detect_round(models=ok("sglang", "models"), health=EMPTY_200)),
        (
            "llama.cpp",
            detect_round(
                models=ok("llama.cpp", "models"),
                health=ok("llama.cpp", "health"),
                props=ok("llama.cpp", "props"),
            ),
        ),
        (
            "ollama",
            detect_round(models=ok("ollama", "models"), api_version=ok("ollama", "version")),
        ),
        (
            "tgi",
            detect_round(models=ok("tgi", "models"), health=EMPTY_200, info=ok("tgi", "info")),
        ),
        ("tgi", detect_round(models=ok("tgi", "models"), info=ok("tgi", "info_2x"))),
        (
            "hearth",
            detect_round(
                models=ok("hearth", "models"),
                health=ok("hearth", "health"),
                api_version=ok("hearth", "api_version"),
            ),
        ),
        ("openai", detect_round(models=ok("openai", "models"))),
        # llama-cpp-python's server: an OpenAI list owned by "me", 404 (FastAPI) elsewhere
        (
            "openai",
            {p: Answer(404, rec("llama-cpp-python", "not_found")) for p in DETECT_PATHS}
            | {MODELS: ok("llama-cpp-python", "models")},
        ),
    ],
)
def test_detect_each_engine(kind: str, answers: dict[str, Answer]) -> None:
    assert detect(answers) == kind


def test_detect_without_the_model_list() -> None:
    # Hearth with no model imported yet, or behind a key: its /health and /api/version say so
    assert (
        detect(
            detect_round(
                models=Answer(200, {"object": "list", "data": []}), health=ok("hearth", "health")
            )
        )
        == "hearth"
    )
    assert (
        detect(detect_round(models=Answer(401, {}), api_version=ok("hearth", "api_version")))
        == "hearth"
    )
    # Ollama's /api/version alone (Hearth's has a "hearth" key; Ollama's has not)
    assert (
        detect(detect_round(models=Answer(401, {}), api_version=ok("ollama", "version")))
        == "ollama"
    )
    # llama-server still loading: every path is its 503 "Loading model"
    loading = Answer(503, rec("llama.cpp", "health_loading"))
    assert detect(detect_round(models=loading, health=loading, props=loading)) == "llama.cpp"
    # llama-server behind a key: /health is public, /props tells it
    assert (
        detect(
            detect_round(
                models=Answer(401, rec("llama.cpp", "error_401")), props=ok("llama.cpp", "props")
            )
        )
        == "llama.cpp"
    )
    # nothing answered
    assert detect({p: Answer(0, "connection refused") for p in DETECT_PATHS}) == "openai"
    assert detect({}) == "openai"


# -- interpret: state, models, context lengths ---------------------------------------------------
def test_vllm_and_sglang_context_from_max_model_len() -> None:
    state, models, err = interpret("vllm", {MODELS: ok("vllm", "models")})
    assert (state, err) == ("ready", None)
    assert models == (RemoteModel("Qwen/Qwen2.5-7B-Instruct", 32768, CHAT),)
    state, models, _ = interpret("sglang", {MODELS: ok("sglang", "models")})
    assert state == "ready" and models == (RemoteModel("meta-llama/Llama-3.1-8B-Instruct", 131072),)


def test_llama_cpp_context_and_loading() -> None:
    answers = {
        p: ok("llama.cpp", n)
        for p, n in ((MODELS, "models"), ("/health", "health"), ("/props", "props"))
    }
    state, models, err = interpret("llama.cpp", answers)
    # recorded from a real llama-server run with -c 1024 --alias smollm2: meta.n_ctx (the
    # context it runs with: 1024), not n_ctx_train (8192)
    assert (state, err) == ("ready", None)
    # /props says "modalities": {"vision": false}: a stated no to images
    assert models == (RemoteModel("smollm2", 1024, stated=True),)
    assert models[0].refuses_images()
    # an older server without meta.n_ctx: /props' n_ctx, then n_ctx_train
    body = rec("llama.cpp", "models")
    del body["data"][0]["meta"]["n_ctx"]
    props = rec("llama.cpp", "props")
    props["default_generation_settings"]["n_ctx"] = 2048
    _, models, _ = interpret("llama.cpp", {MODELS: Answer(200, body), "/props": Answer(200, props)})
    assert models[0].context_length == 2048
    _, models, _ = interpret("llama.cpp", {MODELS: Answer(200, body)})
    assert models[0].context_length == 8192
    assert not models[0].stated and not models[0].refuses_images()  # no /props: not said
    props["modalities"]["vision"] = True
    _, models, _ = interpret("llama.cpp", {MODELS: Answer(200, body), "/props": Answer(200, props)})
    assert "vision" in models[0].capabilities and not models[0].refuses_images()
    # loading: 503 on /v1/models and /health
    loading = Answer(503, rec("llama.cpp", "health_loading"))
    assert interpret("llama.cpp", {MODELS: loading, "/health": loading}) == (
        "starting",
        (),
        "Loading model",
    )
    assert interpret("vllm", {MODELS: loading})[0] == "starting"


def test_llama_cpp_router_lists_every_model() -> None:
    state, models, _ = interpret(
        "llama.cpp", {MODELS: ok("llama.cpp", "router_models"), "/props": ok("llama.cpp", "props")}
    )
    # two models: /props' single n_ctx is not spread over both
    assert state == "ready"
    # each entry's architecture.input_modalities says whether it takes images
    assert models == (
        RemoteModel("qwen2.5-7b", 16384, stated=True),
        RemoteModel("gemma-3-4b", None, CHAT + ("vision",), stated=True),
    )
    assert models[0].refuses_images() and not models[1].refuses_images()


def test_ollama_show_followups_and_details() -> None:
    first = {MODELS: ok("ollama", "models"), "/api/tags": ok("ollama", "tags")}
    fu = followups("ollama", first)
    assert fu == [
        ("show:llama3.2:latest", "POST", "/api/show", {"model": "llama3.2:latest"}),
        ("show:nomic-embed-text:latest", "POST", "/api/show", {"model": "nomic-embed-text:latest"}),
    ]
    answers = first | {
        "show:llama3.2:latest": ok("ollama", "show_llama3.2"),
        "show:nomic-embed-text:latest": ok("ollama", "show_nomic-embed-text"),
    }
    assert followups("ollama", answers) == []
    state, models, _ = interpret("ollama", answers)
    assert state == "ready"
    assert models == (
        # model_info["llama.context_length"]; capabilities ["completion", "tools"]
        RemoteModel("llama3.2:latest", 131072, CHAT, stated=True),
        # its parameters set num_ctx 8192: what Ollama runs it with; ["embedding"]
        RemoteModel("nomic-embed-text:latest", 8192, EMBED, stated=True),
    )
    assert models[0].refuses_images()  # capabilities listed, "vision" not among them
    # a cross-encoder ("reranking", newer Ollama) reranks only
    rr = {
        "capabilities": ["reranking"],
        "model_info": {"general.architecture": "bert", "bert.context_length": 512},
    }
    _, models, _ = interpret("ollama", first | {"show:llama3.2:latest": Answer(200, rr)})
    assert models[0] == RemoteModel("llama3.2:latest", 512, ("rerank",), stated=True)
    # "vision" with "completion" (llava, gemma3): takes images
    vl = {"capabilities": ["completion", "vision"], "model_info": {}}
    _, models, _ = interpret("ollama", first | {"show:llama3.2:latest": Answer(200, vl)})
    assert models[0].capabilities == CHAT + ("vision",) and not models[0].refuses_images()
    # "insert" (a FIM model: /api/generate takes a suffix) fills in the middle
    ins = {"capabilities": ["completion", "insert"], "model_info": {}}
    _, models, _ = interpret("ollama", first | {"show:llama3.2:latest": Answer(200, ins)})
    assert models[0].capabilities == CHAT + ("fim",)
    # no show answer (failed or not asked): the model is still listed, context unknown
    _, models, _ = interpret(
        "ollama", first | {"show:llama3.2:latest": Answer(500, {"error": "x"})}
    )
    assert [m.context_length for m in models] == [None, None]
    assert not any(m.stated or m.refuses_images() for m in models)  # nothing said: forwarded


def test_ollama_followups_after_detection_and_cap() -> None:
    # a detection round has no /api/tags: it is asked, and /api/show for the listed ids
    fu = followups(
        "ollama", detect_round(models=ok("ollama", "models"), api_version=ok("ollama", "version"))
    )
    assert fu[0] == ("/api/tags", "GET", "/api/tags", None)
    assert [f[0] for f in fu[1:]] == ["show:llama3.2:latest", "show:nomic-embed-text:latest"]
    many = {"/api/tags": Answer(200, {"models": [{"name": f"m{i}:latest"} for i in range(500)]})}
    assert (
        len(followups("ollama", many | {MODELS: Answer(200, {"data": []})}))
        == kinds.MAX_FOLLOWUPS
        == 64
    )
    # other kinds: only their probe paths not answered yet
    assert followups("vllm", {MODELS: ok("vllm", "models")}) == []
    assert followups("tgi", {MODELS: ok("tgi", "models")}) == [("/info", "GET", "/info", None)]


def test_old_ollama_without_v1_models() -> None:
    answers = {MODELS: NOT_FOUND, "/api/tags": ok("ollama", "tags")}
    state, models, _ = interpret("ollama", answers)
    assert state == "ready" and [m.id for m in models] == [
        "llama3.2:latest",
        "nomic-embed-text:latest",
    ]


def test_tgi_context_from_info() -> None:
    state, models, _ = interpret("tgi", {MODELS: ok("tgi", "models"), "/info": ok("tgi", "info")})
    assert state == "ready" and models == (RemoteModel("mistralai/Mistral-7B-Instruct-v0.3", 8192),)
    info = rec("tgi", "info")
    del info["max_total_tokens"]
    _, models, _ = interpret("tgi", {MODELS: ok("tgi", "models"), "/info": Answer(200, info)})
    assert models[0].context_length == 8191  # max_input_tokens
    _, models, _ = interpret("tgi", {MODELS: ok("tgi", "models"), "/info": ok("tgi", "info_2x")})
    assert models[0].context_length == 2048
    assert interpret("tgi", {MODELS: Answer(503, rec("tgi", "error_503"))}) == (
        "starting",
        (),
        "Model is overloaded",
    )


def test_hearth_lists_context_and_capabilities() -> None:
    state, models, _ = interpret("hearth", {MODELS: ok("hearth", "models")})
    assert state == "ready"
    assert models == (
        RemoteModel("all-minilm-l6-v2-q8_0", 512, EMBED, stated=True),
        RemoteModel("smollm2-135m-instruct.q4_1", 8192, CHAT, stated=True),
    )


def test_openai_and_llama_cpp_python() -> None:
    _, models, _ = interpret("openai", {MODELS: ok("openai", "models")})
    assert models == (RemoteModel("gpt-4o-mini"), RemoteModel("text-embedding-3-small"))
    _, models, _ = interpret("openai", {MODELS: ok("llama-cpp-python", "models")})
    assert [m.id for m in models] == [m["id"] for m in rec("llama-cpp-python", "models")["data"]]


def test_states_unreachable_unauthorized_error() -> None:
    for kind in KINDS:
        s, m, e = interpret(kind, {MODELS: Answer(0, "Cannot connect to host 10.0.0.5:8000")})
        assert (s, m, e) == ("unreachable", (), "Cannot connect to host 10.0.0.5:8000")
        assert interpret(kind, {})[0] == "unreachable"
        s, _, e = interpret(kind, {MODELS: Answer(401, rec("openai", "error_401"))})
        assert s == "unauthorized" and e is not None and e.startswith("Incorrect API key provided")
        assert (
            interpret(kind, {MODELS: Answer(403, {"error": "Unauthorized"})})[0] == "unauthorized"
        )
        s, _, e = interpret(kind, {MODELS: Answer(500, "Internal Server Error")})
        assert s == "error" and e == "GET /models: HTTP 500: Internal Server Error"
        s, _, e = interpret(kind, {MODELS: Answer(200, "<html>captive portal</html>")})
        assert s == "error" and e and "not answer a model list" in e
        assert interpret(kind, {MODELS: Answer(200, {"object": "list", "data": []})}) == (
            "ready",
            (),
            None,
        )
    assert set(kinds._PROBE) == set(KINDS)


# -- errors ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("status", "kind", "name", "starts"),
    [
        (400, "vllm", "error_400_old", "This model's maximum context length is 32768"),
        (400, "vllm", "error_400_new", "This model's maximum context length is 32768"),
        (404, "vllm", "error_404_old", "The model `qwen` does not exist."),
        (400, "sglang", "error_400", "The input (140000 tokens)"),
        (400, "llama.cpp", "error_400", "request (5000 tokens) exceeds the available context"),
        (401, "llama.cpp", "error_401", "Invalid API Key"),
        (503, "llama.cpp", "health_loading", "Loading model"),
        (422, "tgi", "error_422", "Input validation error: `inputs` tokens"),
        (404, "ollama", "error_404", 'model "llama9" not found'),
        (404, "ollama", "error_404_openai", 'model "llama9" not found'),
        (401, "openai", "error_401", "Incorrect API key provided"),
        (429, "openai", "error_429", "Rate limit reached"),
        (404, "hearth", "error_404", "model 'nope' not found"),
        (
            400,
            "llama-cpp-python",
            "error_400_context",
            "This model's maximum context length is 2048",
        ),
        (500, "llama-cpp-python", "error_500_validation", "1 validation error"),
        (404, "llama-cpp-python", "not_found", "Not Found"),
    ],
)
def test_error_message_each_shape(status: int, kind: str, name: str, starts: str) -> None:
    msg = error_message(status, rec(kind, name))
    assert msg.startswith(starts) and len(msg) <= kinds.MAX_MESSAGE + 1


def test_error_message_plain_and_empty() -> None:
    assert error_message(502, "Bad Gateway\n") == "Bad Gateway"
    long = error_message(500, "x" * 5000)
    assert long == "x" * 300 + "…"
    for empty in (None, "", "   ", {}, [], {"error": None}, {"error": {}}, 12, 1.5, True):
        assert error_message(418, empty) == "HTTP 418"
    assert (
        error_message(422, {"detail": [{"loc": ["body", "x"], "msg": "field required"}]})
        == "field required"
    )
    assert error_message(500, [{"error": "first"}]) == "first"
    assert (
        error_message(400, {"error": {"type": "invalid_request_error"}}) == "invalid_request_error"
    )
    assert error_message(400, b"bytes body") == "bytes body"


def test_stream_errors() -> None:
    assert (
        stream_error(rec("llama.cpp", "stream_error"))
        == "input (5000 tokens) is larger than the max context size (4096 tokens). skipping"
    )
    assert stream_error(rec("vllm", "stream_error")) == "Internal server error"
    assert stream_error(rec("vllm", "error_400_old")).startswith("This model's maximum")  # type: ignore[union-attr]
    assert stream_error(rec("tgi", "stream_error")).startswith("Request failed during generation")  # type: ignore[union-attr]
    assert (
        stream_error(
            {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
        )
        == "Overloaded"
    )
    assert stream_error({"error": {}}) is None  # an empty error field is no error
    chunk = {
        "id": "c",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": "hi"}}],
    }
    for ordinary in (chunk, chunk | {"error": None}, "[DONE]", None, [], 3, {"choices": []}):
        assert stream_error(ordinary) is None


# -- odd bodies never raise ----------------------------------------------------------------------
ODD: list[Any] = [
    None,
    "",
    "text",
    0,
    -1,
    2**70,
    1.5,
    True,
    [],
    [None],
    [1, "a"],
    {},
    {"data": None},
    {"data": "x"},
    {"data": [None, 1, "a", [], {}]},
    {"data": [{"id": 5}, {"id": ""}, {"id": "a\nb"}]},
    {"data": [{"id": "m", "max_model_len": "4096", "meta": [], "capabilities": "chat"}]},
    {"data": [{"id": "m", "max_model_len": True, "context_length": -3, "meta": {"n_ctx": 1.5}}]},
    {"models": None},
    {"models": [None, {"name": 3}, {"name": "ok"}]},
    {"default_generation_settings": []},
    {"default_generation_settings": {"n_ctx": "big"}},
    {"model_info": [], "capabilities": None, "parameters": 7},
    {
        "model_info": {"general.architecture": 3, "x.context_length": "1"},
        "parameters": "num_ctx x\nnum_ctx",
    },
    {"parameters": "num_ctx ²"},
    {"parameters": "num_ctx " + "9" * 5000},
    {"parameters": "num_ctx\t4096\nnum_ctx"},
    {"error": [], "message": {}, "detail": {}},
    {"error": {"message": ["a"]}},
    {"object": "error"},
    {"router": "text-generation-router", "max_total_tokens": "8192"},
]


def test_odd_bodies_never_raise() -> None:
    paths = (*DETECT_PATHS, "/api/tags", "show:m", "show:ok")
    for body in ODD:
        for status in (0, 200, 401, 404, 503):
            answers = {p: Answer(status, body) for p in paths}
            k = detect(answers)
            assert k in KINDS
            for kind in (*KINDS, "nonsense"):
                state, models, err = interpret(kind, answers)
                assert state in STATES and all(isinstance(m, RemoteModel) for m in models)
                assert err is None or isinstance(err, str)
                for key, method, path, _ in followups(kind, answers):
                    assert (
                        isinstance(key, str) and method in ("GET", "POST") and path.startswith("/")
                    )
            assert isinstance(error_message(status, body), str)
            stream_error(body)
    # odd side answers next to a good model list: /props, /info, /health, /api/show
    listed = Answer(200, {"data": [{"id": "m"}, {"id": "ok"}]})
    for body in ODD:
        side = {p: Answer(200, body) for p in paths if p != MODELS}
        for kind in KINDS:
            state, models, _ = interpret(kind, side | {MODELS: listed})
            assert state in ("ready", "starting") and [m.id for m in models] in (["m", "ok"], [])
    # answers that are not even Answers
    weird: Any = {MODELS: "nope", "/health": (1,), "/props": None}
    assert detect(weird) == "openai" and interpret("llama.cpp", weird)[0] == "unreachable"
    assert followups("ollama", weird) == [("/api/tags", "GET", "/api/tags", None)]


def test_bad_ids_are_dropped_and_duplicates_once() -> None:
    body = {
        "data": [
            {"id": "A/Model"},
            {"id": "A/Model"},
            {"id": " pad"},
            {"id": "x" * 600},
            {"id": "a\x00b"},
            {"id": "ok"},
        ]
    }
    _, models, _ = interpret("openai", {MODELS: Answer(200, body)})
    assert [m.id for m in models] == ["A/Model", "ok"]  # case kept


# -- a real Hearth on a loopback port --------------------------------------------------------------
def test_a_real_hearth_is_detected_and_read(
    tmp_path: Path, smollm2_path: Path, embedding_gguf: Path
) -> None:
    from tests.conftest import serving

    with serving(tmp_path, smollm2_path, embedding_gguf) as s:
        root = root_of(s.base_url)
        assert root == s.root

        def get(path: str) -> Answer:
            url = s.base_url + "/models" if path == MODELS else root + path
            try:
                with urllib.request.urlopen(url, timeout=30) as r:
                    return Answer(r.status, json.loads(r.read()))
            except urllib.error.HTTPError as e:
                raw = e.read()
                try:
                    return Answer(e.code, json.loads(raw))
                except ValueError:
                    return Answer(e.code, raw.decode("utf-8", "replace"))

        answers = {p: get(p) for p in DETECT_PATHS}
        assert detect(answers) == "hearth"
        assert followups("hearth", answers) == []
        state, models, err = interpret("hearth", answers)
        assert (state, err) == ("ready", None)
        by_id = {m.id: m for m in models}
        assert by_id[s.model_id].capabilities == CHAT and by_id[s.model_id].context_length
        emb = next(m for m in models if m.id != s.model_id)
        assert emb.capabilities == EMBED and emb.context_length == 512


def test_only_positive_integers_are_context_lengths() -> None:
    for bad in (True, "4096", 4096.0, 0, -1, 2**40, None, [4096]):
        body = {"data": [{"id": "m", "max_model_len": bad}]}
        assert interpret("vllm", {MODELS: Answer(200, body)})[1] == (RemoteModel("m", None),)
    body = {"data": [{"id": "m", "max_model_len": 4096}]}
    assert interpret("vllm", {MODELS: Answer(200, body)})[1] == (RemoteModel("m", 4096),)


def _random_json(rng: random.Random, depth: int = 0) -> Any:
    """JSON built from the keys and values the engines use, nested at random."""
    keys = [
        "data",
        "id",
        "owned_by",
        "meta",
        "n_ctx",
        "n_ctx_train",
        "max_model_len",
        "error",
        "message",
        "detail",
        "models",
        "name",
        "model_info",
        "capabilities",
        "parameters",
        "default_generation_settings",
        "router",
        "max_total_tokens",
        "model_id",
        "version",
        "loaded",
        "loading",
        "hearth",
        "object",
        "type",
        "general.architecture",
        "llama.context_length",
        "context_length",
        "msg",
    ]
    leaves = [
        None,
        True,
        0,
        -5,
        2**40,
        4096,
        1.5,
        "",
        "x",
        "llamacpp",
        "vllm",
        "hearth",
        "error",
        "completion",
        "embedding",
        "num_ctx 4096",
        "text-generation-router",
        "²",
    ]
    r = rng.random()
    if depth > 4 or r < 0.35:
        return rng.choice(leaves)
    if r < 0.55:
        return [_random_json(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(keys): _random_json(rng, depth + 1) for _ in range(rng.randrange(5))}


def test_random_bodies_never_raise() -> None:
    rng = random.Random(11)
    paths = (*DETECT_PATHS, "/api/tags", "show:x", "show:llamacpp")
    for _ in range(1500):
        answers = {p: Answer(rng.choice((0, 200, 200, 401, 503)), _random_json(rng)) for p in paths}
        assert detect(answers) in KINDS
        for kind in KINDS:
            assert interpret(kind, answers)[0] in STATES
            followups(kind, answers)
        body = _random_json(rng)
        assert isinstance(error_message(500, body), str)
        stream_error(body)
