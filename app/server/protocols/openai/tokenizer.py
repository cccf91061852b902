"""The tokenizer routes' wire shapes, llama.cpp's and vLLM's side by side: /tokenize (``content``;
``prompt``; ``messages``), /detokenize and /tokenizer_info.

Pure translation (no aiohttp): app/server/routes/tokenizer.py hands the bodies here.
Tested by tests/server/protocols/openai/test_tokenizer.py and
tests/server/clients/test_tokenizer_routes.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.core.requests import ChatRequest
from app.core.types import LoadedModel
from app.errors import InvalidRequest
from app.server.protocols.common import (
    MAX_PIECES,
    MAX_TOKENIZE_BYTES,
    Body,
    parse_template_vars,
    parse_tools,
)
from app.server.protocols.fields_registry import DETOKENIZE, TOKENIZE, refuse_unhonoured
from app.server.protocols.openai.fields import parse_messages
from app.server.protocols.openai.parse import parse_continue_final

# what one /tokenize asks for: llama.cpp's text, vLLM's text, or vLLM's conversation
FORMS = ("content", "prompt", "messages")


def model_field(b: Body) -> str:
    """The request's model; "" when absent (the service then implies one, or answers 400)."""
    return b.text("model") or ""


@dataclass(frozen=True, slots=True)
class TokenizeAsk:
    """One /tokenize request. ``chat`` is set for the ``messages`` form, ``text`` otherwise."""

    model: str
    form: str  # one of FORMS
    text: str = ""
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False  # llama.cpp: [{"id", "piece"}] instead of ids
    return_token_strs: bool = False  # vLLM: ids plus "token_strs"
    chat: ChatRequest | None = None


def parse_tokenize(data: dict[str, Any]) -> TokenizeAsk:
    """llama.cpp's ``{"content", "add_special" (false), "parse_special" (true), "with_pieces"}``,
    vLLM's ``{"prompt", "add_special_tokens" (true), "return_token_strs"}`` or vLLM's
    ``{"messages", "add_generation_prompt" (true), "continue_final_message", "tools",
    "chat_template_kwargs", "add_special_tokens" (false)}``: exactly one of the three."""
    b = Body(data)
    refuse_unhonoured(data, TOKENIZE)
    model = model_field(b)
    given = [f for f in FORMS if b.has(f)]
    if len(given) != 1:
        raise InvalidRequest(
            "send exactly one of 'content' (llama.cpp), 'prompt' or 'messages' (vLLM)",
            param=given[1] if len(given) > 1 else "prompt",
        )
    form = given[0]
    if form == "content":
        return TokenizeAsk(
            model,
            form,
            text=_bounded_text(b, "content"),
            add_special=b.flag("add_special"),
            parse_special=b.flag("parse_special", True),
            with_pieces=b.flag("with_pieces"),
        )
    strs = b.flag("return_token_strs")
    if form == "prompt":
        return TokenizeAsk(
            model,
            form,
            text=_bounded_text(b, "prompt"),
            add_special=b.flag("add_special_tokens", True),
            return_token_strs=strs,
        )
    return TokenizeAsk(model, form, return_token_strs=strs, chat=_chat(b, model))


def _bounded_text(b: Body, key: str) -> str:
    text = b.text(key, required=True) or ""
    n = len(text.encode("utf-8", errors="surrogatepass"))
    if n > MAX_TOKENIZE_BYTES:
        raise InvalidRequest(
            f"'{key}' is {n} bytes; /tokenize takes at most {MAX_TOKENIZE_BYTES}", param=key
        )
    return text


def _chat(b: Body, model: str) -> ChatRequest:
    """The conversation as chat completions would take it, and how the prompt closes."""
    if b.flag("add_special_tokens"):
        # the chat template writes the special tokens itself, as chat completions renders it
        raise InvalidRequest(
            "'add_special_tokens' is not taken with 'messages': the chat template writes the "
            "special tokens",
            param="add_special_tokens",
        )
    cont = parse_continue_final(b)
    tools, choice = parse_tools(b)
    return ChatRequest(
        model=model,
        messages=tuple(parse_messages(b)),
        tools=tuple(tools),
        tool_choice=choice,
        template_vars=parse_template_vars(b) or {},
        add_generation_prompt=b.flag("add_generation_prompt", True),
        continue_final_message=cont,
    )


def check_pieces(n: int, param: str) -> None:
    """Spelling tokens out one by one is bounded (MAX_PIECES)."""
    if n > MAX_PIECES:
        raise InvalidRequest(
            f"'{param}' answers at most {MAX_PIECES} tokens; this text has {n} (ask without "
            f"them, or split the text)",
            param=param,
        )


def tokenize_response(
    ask: TokenizeAsk, tokens: list[int], pieces: list[str] | None, max_model_len: int
) -> dict[str, Any]:
    """llama.cpp's ``{"tokens"}`` (ids, or ``{"id", "piece"}`` with_pieces) for ``content``;
    vLLM's ``{"tokens", "count", "max_model_len", "token_strs"?}`` otherwise."""
    if ask.form == "content":
        if ask.with_pieces and pieces is not None:
            return {"tokens": [{"id": t, "piece": p} for t, p in zip(tokens, pieces, strict=True)]}
        return {"tokens": tokens}
    out: dict[str, Any] = {"tokens": tokens, "count": len(tokens), "max_model_len": max_model_len}
    if ask.return_token_strs and pieces is not None:
        out["token_strs"] = pieces
    return out


def parse_detokenize(data: dict[str, Any]) -> tuple[str, list[int]]:
    """``{"model"?, "tokens": [ids]}``, bounded as /tokenize's pieces are."""
    b = Body(data)
    refuse_unhonoured(data, DETOKENIZE)
    tokens = b.data.get("tokens")
    if not isinstance(tokens, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in tokens
    ):
        raise InvalidRequest("'tokens' must be an array of token ids", param="tokens")
    check_pieces(len(tokens), "tokens")
    return model_field(b), tokens


def check_ids(lm: LoadedModel, tokens: list[int]) -> None:
    vocab = int(lm.special_tokens.get("n_vocab") or 0)
    if vocab and any(not 0 <= t < vocab for t in tokens):
        raise InvalidRequest(f"token ids must be in [0, {vocab})", param="tokens")


def detokenize_response(text: str) -> dict[str, str]:
    """Both names of the text: llama.cpp's ``content`` and vLLM's ``prompt``."""
    return {"content": text, "prompt": text}


_TRUE = ("1", "true", "yes")
_FALSE = ("", "0", "false", "no")


def parse_info_query(query: dict[str, str], data: dict[str, Any] | None) -> tuple[str, bool]:
    """/tokenizer_info's model (``?model=`` or the body's) and whether the vocabulary is
    wanted (``?vocab=true`` or ``{"vocab": true}``)."""
    b = Body(dict(data or {}))
    model = query.get("model") or model_field(b)
    raw = query.get("vocab")
    if raw is None:
        return model, b.flag("vocab")
    if raw.lower() not in _TRUE + _FALSE:
        raise InvalidRequest("'vocab' must be true or false", param="vocab")
    return model, raw.lower() in _TRUE


def tokenizer_info(
    lm: LoadedModel, model_id: str, vocab: list[str] | None = None
) -> dict[str, Any]:
    """What a client needs to rebuild the tokenizer, in the names of Hugging Face's
    tokenizer_config.json (vLLM's /tokenizer_info answers those): the special tokens and their
    ids, whether BOS/EOS are added, the chat template, the context, and the vocabulary (each
    id's piece, by index) when asked."""
    sp = lm.special_tokens
    out: dict[str, Any] = {
        "model": model_id,
        "tokenizer_class": _tokenizer_class(str(sp.get("tokenizer_model") or "")),
        "model_type": sp.get("tokenizer_model") or None,
        "vocab_size": int(sp.get("n_vocab") or 0),
        "add_bos_token": bool(sp.get("add_bos")),
        "add_eos_token": bool(sp.get("add_eos")),
        "chat_template": lm.chat_template,
        "model_max_length": lm.context_length,
        "max_model_len": lm.context_length,
    }
    for name in ("bos", "eos", "pad", "unk"):
        out[f"{name}_token"] = sp.get(name) or None
        out[f"{name}_token_id"] = sp.get(f"{name}_id")
    if vocab is not None:
        out["vocab"] = vocab
    return out


# GGUF's tokenizer.ggml.model -> the Hugging Face class that tokenizes the same way
_CLASSES = {
    "gpt2": "PreTrainedTokenizerFast",
    "llama": "LlamaTokenizerFast",
    "bert": "BertTokenizerFast",
    "t5": "T5TokenizerFast",
    "rwkv": "PreTrainedTokenizerFast",
}


def _tokenizer_class(kind: str) -> str:
    return _CLASSES.get(kind, kind or "PreTrainedTokenizerFast")
