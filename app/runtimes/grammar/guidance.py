"""Constrained decoding for runtimes without a grammar engine of their own (MLX), over llguidance.

A request's constraint (``GenerationRequest.constraint``) is compiled once per request into an
``llguidance.LLMatcher`` bound to the model's tokenizer; at each step the matcher gives the set
of tokens that keep the output valid, and every other logit is set to -inf before sampling. When
the grammar is complete only end-of-generation tokens remain, so the model stops there.

Constraints (the same ones llama.cpp enforces with GBNF):
- ``("json_object", "")``: any JSON object;
- ``("json_schema", schema)``: a value valid against the schema (strict or not);
- ``("tool_call", spec)``: one hermes-style ``<tool_call>`` block (or up to
  ``MAX_PARALLEL_CALLS`` when ``spec["parallel"]``) whose object matches ``spec["schema"]``.

A schema llguidance cannot compile is an ``InvalidRequest`` (HTTP 400), raised before any
output is produced.
Tested by tests/runtimes/mlx/test_runtime.py and tests/runtimes/grammar/test_gbnf.py.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

from app.errors import InvalidRequest, RuntimeUnavailable

log = logging.getLogger(__name__)

MAX_PARALLEL_CALLS = 8  # a small model forced to call tools cannot chain calls forever


def _import() -> Any:
    try:
        import llguidance
    except ImportError as e:  # pragma: no cover - a dependency of the MLX extra
        raise RuntimeUnavailable(
            "structured output on this runtime needs llguidance (pip install llguidance)"
        ) from e
    return llguidance


# Whitespace between JSON tokens: none, one space, or line breaks with a bounded indent (as
# llama.cpp's schema grammars allow), so a model cannot spend its whole budget on blanks.
JSON_OPTIONS = {"whitespace_pattern": r"(?: |\n{1,2}[ \t]{0,20})?"}


def _schema(schema: Any) -> dict[str, Any]:
    if isinstance(schema, str):
        schema = json.loads(schema)
    if not isinstance(schema, dict):
        raise ValueError("a JSON schema is an object")
    # ours only: a client's own x-guidance could set a whitespace pattern no bound has seen
    return {**schema, "x-guidance": dict(JSON_OPTIONS)}


def grammar_text(constraint: tuple[str, str]) -> str:
    """The llguidance grammar for a constraint (not yet checked against a tokenizer)."""
    llg = _import()
    kind, payload = constraint
    matcher = llg.LLMatcher
    if kind == "json_object":
        return str(matcher.grammar_from_json_schema(_schema({"type": "object"})))
    if kind == "json_schema":
        return str(matcher.grammar_from_json_schema(_schema(payload)))
    if kind == "tool_call":
        spec = json.loads(payload)
        call = json.dumps(_schema(spec["schema"]))
        block = '"<tool_call>\\n" call "\\n</tool_call>"'
        more = f' ("\\n" {block}){{0,{MAX_PARALLEL_CALLS - 1}}}' if spec.get("parallel") else ""
        return str(matcher.grammar_from_lark(f"start: {block}{more}\ncall: %json {call}\n"))
    raise InvalidRequest(f"unknown output constraint '{kind}'", param="response_format")


class Guide:
    """The tokenizer side of constrained decoding for one loaded model (thread-safe to share)."""

    def __init__(self, hf_tokenizer: Any, *, n_vocab: int, eos_tokens: list[int]) -> None:
        self._hf = hf_tokenizer
        self._n_vocab = n_vocab
        self._eos = eos_tokens
        self._tokenizer: Any = None
        self._lock = threading.Lock()

    def warm(self) -> None:
        """Build the tokenizer view now (about a second for a large vocabulary), so the first
        constrained request does not pay for it on the server's loop."""
        try:
            self._llg_tokenizer()
        except Exception:  # noqa: BLE001 - reported again, as a 400, by the request that needs it
            log.info("guided decoding: the tokenizer could not be prepared", exc_info=True)

    def _llg_tokenizer(self) -> Any:
        with self._lock:
            if self._tokenizer is None:
                import llguidance.hf

                self._tokenizer = llguidance.hf.from_tokenizer(
                    self._hf, n_vocab=self._n_vocab, eos_token=self._eos or None
                )
            return self._tokenizer

    def matcher(self, constraint: tuple[str, str]) -> GuidedLogits:
        """A fresh per-request logits processor (compiling: call it off the event loop).

        Raises:
            InvalidRequest: the constraint cannot be compiled (param names the request field).
        """
        return GuidedLogits(self._compile(constraint), self._n_vocab, self._eos)

    def check(self, constraint: tuple[str, str]) -> None:
        """Compile the constraint and compute its first token mask, where llguidance builds its
        lexer (lazily, and where a grammar too large for it fails), so that a constraint that
        cannot be enforced is a 400 before any output.

        Raises:
            InvalidRequest: the constraint cannot be compiled.
        """
        from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

        m = self._compile(constraint)
        fill_next_token_bitmask(m, allocate_token_bitmask(1, self._n_vocab))
        self._raise_if_error(m, constraint)

    def _compile(self, constraint: tuple[str, str]) -> Any:
        llg = _import()
        param = _param(constraint)
        try:
            grammar = grammar_text(constraint)
        except (ValueError, TypeError, KeyError) as e:
            raise InvalidRequest(
                f"the output constraint cannot be enforced: {e}", param=param
            ) from e
        m = llg.LLMatcher(self._llg_tokenizer(), grammar, log_level=0)
        self._raise_if_error(m, constraint)
        return m

    @staticmethod
    def _raise_if_error(m: Any, constraint: tuple[str, str]) -> None:
        if m.is_error():
            param = _param(constraint)
            what = "a tool's parameters" if param == "tool_choice" else "the JSON schema"
            raise InvalidRequest(f"{what} cannot be enforced: {m.get_error()}", param=param)


def _param(constraint: tuple[str, str]) -> str:
    return "tool_choice" if constraint[0] == "tool_call" else "response_format"


class GuidedLogits:
    """An mlx-lm logits processor: ``(tokens, logits) -> logits`` with invalid tokens at -inf.

    mlx-lm calls it before each sampling with every token so far (prompt first); the tokens
    sampled since the last call are fed to the matcher, then its mask is applied.
    """

    def __init__(self, matcher: Any, n_vocab: int, eos_tokens: list[int]) -> None:
        import numpy as np
        from llguidance.numpy import allocate_token_bitmask

        self._np = np
        self._m = matcher
        self._mask = allocate_token_bitmask(1, n_vocab)
        self._eos = eos_tokens
        self._prompt_len: int | None = None
        self._seen = 0
        self.error: str | None = None

    def __call__(self, tokens: Any, logits: Any) -> Any:
        import mlx.core as mx
        from llguidance.numpy import fill_next_token_bitmask

        np = self._np
        n = int(tokens.shape[0]) if hasattr(tokens, "shape") else len(tokens)
        if self._prompt_len is None:
            self._prompt_len = n  # the first call sees the prompt alone
        new = n - self._prompt_len - self._seen
        if new > 0:
            sampled = [int(t) for t in tokens[n - new :].tolist()]
            self._seen += new
            for t in sampled:
                if self._m.is_stopped() or (t in self._eos and self._m.is_accepting()):
                    break  # the end: mlx-lm computes one token past it, which is never shown
                if not self._m.consume_token(t) and self.error is None:
                    self.error = self._m.get_error() or f"token {t} rejected by the grammar"
                    log.warning("guided decoding: %s", self.error)
        vocab = int(logits.shape[-1])
        if self._m.is_error() or self._m.is_stopped():
            allowed = np.zeros(vocab, dtype=bool)  # end the generation
            allowed[[t for t in self._eos if t < vocab]] = True
        else:
            fill_next_token_bitmask(self._m, self._mask)
            bits = np.unpackbits(self._mask.view(np.uint8), bitorder="little")
            allowed = np.zeros(vocab, dtype=bool)
            k = min(vocab, bits.shape[0])
            allowed[:k] = bits[:k].astype(bool)
        return mx.where(mx.array(allowed), logits, mx.array(-float("inf"), dtype=logits.dtype))
