"""``hearth connect`` for editor autocomplete (Continue's tab autocomplete, llama.vscode,
Twinny): the model picked fills in the middle, one that cannot gets a plain warning (and still
its settings), and the settings work: the requests those editors send to the URL given are
answered."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from app.settings import SettingsStore
from tests.conftest import Served, serving
from tests.e2e.cli.test_connect import _capture, connect_json, hearth  # noqa: F401 (fixture)

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def two(
    tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path, fim_gguf: Path
) -> Iterator[tuple[Served, str]]:
    """Plain SmolLM2 (the first, the default model) and a FIM model."""
    home = tmp_path_factory.mktemp("autocomplete")
    with serving(home, smollm2_path, fim_gguf) as s:
        statuses = s.service.models.all()  # type: ignore[attr-defined]
        fim = next(m.model.id for m in statuses if "fim" in m.model.capabilities)
        SettingsStore(home / "config" / "settings.json").update(default_model=s.model_id)
        yield s, fim


def test_llama_vscode_gets_a_fim_model_and_its_endpoint_answers(two: tuple[Served, str]) -> None:
    s, fim = two
    out = connect_json(s.home, "llama-vscode")
    assert out["model"] == fim and out["fim_ok"] is True and out["fim_warning"] is None
    settings = json.loads(out["snippet"].split("\n", 1)[1])
    endpoint = settings["llama-vscode.endpoint"]
    assert endpoint == s.root and fim in " ".join(out["notes"])
    # llama.vscode names no model: with default_model set as the note says, /infill answers
    SettingsStore(s.home / "config" / "settings.json").update(default_model=fim)
    try:
        body = {"input_prefix": "x = ", "input_suffix": "\n", "input_extra": [], "prompt": ""}
        r = httpx.post(f"{endpoint}/infill", json={**body, "n_predict": 4}, timeout=300)
        assert r.status_code == 200 and r.json()["model"] == fim, r.text
    finally:
        SettingsStore(s.home / "config" / "settings.json").update(default_model=s.model_id)


def test_continue_autocomplete_settings_are_used_as_continue_uses_them(
    two: tuple[Served, str],
) -> None:
    s, fim = two
    out = connect_json(s.home, "continue-autocomplete")
    assert out["model"] == fim and out["fim_ok"] is True
    doc = yaml.safe_load(out["snippet"])
    [entry] = doc["models"]
    assert entry["provider"] == "ollama" and entry["roles"] == ["autocomplete"]
    assert entry["model"] == fim and entry["defaultCompletionOptions"]["contextLength"] == 4096
    old = json.loads(
        "\n".join(
            x[2:]
            for x in out["snippet"].splitlines()
            if x.startswith("# ") and not x.startswith("# ~") and not x.startswith("# or")
        )
    )
    assert old["tabAutocompleteModel"]["provider"] == "ollama"
    # Continue's Ollama provider: /api/show (its FIM check), then /api/generate with a suffix
    base = entry["apiBase"]
    show = httpx.post(base + "api/show", json={"name": fim}, timeout=60).json()
    assert ".Suffix" in show["template"]
    body: dict[str, Any] = {
        "model": fim,
        "prompt": "def f(x):\n    ",
        "suffix": "\n",
        "options": {"temperature": 0.01, "num_predict": 4},
        "keep_alive": 1800,
        "stream": True,
    }
    r = httpx.post(base + "api/generate", json=body, timeout=300)
    assert r.status_code == 200 and json.loads(r.text.splitlines()[-1])["done"] is True


def test_a_model_that_cannot_fill_in_gets_a_plain_warning(two: tuple[Served, str]) -> None:
    s, _ = two
    out = connect_json(s.home, "continue-autocomplete", "--model", s.model_id)
    assert out["fim_ok"] is False and "cannot fill in the middle" in out["fim_warning"]
    assert s.model_id in out["snippet"]  # the settings still come, for when a model is picked
    ran = hearth(s.home, "llama-vscode", "--model", s.model_id)
    assert ran.returncode == 0 and "warning:" in ran.stderr and "Qwen2.5-Coder" in ran.stderr
    # a chat tool's answer keeps its shape
    assert "fim_ok" not in connect_json(s.home, "cline", "--model", s.model_id)


def test_twinny_provider_fields_reach_the_server(two: tuple[Served, str]) -> None:
    s, fim = two
    out = connect_json(s.home, "twinny")
    assert out["model"] == fim and out["fim_ok"] is True and out["snippet_language"] == "text"
    fields = dict(
        line.split(": ", 1) for line in out["snippet"].splitlines() if not line.startswith("#")
    )
    assert fields["Type"] == "fim" and fields["Provider"] == "lmstudio"
    assert fields["Model Name"] == fim
    url = f"{fields['Protocol']}://{fields['Hostname']}:{fields['Port']}{fields['API Path']}"
    assert url == s.root + "/v1/completions"
    # Twinny's LM Studio provider body (completion/request-body.ts), its prompt its own
    body = {"model": fields["Model Name"], "prompt": "def f(x):\n    ", "stream": True,
            "temperature": 0.2, "max_tokens": 4, "stop": ["<|endoftext|>"]}  # fmt: skip
    r = httpx.post(url, json=body, timeout=300)
    assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]"), r.text
