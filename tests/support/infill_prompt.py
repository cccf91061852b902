"""Test helper: the infill prompt the core's builder lays out with a loaded model's own
tokenizer and FIM tokens, what each protocol must hand that model's engine."""

from __future__ import annotations

from typing import Any

from app.core.inference.fim import build_infill, find_fim_tokens


def builder_prompt(lm: Any, prefix: str, suffix: str, **kw: Any) -> list[int]:
    """``build_infill`` for ``lm`` (a loaded model): its FIM tokens, its tokenizer (no special
    tokens added or parsed), its context and begin token; ``kw``: extra, cursor, n_predict."""
    fim = find_fim_tokens(lm)
    assert fim is not None, "the model has FIM tokens"
    sp = lm.special_tokens
    return build_infill(
        fim,
        lambda text: lm.tokenize(text, add_special=False, parse_special=False),
        prefix=prefix,
        suffix=suffix,
        n_ctx=lm.context_length,
        bos=sp["bos_id"] if sp["add_bos"] else None,
        **kw,
    )
