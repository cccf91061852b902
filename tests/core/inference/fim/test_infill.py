"""The infill prompt laid out as llama-server's /infill lays it out: the repository form for
other files, the prefix's last 3/4 and the suffix's first 1/4 of the window, the other files
cut from the front to what the context leaves. The tokenizer here is a real model's (SmolLM2
with FIM tokens) or, for the bounds, one token per character."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from app.core.inference.fim import FimTokens, build_infill, find_fim_tokens, window_for
from app.core.inference.fim.infill import SNIPPET
from app.core.types import LoadOptions, LocalModel
from app.runtimes.llama.runtime import LlamaCppRuntime
from tests.support import probes


def chars(text: str) -> list[int]:
    return [ord(c) for c in text]


PLAIN = FimTokens(pre=-1, suf=-2, mid=-3)


def test_prefix_then_cursor_then_suffix_then_middle() -> None:
    out = build_infill(PLAIN, chars, prefix="ab", suffix="cd", cursor="x", n_ctx=4096, n_predict=8)
    assert out == [-1, *chars("abx"), -2, *chars("cd"), -3]


def test_the_prefix_keeps_its_end_and_the_suffix_its_start() -> None:
    n_ctx = 64  # a window of 32: the prefix gets 24, the suffix 8 - 2 - len(cursor)
    assert window_for(n_ctx) == 32
    prefix, suffix = "p" * 50 + "END", "START" + "s" * 50
    out = build_infill(
        PLAIN, chars, prefix=prefix, suffix=suffix, cursor="c", n_ctx=n_ctx, n_predict=4
    )
    pre, suf = out.index(-1), out.index(-2)
    assert out[pre + 1 : suf] == chars(prefix[-24:] + "c")
    assert out[suf + 1 : -1] == chars(suffix[:5])
    assert out[-1] == -3


def test_other_files_fill_what_the_context_leaves_their_end_kept() -> None:
    fim = FimTokens(pre=-1, suf=-2, mid=-3, rep=-4, sep=-5)
    extra = [("a.py", "A" * 40), ("b.py", "B" * 40)]
    full = build_infill(fim, chars, prefix="p", suffix="s", extra=extra, n_ctx=4096, n_predict=8)
    files = [-4, *chars("myproject\n"), -5, *chars("a.py\n" + "A" * 40)]
    files += [-5, *chars("b.py\n" + "B" * 40), -5, *chars("filename\n")]
    assert full[: len(files)] == files
    # a context of 128 (window 64) leaves 128 - 64 - 2 * 8 = 48 tokens for them
    cut = build_infill(fim, chars, prefix="p", suffix="s", extra=extra, n_ctx=128, n_predict=8)
    assert cut[: cut.index(-1)] == files[-48:]


def test_without_a_file_separator_each_file_follows_a_snippet_line() -> None:
    out = build_infill(
        PLAIN, chars, prefix="p", suffix="s", extra=[("a.py", "AA")], n_ctx=4096, n_predict=8
    )
    assert out[: out.index(-1)] == chars(SNIPPET + "AA")


def test_the_begin_token_comes_after_the_files_and_before_the_prefix() -> None:
    fim = FimTokens(pre=-1, suf=-2, mid=-3, sep=-5)
    out = build_infill(
        fim, chars, prefix="p", suffix="s", extra=[("a", "T")], n_ctx=4096, n_predict=8, bos=-9
    )
    assert out[: out.index(-9)] == [-5, *chars("a\nT"), -5, *chars("filename\n")]
    assert out[out.index(-9) + 1] == -1


@pytest.fixture(scope="module")
def keys_model(fim_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    rt = LlamaCppRuntime(probe_file=probes.shared())
    m = LocalModel(id="fim", path=str(fim_gguf), format="gguf", size_bytes=1, owned=False)
    lm = rt.load(m, LoadOptions(context_length=2048))
    yield lm
    lm.close()
    rt.close()


@pytest.mark.model
def test_the_repository_form_with_a_real_vocabulary(keys_model: object) -> None:
    lm = keys_model

    def tok(text: str) -> list[int]:
        return lm.tokenize(text, add_special=False, parse_special=False)  # type: ignore[attr-defined]

    fim = find_fim_tokens(lm)  # type: ignore[arg-type]
    assert fim is not None
    out = build_infill(
        fim,
        tok,
        prefix="def add(a, b):\n    ",
        suffix="\n\nprint(add(1, 2))\n",
        extra=[("util.py", "X = 1\n")],
        cursor="return",
        n_ctx=lm.context_length,  # type: ignore[attr-defined]
        n_predict=16,
    )
    want = [3, *tok("myproject\n"), 5, *tok("util.py\n"), *tok("X = 1\n"), 5, *tok("filename\n")]
    want += [7, *tok("def add(a, b):\n    "), *tok("return")]
    want += [8, *tok("\n\nprint(add(1, 2))\n"), 9]
    assert out == want
