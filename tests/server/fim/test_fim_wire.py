"""Fill-in-the-middle on every protocol, on a real server and the real model: OpenAI's insert
mode (the openai client's ``suffix``), Ollama's ``suffix`` as Continue's Ollama provider sends
it, llama-server's ``/infill`` as llama.vscode sends it; each builds the same tokens the core's
builder lays out; a model without FIM tokens, or an embedding model, is a 400 naming the field."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from app.core.inference.fim import find_fim_tokens
from app.runtimes.worker import interactive
from tests.server.fim.conftest import Fim
from tests.support.infill_prompt import builder_prompt

pytestmark = pytest.mark.model

PREFIX = "def add(a, b):\n    "
SUFFIX = "\n\nprint(add(1, 2))\n"


def post(f: Fim, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{f.root}{path}", json=body, timeout=300)


def built(f: Fim, model: str, prefix: str, suffix: str, **kw: Any) -> list[int]:
    """The prompt the core's builder lays out with the served model's own tokenizer."""
    lm = f.s.call(f.s.service.models._scheduler.get(model))  # type: ignore[attr-defined]
    assert lm is not None, "the model is loaded by a request first"
    return builder_prompt(lm, prefix, suffix, **kw)


def test_openai_insert_mode_with_the_openai_client(fim: Fim) -> None:
    client = openai.OpenAI(base_url=fim.s.base_url, api_key="x", max_retries=0)
    whole = client.completions.create(
        model=fim.keys, prompt=PREFIX, suffix=SUFFIX, max_tokens=8, temperature=0
    )
    assert whole.choices[0].finish_reason in ("stop", "length")
    assert whole.usage is not None
    assert whole.usage.prompt_tokens == len(built(fim, fim.keys, PREFIX, SUFFIX, n_predict=8))
    pieces = client.completions.create(
        model=fim.keys, prompt=PREFIX, suffix=SUFFIX, max_tokens=8, temperature=0, stream=True
    )
    streamed = "".join(c.choices[0].text for c in pieces if c.choices)
    assert streamed == whole.choices[0].text


def test_openai_refuses_echo_and_token_prompts_with_a_suffix(fim: Fim) -> None:
    body = {"model": fim.keys, "prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 2}
    r = post(fim, "/v1/completions", {**body, "echo": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "echo"
    r = post(fim, "/v1/completions", {**body, "prompt": [1, 2, 3]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"


def test_continue_ollama_autocomplete(fim: Fim) -> None:
    # Continue's Ollama provider: /api/show's template decides supportsFim (".Suffix"), then
    # _streamFim posts _getGenerateOptions(options, prefix, suffix) (core/llm/llms/Ollama.ts)
    show = post(fim, "/api/show", {"name": fim.keys}).json()
    assert ".Suffix" in show["template"] and "insert" in show["capabilities"]
    body = {
        "model": fim.keys,
        "prompt": PREFIX,
        "suffix": SUFFIX,
        "options": {
            "temperature": 0.01,
            "num_predict": 8,
            "stop": ["\n\n", "```"],
            "num_ctx": 2048,
        },
        "keep_alive": 1800,
        "stream": True,
    }
    r = post(fim, "/api/generate", body)
    assert r.status_code == 200, r.text
    lines = [json.loads(x) for x in r.text.splitlines() if x.strip()]
    assert not any("error" in x for x in lines) and lines[-1]["done"] is True
    assert lines[-1]["prompt_eval_count"] == len(built(fim, fim.keys, PREFIX, SUFFIX, n_predict=8))


def test_ollama_refuses_what_it_would_drop_beside_a_suffix(fim: Fim) -> None:
    base = {"model": fim.keys, "prompt": PREFIX, "suffix": SUFFIX, "stream": False}
    for extra, param in (({"raw": True}, "raw"), ({"system": "Be brief."}, "system")):
        r = post(fim, "/api/generate", {**base, **extra})
        assert r.status_code == 400 and f"'{param}'" in r.json()["error"], (param, r.text)


def test_twinny_fim_template_through_its_lm_studio_provider(fim: Fim) -> None:
    # Twinny writes the FIM prompt itself (its starcoder template, completion/fim-templates.ts)
    # and posts its LM Studio provider's body (completion/request-body.ts) to /v1/completions:
    # the markers in the text are the model's own tokens, as llama-server reads them
    prompt = f"<fim_prefix>{PREFIX}<fim_suffix>{SUFFIX}<fim_middle>"
    stop = ["<|endoftext|>", "<file_sep>"]  # its STOP_STARCODER
    body = {"model": fim.texts, "prompt": prompt, "stream": True, "temperature": 0.2,
            "max_tokens": 8, "stop": stop}  # fmt: skip
    with httpx.stream("POST", f"{fim.root}/v1/completions", json=body, timeout=300) as r:
        assert r.status_code == 200
        events = [x[6:] for x in r.iter_lines() if x.startswith("data: ")]
    assert events[-1] == "[DONE]" and all("error" not in json.loads(e) for e in events[:-1])
    whole = post(fim, "/v1/completions", {**body, "stream": False}).json()
    lm = fim.s.call(fim.s.service.models._scheduler.get(fim.texts))  # type: ignore[attr-defined]
    as_tokens = lm.tokenize(prompt, add_special=True, parse_special=True)
    marks = find_fim_tokens(lm)
    assert marks is not None and [marks.pre, marks.suf, marks.mid] == [
        t for t in as_tokens if t in (marks.pre, marks.suf, marks.mid)
    ]
    # the model read the markers as its tokens (as text they are a dozen tokens more)
    as_text = lm.tokenize(prompt, add_special=True, parse_special=False)
    assert whole["usage"]["prompt_tokens"] == len(as_tokens) < len(as_text)


def llama_vscode_body(prefix: str, suffix: str, chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """llama.vscode's createRequestPayload(false, ...) (src/llama-server.ts)."""
    return {
        "input_prefix": prefix,
        "input_suffix": suffix,
        "input_extra": chunks,
        "prompt": "    return",
        "n_predict": 16,
        "top_k": 40,
        "top_p": 0.99,
        "stream": False,
        "samplers": ["top_k", "top_p", "infill"],
        "cache_prompt": True,
        "n_indent": 4,
        "t_max_prompt_ms": 500,
        "t_max_predict_ms": 1000,
    }


CHUNKS = [{"text": "import math\n\nX = 1\n", "time": 1700000000000, "filename": "util.py"}]


def test_llama_vscode_infill_and_its_warm_up(fim: Fim) -> None:
    # the warm-up: no prefix, nothing to predict (createRequestPayload(true, ...))
    warm = {
        "input_prefix": "",
        "input_suffix": "",
        "input_extra": CHUNKS,
        "prompt": "",
        "n_predict": 0,
        "samplers": [],
        "cache_prompt": True,
        "t_max_prompt_ms": 500,
        "t_max_predict_ms": 1,
    }
    r = post(fim, "/infill", warm)
    assert r.status_code == 200, r.text
    assert r.json()["content"] == "" and r.json()["tokens_predicted"] == 0
    # no model named: the default model answers, as llama-server's one model does
    r = post(fim, "/infill", llama_vscode_body("def f(x):\n", "\n", CHUNKS))
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["stop"] is True and out["model"] == fim.keys
    assert out["stop_type"] in ("eos", "limit", "word") and isinstance(out["content"], str)
    assert {"prompt_n", "predicted_n", "predicted_ms"} <= set(out["timings"])
    want = built(
        fim,
        fim.keys,
        "def f(x):\n",
        "\n",
        extra=[("util.py", CHUNKS[0]["text"])],
        cursor="    return",
        n_predict=16,
    )
    assert out["tokens_evaluated"] == len(want)


def test_infill_streams_llama_server_events(fim: Fim) -> None:
    body = {**llama_vscode_body(PREFIX, SUFFIX, []), "stream": True, "model": fim.texts}
    with httpx.stream("POST", f"{fim.root}/infill", json=body, timeout=300) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: ")]
    assert events and all("error" not in e for e in events)
    *pieces, last = events
    assert all(e["stop"] is False for e in pieces) and last["stop"] is True
    assert last["content"] == "" and last["tokens_predicted"] >= len(pieces)
    assert "[DONE]" not in json.dumps(events)


def test_a_late_answer_stops_at_a_new_line(fim: Fim) -> None:
    body = {
        "model": fim.keys,
        "input_prefix": "# a list of fruit, one a line\n",
        "input_suffix": "",
        "n_predict": 48,
        "temperature": 0,
        "t_max_predict_ms": 1,  # late from the first token: the first new line ends it
    }
    out = post(fim, "/infill", body).json()
    if out["stop_type"] == "limit" and out["tokens_predicted"] < 48:
        assert out["content"].endswith("\n") and out["content"].count("\n") == 1
    else:  # the model ended (or ran out) before any new line
        assert "\n" not in out["content"].rstrip("\n")


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 2}, "suffix"),
        (
            "/api/generate",
            {"prompt": PREFIX, "suffix": SUFFIX, "stream": False},
            "suffix",
        ),
        ("/infill", {"input_prefix": PREFIX, "input_suffix": SUFFIX}, "input_suffix"),
    ],
)
def test_no_fim_tokens_is_a_400_on_every_protocol(
    fim: Fim, path: str, body: dict[str, Any], param: str
) -> None:
    for model, word in ((fim.plain, "fill-in-the-middle tokens"), (fim.embed, "embedding")):
        r = post(fim, path, {**body, "model": model})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        if isinstance(err, dict):  # OpenAI's shape (and /infill's)
            assert err["param"] == param and err["type"] == "invalid_request_error"
            assert word in err["message"]
        else:  # Ollama's: the message alone
            assert word in err


def test_capabilities_name_fill_in_the_middle(fim: Fim) -> None:
    models = {m["id"]: m for m in httpx.get(f"{fim.root}/v1/models", timeout=60).json()["data"]}
    assert "fim" in models[fim.keys]["capabilities"]
    assert "fim" in models[fim.texts]["capabilities"]
    assert "fim" not in models[fim.plain]["capabilities"]
    plain = post(fim, "/api/show", {"model": fim.plain}).json()
    assert "insert" not in plain["capabilities"] and ".Suffix" not in plain["template"]


def test_an_editor_completion_is_interactive_however_long_its_answer(fim: Fim) -> None:
    """An infill on each protocol reaches the model's queue as interactive (read before other
    requests' long prompts) even with a long answer allowed; a plain completion of that length
    does not."""
    loads = post(fim, "/v1/completions", {"model": fim.keys, "prompt": "x", "max_tokens": 1})
    assert loads.status_code == 200, loads.text
    lm = fim.s.call(fim.s.service.models._scheduler.get(fim.keys))  # type: ignore[attr-defined]
    seen: list[Any] = []
    real = lm.submit

    def submit(request: Any, *args: Any, **kw: Any) -> Any:
        seen.append(request)
        return real(request, *args, **kw)

    lm.submit = submit
    try:
        late = {"t_max_predict_ms": 1}  # a long answer allowed, cut at its first new line
        r = post(fim, "/infill", {"model": fim.keys, "input_prefix": PREFIX,
                                  "input_suffix": SUFFIX, "n_predict": 200, **late})  # fmt: skip
        assert r.status_code == 200, r.text
        body = {"model": fim.keys, "prompt": PREFIX, "max_tokens": 65, "stop": ["\n"]}
        assert post(fim, "/v1/completions", {**body, "suffix": SUFFIX}).status_code == 200
        ollama = {"model": fim.keys, "prompt": PREFIX, "suffix": SUFFIX, "stream": False,
                  "options": {"num_predict": 65, "stop": ["\n"]}}  # fmt: skip
        assert post(fim, "/api/generate", ollama).status_code == 200
        assert post(fim, "/v1/completions", body).status_code == 200  # no suffix
    finally:
        del lm.submit
    assert [interactive(r) for r in seen] == [True, True, True, False], seen
