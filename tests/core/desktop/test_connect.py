"""The connect core's choices the CLI and the Connect page share: which model, which context."""

from __future__ import annotations

from app.core.desktop.connect import (
    check_fim,
    effective_context,
    known_capabilities,
    pick_model,
    with_context,
)
from app.core.types import LocalModel


def _model(mid: str, **extra: bool) -> LocalModel:
    return LocalModel(mid, f"/m/{mid}.gguf", "gguf", 1, False, extra=dict(extra))


def test_pick_model_prefers_the_default_then_the_first_chat_model() -> None:
    models = [_model("minilm", embedding=True), _model("bge-rr", reranker=True), _model("smol")]
    assert pick_model("", models) == "smol"  # embedders and rerankers do not chat
    assert pick_model("team-alias", models) == "team-alias"  # default_model, whatever it is
    assert pick_model("", models[:2]) is None
    assert pick_model("", []) is None


def test_effective_context_is_the_loaded_then_the_preset_then_the_settings_one() -> None:
    assert effective_context(loaded=1024, preset=4096, default=2048) == 1024
    assert effective_context(loaded=None, preset=4096, default=2048) == 4096
    assert effective_context(loaded=None, preset=None, default=2048) == 2048
    assert effective_context(loaded=None, preset=None, default=0) is None  # 0: auto
    assert with_context({"temperature": 0.2, "context_length": 2048}, 8192) == {
        "temperature": 0.2,
        "context_length": 8192,
    }


def test_autocomplete_picks_a_model_that_fills_in_the_middle() -> None:
    models = [_model("smol"), _model("coder", fim=True)]
    assert "fim" in models[1].capabilities and "fim" not in models[0].capabilities
    assert pick_model("smol", models, "fim") == "coder"  # the default cannot fill in
    assert pick_model("coder", models, "fim") == "coder"
    assert pick_model("", [_model("smol")], "fim") == "smol"  # none can: warned, not empty
    assert pick_model("", [_model("minilm", embedding=True)], "fim") is None
    assert pick_model("smol", models) == "smol"  # chat tools: the default, as before


def test_an_autocomplete_tool_warns_about_a_model_without_fim_tokens() -> None:
    bad = check_fim("llama-vscode", "smol", ("completion", "chat"))
    assert not bad.ok and "cannot fill in the middle" in bad.message
    assert check_fim("llama-vscode", "coder", ("completion", "chat", "fim")).ok
    assert check_fim("continue-autocomplete", "remote/x", None).ok  # unknown: no warning
    assert check_fim("cline", "smol", ("completion", "chat")).ok  # chat tools do not care


def test_a_model_indexed_before_fim_was_looked_for_is_not_warned_about() -> None:
    assert known_capabilities(_model("old")) is None  # its entry has no "fim": unknown
    assert known_capabilities(_model("smol", fim=False)) == ("completion", "chat")
    assert check_fim("llama-vscode", "old", known_capabilities(_model("old"))).ok
