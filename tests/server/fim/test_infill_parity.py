"""Hearth's /infill builds the prompt llama-server's /infill builds for the same body and the
same model: the same tokens (its ``prompt`` as the vocabulary spells it, and its count), with
other files, the repository form and the cursor text. Needs llama.cpp's llama-server (skipped
with how to build it when it is missing)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.engines import require_llama_server, start_llama_server
from tests.server.fim.conftest import Fim
from tests.server.fim.test_fim_wire import built

pytestmark = pytest.mark.model

BODY: dict[str, Any] = {
    "input_prefix": "import math\n\ndef area(r):\n    ",
    "input_suffix": "\n\nprint(area(2))\n",
    "input_extra": [
        {"filename": "geometry/util.py", "text": "PI = 3.14159\n"},
        {"filename": "README.md", "text": "Shapes and their areas.\n"},
    ],
    "prompt": "return",
    "n_predict": 1,
    "temperature": 0,
}


def test_the_same_prompt_as_llama_server(
    fim: Fim, fim_gguf: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    exe = require_llama_server()
    # a context large enough that llama-server (2048-token batch) keeps every other file, as
    # Hearth does on its 2048-token context
    engine = start_llama_server(
        tmp_path_factory.mktemp("llama-server"), fim_gguf, binary=exe, n_ctx=8192
    )
    try:
        theirs = engine.post("/infill", BODY)
        assert theirs.status == 200, theirs.body
        ours = httpx.post(f"{fim.root}/infill", json={**BODY, "model": fim.keys}, timeout=300)
        assert ours.status_code == 200, ours.text
        tokens = built(
            fim,
            fim.keys,
            BODY["input_prefix"],
            BODY["input_suffix"],
            extra=[(c["filename"], c["text"]) for c in BODY["input_extra"]],
            cursor=BODY["prompt"],
            n_predict=1,
        )
        assert ours.json()["tokens_evaluated"] == len(tokens)
        assert theirs.body["tokens_evaluated"] == len(tokens)
        lm = fim.s.call(fim.s.service.models._scheduler.get(fim.keys))  # type: ignore[attr-defined]
        assert theirs.body["prompt"] == "".join(lm.token_pieces(tokens))
    finally:
        engine.close()  # (stop() would only freeze it: SIGSTOP)
