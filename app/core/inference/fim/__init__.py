"""Fill-in-the-middle: a model's FIM tokens found (GGUF keys, else the token texts model
families use), the infill prompt built as llama-server's ``/infill`` builds it, and the time and
indentation stops editors ask for.
Tested by tests/core/inference/fim/test_tokens.py and tests/core/inference/fim/test_infill.py."""

from __future__ import annotations

from app.core.inference.fim.infill import build_infill, window_for
from app.core.inference.fim.limits import INFILL_PRIORITY, InfillStops
from app.core.inference.fim.tokens import FimTokens, find_fim_tokens, require_fim

__all__ = [
    "INFILL_PRIORITY",
    "FimTokens",
    "InfillStops",
    "build_infill",
    "find_fim_tokens",
    "require_fim",
    "window_for",
]
