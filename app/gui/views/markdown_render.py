"""Markdown to the HTML subset QTextBrowser shows, one-shot and incrementally while a model
streams. Pure (no Qt): the views pick the dark or light code style and show the HTML.

CommonMark plus GFM tables and strikethrough (markdown-it-py), fenced code highlighted by
Pygments with inline styles, a ``copy:N`` link over each code block (N indexes ``codes``).
Raw HTML in the text is escaped, links keep only http, https and mailto targets, and images are
shown as links (QTextBrowser would otherwise read local files named by the model).
"""

from __future__ import annotations

import html
import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from markdown_it import MarkdownIt
from markdown_it.token import Token
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name
from pygments.lexers.special import TextLexer
from pygments.util import ClassNotFound

LINK_SCHEMES = ("http", "https", "mailto")
LIGHT_STYLE = "default"
DARK_STYLE = "github-dark"
COPY_SCHEME = "copy"


def safe_link(url: str) -> bool:
    """Whether a link may be shown (and opened): http, https or mailto only."""
    scheme, sep, _ = url.strip().partition(":")
    return bool(sep) and scheme.lower() in LINK_SCHEMES


@dataclass(frozen=True, slots=True)
class Rendered:
    """HTML for a piece of markdown and the raw code of its code blocks, in order."""

    html: str
    codes: tuple[str, ...]


class MarkdownRenderer:
    """Markdown text -> Qt-friendly HTML. One instance per style; cheap to call repeatedly.

    Args:
        dark: highlight code for a dark background.
    """

    def __init__(self, *, dark: bool = False) -> None:
        linkify = importlib.util.find_spec("linkify_it") is not None
        md = MarkdownIt("commonmark", {"html": False, "linkify": linkify, "typographer": False})
        md.enable(["table", "strikethrough"] + (["linkify"] if linkify else []))
        # a reference definition changes links above it: blocks could not be rendered alone
        md.disable("reference")
        md.validateLink = safe_link  # type: ignore[method-assign]

        def fence(_r: object, tokens: Sequence[Token], idx: int, _o: object, env: Any) -> str:
            return self._fence(tokens, idx, env)  # markdown-it rebinds rules to its renderer

        md.add_render_rule("fence", fence)
        md.add_render_rule("code_block", fence)
        md.add_render_rule("table_open", _render_table_open)
        md.add_render_rule("image", _render_image)
        self._md = md
        self.dark = dark
        self._style = DARK_STYLE if dark else LIGHT_STYLE
        self._formatter = HtmlFormatter(noclasses=True, nowrap=True, style=self._style)
        self._code_bg = str(self._formatter.style.background_color or "#f6f8fa")
        self._muted = "#a8a8a8" if dark else "#6b6b6b"

    def render(self, text: str, first_code: int = 0) -> Rendered:
        """Render ``text``; its code blocks' Copy links count from ``first_code``."""
        env: dict[str, Any] = {"codes": [], "first": first_code}
        out = self._md.render(text, env)
        return Rendered(out, tuple(env["codes"]))

    def block_starts(self, text: str) -> list[int]:
        """The first line (0-based) of each top-level block of ``text``."""
        return [t.map[0] for t in self._md.parse(text) if t.level == 0 and t.nesting >= 0 and t.map]

    def _fence(self, tokens: Sequence[Token], idx: int, env: dict[str, Any]) -> str:
        tok = tokens[idx]
        code = tok.content
        lang = tok.info.strip().split(maxsplit=1)[0] if tok.info.strip() else ""
        try:
            lexer = get_lexer_by_name(lang) if lang else TextLexer()
        except ClassNotFound:
            lexer = TextLexer()
        body = highlight(code, lexer, self._formatter).rstrip("\n")
        n = env["first"] + len(env["codes"])
        env["codes"].append(code)
        label = html.escape(lang) + " · " if lang else ""
        return (
            f'<p style="margin-bottom:0"><span style="color:{self._muted}">{label}</span>'
            f'<a href="{COPY_SCHEME}:{n}">Copy</a></p>\n'
            f'<pre style="background-color:{self._code_bg}; margin-top:2px">{body}</pre>\n'
        )


def _render_table_open(*_: object) -> str:
    # Qt draws no cell borders unless the table asks for them
    return '<table border="1" cellspacing="0" cellpadding="4">\n'


def _render_image(_r: object, tokens: Sequence[Token], idx: int, *_: object) -> str:
    tok = tokens[idx]
    src = str(tok.attrGet("src") or "")
    alt = html.escape(tok.content or src)
    return f'<a href="{html.escape(src)}">[image: {alt}]</a>' if safe_link(src) else alt


def render_markdown(text: str, *, dark: bool = False) -> Rendered:
    """One-shot render of a whole text (what a streamed render must end equal to)."""
    return MarkdownRenderer(dark=dark).render(text)


@dataclass(slots=True)
class Update:
    """What changed since the last ``IncrementalMarkdown.update``: HTML of blocks that froze
    now (show them once, after the earlier ones) and the whole open tail's HTML."""

    frozen: list[str] = field(default_factory=list)
    tail: str = ""


class IncrementalMarkdown:
    """Streamed markdown rendered without re-parsing what can no longer change.

    The text is split into top-level blocks. A block followed by another block that starts on a
    complete line (so a later character cannot change either) is rendered once and frozen; only
    the open tail is parsed again on each ``update``. ``parsed_chars`` counts every character
    handed to the parser, so tests can show the work per append stays flat.
    """

    def __init__(self, renderer: MarkdownRenderer) -> None:
        self._r = renderer
        self._raw: list[str] = []
        self._open = ""  # the text after the frozen blocks, newlines as markdown-it sees them
        self._cr = False  # the last chunk ended in "\r": a "\n" next is the same newline
        self._frozen: list[str] = []
        self._codes: list[str] = []
        self._tail = Rendered("", ())
        self._frozen_blocks = 0
        self._seen = 0  # the length of the open text's complete lines when last looked at
        self.parsed_chars = 0

    @property
    def renderer(self) -> MarkdownRenderer:
        return self._r

    @property
    def markdown(self) -> str:
        """The raw text appended so far."""
        return "".join(self._raw)

    @property
    def html(self) -> str:
        """Frozen blocks then the tail, as of the last ``update``."""
        return "".join(self._frozen) + self._tail.html

    @property
    def codes(self) -> tuple[str, ...]:
        """Raw code of each code block, indexed by its ``copy:N`` link."""
        return tuple(self._codes) + self._tail.codes

    @property
    def frozen_blocks(self) -> int:
        """How many top-level blocks are rendered for good."""
        return self._frozen_blocks

    def append(self, chunk: str) -> None:
        self._raw.append(chunk)
        if self._cr and chunk.startswith("\n"):
            chunk = chunk[1:]
        self._cr = chunk.endswith("\r")
        self._open += chunk.replace("\r\n", "\n").replace("\r", "\n")

    def update(self) -> Update:
        """Freeze what can no longer change, re-render the tail; returns what changed."""
        out = Update()
        tail = self._open
        complete = tail[: tail.rfind("\n") + 1]
        if complete and len(complete) != self._seen:  # a line was completed since the last look
            self._seen = len(complete)
            self.parsed_chars += len(complete)
            starts = self._r.block_starts(complete)
            if len(starts) >= 2:
                cut = _line_offset(complete, starts[-1])
                piece = self._r.render(tail[:cut], first_code=len(self._codes))
                self.parsed_chars += cut
                self._frozen.append(piece.html)
                self._frozen_blocks += len(starts) - 1
                self._codes.extend(piece.codes)
                out.frozen.append(piece.html)
                tail = self._open = tail[cut:]
                self._seen -= cut
        self.parsed_chars += len(tail)
        self._tail = self._r.render(tail, first_code=len(self._codes))
        out.tail = self._tail.html
        return out


def _line_offset(text: str, line: int) -> int:
    """The character offset where 0-based ``line`` of ``text`` begins."""
    pos = 0
    for _ in range(line):
        pos = text.index("\n", pos) + 1
    return pos
