"""The infill prompt as token ids, laid out as llama-server's ``/infill`` lays it out
(``format_prompt_infill`` in its tools/server): the other files first, in the repository form
when the model has the tokens for it, then prefix, suffix and middle markers (prefix first).

    [rep]myproject\\n [sep]name\\n text ... [sep]filename\\n [bos] [pre]prefix cursor [suf]suffix [mid]

Without a file-separator token each file's text follows a plain ``--- snippet ---`` line. The
prefix keeps its last 3/4 of the window, the suffix its first 1/4 (less the cursor text and
two); the other files fill what is left of the context, their last tokens kept.
Tested by tests/core/inference/fim/test_infill.py."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from app.core.inference.fim.tokens import FimTokens

# llama-server's default batch, the window the prefix and suffix share
FIM_BATCH = 2048
# what llama-server writes for the repository's and the current file's names
REPO_NAME = "myproject\n"
FILE_NAME = "filename\n"
DEFAULT_FILENAME = "tmp"  # a file sent without a name (the wire's parser fills it in)
SNIPPET = "\n\n--- snippet ---\n\n"  # before each file's text when there is no separator token


def window_for(n_ctx: int) -> int:
    """The prefix and suffix window: llama-server's default batch (2048), at most half the
    context so the other files and the answer keep room on a small context."""
    return max(8, min(FIM_BATCH, n_ctx // 2))


def build_infill(
    fim: FimTokens,
    tokenize: Callable[[str], list[int]],
    *,
    prefix: str,
    suffix: str,
    extra: Sequence[tuple[str, str]] = (),
    cursor: str = "",
    n_ctx: int,
    n_predict: int,
    bos: int | None = None,
) -> list[int]:
    """The infill prompt's token ids.

    Args:
        fim: the model's FIM tokens.
        tokenize: text -> ids, no special tokens added or parsed.
        prefix, suffix: the text before and after the cursor.
        extra: other files, ``(filename, text)`` pairs, oldest first.
        cursor: text put after the prefix (the cursor line's, kept whole).
        n_ctx: the model's context; n_predict: the tokens kept free for the answer (the other
            files get ``n_ctx - window - 2 * n_predict``, as llama-server gives them).
        bos: the begin token, when the model adds one.
    """
    window = window_for(n_ctx)
    files: list[int] = []
    if fim.rep is not None:
        files += [fim.rep, *tokenize(REPO_NAME)]
    for name, text in extra:
        if fim.sep is not None:
            files += [fim.sep, *tokenize(name + "\n")]
        else:
            files += tokenize(SNIPPET)
        files += tokenize(text)
    if fim.sep is not None:
        files += [fim.sep, *tokenize(FILE_NAME)]

    before, after, typed = tokenize(prefix), tokenize(suffix), tokenize(cursor)
    n_before = min(len(before), 3 * (window // 4))
    n_after = min(len(after), max(0, window // 4 - (2 + len(typed))))
    n_files = min(max(0, n_ctx - window - 2 * max(n_predict, 2)), len(files))

    out = files[len(files) - n_files :]
    if bos is not None:
        out.append(bos)
    out += [fim.pre, *before[len(before) - n_before :], *typed]
    out += [fim.suf, *after[:n_after], fim.mid]
    return out
