"""The shape of a GBNF grammar, measured before llama.cpp parses it (defence in depth behind the
schema bounds of ``app/core/inference/constraints.py``).

llama.cpp's grammar code recurses, and each grammar stack costs every token:

- its parser recurses once per nested group: measured here, about 450 bytes of stack a level
  (an 8 MiB stack overflowed at 18,700 levels, a 512 KiB thread stack at 1,150);
- its left-recursion check and its stack expansion recurse once per rule referenced at the start
  of a rule, and the stacks they build grow with the square of that chain (16,000: 1.6 GB, 6 s);
- every alternative open at a position is one grammar stack that each sampled token is checked
  against: about 0.5 ms per stack per token on SmolLM2's 49k vocabulary (an enum of 1,000 values
  made every token take 0.5 s).

:func:`check_grammar` parses the text the way llama.cpp does (iteratively: no recursion here),
measures those four numbers and refuses a grammar over the bounds. A grammar llama.cpp would
reject as malformed (an escape it does not know, such as ``\\d`` from a pattern) is refused here
too, so llama.cpp never prints it.
"""

from __future__ import annotations

from app.errors import InvalidRequest
from app.runtimes.grammar.parse import (
    MAX_GRAMMAR_BYTES,
    MAX_GRAMMAR_DEPTH,
    MAX_GRAMMAR_ELEMENTS,
    MAX_GRAMMAR_FANOUT,
    GrammarError,
    GrammarShape,
    parse,
)
from app.runtimes.grammar.stacks import Analysis

__all__ = [
    "MAX_GRAMMAR_BYTES",
    "MAX_GRAMMAR_DEPTH",
    "MAX_GRAMMAR_ELEMENTS",
    "MAX_GRAMMAR_FANOUT",
    "GrammarError",
    "GrammarShape",
    "check_grammar",
    "measure",
]


def check_grammar(text: str, *, param: str) -> GrammarShape:
    """Measure ``text`` and refuse it over a bound.

    Raises:
        InvalidRequest: malformed, or over MAX_GRAMMAR_BYTES / DEPTH / ELEMENTS / FANOUT.
    """
    size = len(text.encode())
    if size > MAX_GRAMMAR_BYTES:
        raise InvalidRequest(
            f"the output constraint makes a grammar of {size} bytes; at most "
            f"{MAX_GRAMMAR_BYTES} are allowed",
            param=param,
        )
    try:
        return measure(text)
    except GrammarError as e:
        if e.bound is None:
            raise InvalidRequest(
                f"the output constraint makes a grammar llama.cpp cannot parse: {e}", param=param
            ) from e
        raise InvalidRequest(f"the output constraint makes a grammar that {e}", param=param) from e


def measure(text: str) -> GrammarShape:
    """Parse ``text`` (GBNF, llama.cpp's dialect) and measure it.

    Raises:
        GrammarError: malformed, or over a bound (parsing stops there).
    """
    g = parse(text)
    return Analysis(g).shape()
