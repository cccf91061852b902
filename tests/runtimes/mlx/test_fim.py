"""Fill-in-the-middle on MLX, for real (mlx[cpu] here), on tiny models the tests build: one
whose tokenizer has StarCoder's FIM tokens (<fim_prefix>, <fim_suffix>, <fim_middle>,
<file_sep>) and one without. The library says which can fill; OpenAI's ``suffix``, Ollama's
``suffix`` (as Continue's Ollama provider sends it) and llama-server's ``/infill`` (as
llama.vscode sends it) each hand the engine the prompt the core's builder lays out with the
model's own token ids; the model without them is a 400 on each."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.core.inference.fim import find_fim_tokens
from tests.conftest import Served, serving
from tests.support.infill_prompt import builder_prompt
from tests.support.mlx_model import FIM_SPECIALS

pytest.importorskip("mlx_lm", reason="MLX runtime tests need mlx-lm (and mlx[cpu] on Linux)")

PREFIX = "def add(a, b):\n    "
SUFFIX = "\n\nprint(add(1, 2))\n"
CHUNKS = [{"text": "import math\n\nX = 1\n", "time": 1700000000000, "filename": "util.py"}]


@dataclass
class MlxFim:
    s: Served
    fim: str  # the model id whose tokenizer has the FIM tokens
    plain: str  # the one without

    def post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        return httpx.post(f"{self.s.root}{path}", json=body, timeout=300)


@pytest.fixture(scope="module")
def mlx_fim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlxFim]:
    from tests.support.mlx_model import build_tiny_mlx_model

    root = tmp_path_factory.mktemp("mlxfim")
    fim = build_tiny_mlx_model(root / "Tiny-FIM-MLX", fim=True)
    plain = build_tiny_mlx_model(root / "Tiny-MLX")
    with serving(tmp_path_factory.mktemp("mlxfimserved"), fim, plain) as s:
        ids = {
            str(Path(m.model.path).resolve()): m.model.id
            for m in s.service.models.all()  # type: ignore[attr-defined]
        }
        yield MlxFim(s, fim=ids[str(fim.resolve())], plain=ids[str(plain.resolve())])


def test_the_library_and_both_apis_say_which_mlx_model_fills_in_the_middle(
    mlx_fim: MlxFim,
) -> None:
    models = httpx.get(f"{mlx_fim.s.root}/v1/models", timeout=60).json()["data"]
    caps = {m["id"]: m["capabilities"] for m in models}
    assert "fim" in caps[mlx_fim.fim] and "fim" not in caps[mlx_fim.plain]
    show = mlx_fim.post("/api/show", {"model": mlx_fim.fim}).json()
    assert "insert" in show["capabilities"] and ".Suffix" in show["template"]
    plain = mlx_fim.post("/api/show", {"model": mlx_fim.plain}).json()
    assert "insert" not in plain["capabilities"] and ".Suffix" not in plain["template"]


def test_each_protocol_sends_the_engine_the_builders_prompt(mlx_fim: MlxFim) -> None:
    s = mlx_fim.s
    # loaded by a first request; then every prompt it is handed is recorded
    r = mlx_fim.post("/v1/completions", {"model": mlx_fim.fim, "prompt": "hi", "max_tokens": 1})
    assert r.status_code == 200, r.text
    lm = s.call(s.service.models._scheduler.get(mlx_fim.fim))  # type: ignore[attr-defined]
    assert lm is not None
    sent: list[list[int]] = []
    submit = lm.submit

    def recording(request: Any) -> Any:
        sent.append(list(request.prompt_tokens))
        return submit(request)

    lm.submit = recording
    fim = find_fim_tokens(lm)
    assert fim is not None, "the tokenizer's FIM tokens are found by their texts"
    ids = {t: lm.tokenize(t, add_special=False, parse_special=True) for t in FIM_SPECIALS}
    assert all(len(v) == 1 for v in ids.values()), ids
    want_ids = ("<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<file_sep>")
    assert (fim.pre, fim.suf, fim.mid, fim.sep) == tuple(ids[t][0] for t in want_ids)

    def built(prefix: str, suffix: str, **kw: Any) -> list[int]:
        return builder_prompt(lm, prefix, suffix, **kw)

    try:
        # OpenAI's insert mode
        body = {"model": mlx_fim.fim, "prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 8}
        r = mlx_fim.post("/v1/completions", {**body, "temperature": 0})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] == len(sent[-1])
        assert sent[-1] == built(PREFIX, SUFFIX, n_predict=8)
        # Continue's Ollama provider (core/llm/llms/Ollama.ts: _getGenerateOptions)
        options = {"temperature": 0.01, "num_predict": 8, "stop": ["\n\n"], "num_ctx": 1024}
        r = mlx_fim.post(
            "/api/generate",
            {"model": mlx_fim.fim, "prompt": PREFIX, "suffix": SUFFIX, "options": options},
        )
        assert r.status_code == 200, r.text
        lines = [json.loads(x) for x in r.text.splitlines() if x.strip()]
        assert not any("error" in x for x in lines) and lines[-1]["done"] is True
        assert sent[-1] == built(PREFIX, SUFFIX, n_predict=8)
        # llama.vscode's /infill, with another file as repository context
        r = mlx_fim.post(
            "/infill",
            {
                "model": mlx_fim.fim,
                "input_prefix": "def f(x):\n",
                "input_suffix": "\n",
                "input_extra": CHUNKS,
                "prompt": "    return",
                "n_predict": 16,
                "top_k": 40,
                "top_p": 0.99,
                "samplers": ["top_k", "top_p", "infill"],
                "cache_prompt": True,
                "t_max_prompt_ms": 500,
                "t_max_predict_ms": 1000,
            },
        )
        assert r.status_code == 200, r.text
        want = built(
            "def f(x):\n",
            "\n",
            extra=[("util.py", CHUNKS[0]["text"])],
            cursor="    return",
            n_predict=16,
        )
        assert sent[-1] == want and r.json()["tokens_evaluated"] == len(want)
        # the other file, then the file being edited, each after a separator (llama-server's)
        assert want.count(fim.sep) == 2
    finally:
        lm.submit = submit
    for tokens in sent:
        assert {fim.pre, fim.suf, fim.mid} <= set(tokens)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 4}),
        ("/api/generate", {"prompt": PREFIX, "suffix": SUFFIX, "stream": False}),
        ("/infill", {"input_prefix": PREFIX, "input_suffix": SUFFIX}),
    ],
)
def test_an_mlx_model_without_fim_tokens_is_a_400(
    mlx_fim: MlxFim, path: str, body: dict[str, Any]
) -> None:
    r = mlx_fim.post(path, {**body, "model": mlx_fim.plain})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert "fill-in-the-middle tokens" in (err["message"] if isinstance(err, dict) else err)
