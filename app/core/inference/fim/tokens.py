"""A model's fill-in-the-middle tokens: the ids the runtime read from the GGUF's
``tokenizer.ggml.fim_*_token_id`` keys (and the older ``prefix/suffix/middle_token_id``), else
the token texts the code-model families use, where the vocabulary has them as single tokens.
Tested by tests/core/inference/fim/test_tokens.py."""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

from app.core.library.fim_vocab import ROLES, TEXTS
from app.core.types import LoadedModel
from app.errors import InvalidRequest


@dataclass(frozen=True, slots=True)
class FimTokens:
    """The token ids a FIM prompt is built from: prefix, suffix and middle markers always;
    padding, repository name and file separator where the model has them."""

    pre: int
    suf: int
    mid: int
    pad: int | None = None
    rep: int | None = None
    sep: int | None = None


def _stated(special: dict[str, object], role: str) -> int | None:
    v = special.get(f"fim_{role}_id")
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def _by_text(lm: LoadedModel, role: str) -> int | None:
    """The first of the role's texts that the vocabulary holds as one token spelled so."""
    for text in TEXTS[role]:
        ids = lm.tokenize(text, add_special=False, parse_special=True)
        if len(ids) != 1:
            continue
        [piece] = lm.token_pieces(ids)
        if piece in (text, text.replace("▁", " ")):
            return ids[0]
    return None


# per loaded model: an editor sends a request per keystroke, and the lookup by text tokenizes
# a dozen strings; a reload is a new object, looked up again
_found: weakref.WeakKeyDictionary[Any, FimTokens | None] = weakref.WeakKeyDictionary()


def find_fim_tokens(lm: LoadedModel) -> FimTokens | None:
    """The model's FIM tokens, or None when it lacks a prefix, suffix or middle token.

    The ids its runtime states (``special_tokens["fim_pre_id"]``...: the GGUF keys, and what
    llama.cpp found by text) come first; a role still missing is looked up by its texts.
    Looked up once per loaded model."""
    try:
        return _found[lm]
    except KeyError:
        pass
    except TypeError:  # a model object that takes no weak reference: looked up each time
        return _lookup(lm)
    fim = _found[lm] = _lookup(lm)
    return fim


def _lookup(lm: LoadedModel) -> FimTokens | None:
    special = lm.special_tokens
    found: dict[str, int | None] = {}
    for role in ROLES:
        found[role] = _stated(special, role)
        if found[role] is None:
            found[role] = _by_text(lm, role)
    pre, suf, mid = found["pre"], found["suf"], found["mid"]
    if pre is None or suf is None or mid is None:
        return None
    return FimTokens(pre, suf, mid, found["pad"], found["rep"], found["sep"])


def require_fim(lm: LoadedModel, model_id: str, param: str) -> FimTokens:
    """The model's FIM tokens, or a 400 naming ``param`` that says the model has none.

    Raises:
        InvalidRequest: an embedding or reranking model, or a model without FIM tokens.
    """
    if "completion" not in lm.capabilities:
        raise InvalidRequest(
            f"'{model_id}' is an embedding model: it cannot fill in the middle", param=param
        )
    fim = find_fim_tokens(lm)
    if fim is None:
        raise InvalidRequest(
            f"'{model_id}' has no fill-in-the-middle tokens (prefix, suffix and middle), so it "
            f"cannot complete between a prefix and a suffix; use a code model trained for it "
            f"(Qwen2.5-Coder, StarCoder2, CodeLlama, DeepSeek-Coder...)",
            param=param,
        )
    return fim
