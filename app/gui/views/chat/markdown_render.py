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
from pygments.lexer import Lexer
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
        md.add_render_rule(
            "code_inline", lambda _r, tokens, idx, *_: self._code_inline(tokens[idx])
        )
        md.add_render_rule("image", _render_image)
        self._md = md
        self.dark = dark
        self._style = DARK_STYLE if dark else LIGHT_STYLE
        self._formatter = HtmlFormatter(noclasses=True, nowrap=True, style=self._style)
        # Pygments' light background (#f8f8f8) is barely apart from a white page
        self._code_bg = str(self._formatter.style.background_color) if dark else "#eff1f3"
        self._inline_bg = "#343942" if dark else "#eff1f3"
        self._muted = "#a8a8a8" if dark else "#6b6b6b"
        self.highlighted_chars = 0  # code handed to Pygments
        self._highlighted: dict[tuple[str, str], str] = {}  # the latest few, oldest first

    def render(self, text: str, first_code: int = 0, *, final: bool = True) -> Rendered:
        """Render ``text``; its code blocks' Copy links count from ``first_code``.

        ``final=False`` (text still streaming): a fence not closed yet is shown without
        highlighting, which would cost a pass over the whole block on every render.
        """
        env: dict[str, Any] = {"codes": [], "first": first_code}
        if not final:
            env["lines"] = text.split("\n")
        out = self._md.render(text, env)
        return Rendered(out, tuple(env["codes"]))

    def top_blocks(self, text: str) -> list[Token]:
        """The opening token of each top-level block of ``text``."""
        return [t for t in self._md.parse(text) if t.level == 0 and t.nesting >= 0 and t.map]

    def _code_inline(self, tok: Token) -> str:
        code = html.escape(tok.content)
        return f'<code style="background-color:{self._inline_bg}">{code}</code>'

    def _highlight(self, code: str, lang: str, lexer: Lexer) -> str:
        # a closed block stays in the re-rendered tail until the next block's first line is
        # complete: highlight it once, not on every render
        key = (lang, code)
        out = self._highlighted.pop(key, None)
        if out is None:
            self.highlighted_chars += len(code)
            out = highlight(code, lexer, self._formatter).rstrip("\n")
        self._highlighted[key] = out
        while len(self._highlighted) > 8:
            del self._highlighted[next(iter(self._highlighted))]
        return out

    def _fence(self, tokens: Sequence[Token], idx: int, env: dict[str, Any]) -> str:
        tok = tokens[idx]
        code = tok.content
        lang = tok.info.strip().split(maxsplit=1)[0] if tok.info.strip() else ""
        try:
            lexer = get_lexer_by_name(lang) if lang else TextLexer()
        except ClassNotFound:
            lexer = TextLexer()
        if "lines" in env and tok.type == "fence" and not _closed(tok, env["lines"]):
            body = html.escape(code).rstrip("\n")
        else:
            body = self._highlight(code, lang, lexer)
        n = env["first"] + len(env["codes"])
        env["codes"].append(code)
        return self.fence_html(lang, n, body)

    def fence_html(self, lang: str, n: int, body: str) -> str:
        """A code block: its language, its Copy link (``copy:n``) and its body (HTML)."""
        label = html.escape(lang) + " · " if lang else ""
        return (
            f'<p style="margin-bottom:0"><span style="color:{self._muted}">{label}</span>'
            f'<a href="{COPY_SCHEME}:{n}">Copy</a></p>\n'
            f'<pre style="background-color:{self._code_bg}; margin-top:2px">{body}</pre>\n'
        )


def _closed(tok: Token, lines: Sequence[str]) -> bool:
    """Whether a fence token ends with its closing fence (its last line: the same character,
    at least as many, nothing else)."""
    if not tok.map or tok.map[1] > len(lines):
        return True
    if tok.map[1] - tok.map[0] < 2:  # the opening line alone
        return False
    return _closes(lines[tok.map[1] - 1], tok.markup)


def _closes(line: str, markup: str) -> bool:
    """Whether ``line`` may close a fence opened with ``markup`` (may: the parser decides)."""
    s = line.strip()
    return len(s) >= len(markup) and set(s) == {markup[0]}


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
    # the tail is the same open code block as at the last update, with this text added to its
    # end (the view may append it instead of setting ``tail`` again); None: set ``tail``
    appended: str | None = None


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
        self._fence = ""  # the open tail is one fence not closed yet: its opening marker
        self._seen = 0  # the length of the open text's complete lines when last looked at
        self._shown_code: str | None = None  # an open fence's code as the last update showed it
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

    def _freeze(self, tail: str, complete: str, out: Update) -> str:
        """Render and freeze the blocks of ``complete`` before its last; returns the new tail."""
        self.parsed_chars += len(complete)
        tops = self._r.top_blocks(complete)
        last = tops[-1] if tops else None  # the block the tail will begin with
        lines = complete.split("\n")
        self._fence = (
            last.markup if last and last.type == "fence" and not _closed(last, lines) else ""
        )
        if len(tops) < 2:
            return tail
        cut = _line_offset(complete, tops[-1].map[0] if tops[-1].map else 0)
        piece = self._r.render(tail[:cut], first_code=len(self._codes))
        self.parsed_chars += cut
        self._frozen.append(piece.html)
        self._frozen_blocks += len(tops) - 1
        self._codes.extend(piece.codes)
        out.frozen.append(piece.html)
        self._open = tail[cut:]
        self._seen -= cut
        return self._open

    def update(self, *, final: bool = False) -> Update:
        """Freeze what can no longer change, re-render the tail; returns what changed.

        ``final``: the text is complete (the answer ended): an unclosed fence is highlighted too,
        so the result equals a one-shot render.
        """
        out = Update()
        tail = self._open
        complete = tail[: tail.rfind("\n") + 1]
        fresh = complete[self._seen :]
        if fresh:  # a line was completed since the last look
            self._seen = len(complete)
            # inside an open fence only a closing line can end it: no need to parse until one
            if not self._fence or any(_closes(ln, self._fence) for ln in fresh.split("\n")):
                tail = self._freeze(tail, complete, out)
        if not final and self._open_fence(tail, out):
            return out
        self._shown_code = None
        self.parsed_chars += len(tail)
        self._tail = self._r.render(tail, first_code=len(self._codes), final=final)
        out.tail = self._tail.html
        return out

    def _open_fence(self, tail: str, out: Update) -> bool:
        """The tail is one fence still open (at column 0, its opening line complete): show its
        code as it grows without parsing it again (what the parser would make of it: all the
        lines after the opening one, unhighlighted). Anything less plain takes the parser."""
        fence = self._fence
        nl = tail.find("\n")
        if not fence or not tail.startswith(fence) or nl < 0 or "\0" in tail:
            return False
        if _closes(tail[tail.rfind("\n") + 1 :], fence):  # a closing line being written
            return False
        info = tail[len(fence) : nl].strip()
        if "\\" in info or "&" in info:  # escapes and entities: the parser's to read
            return False
        lang = info.split(maxsplit=1)[0] if info else ""
        code = tail[nl + 1 :]
        shown = code.rstrip("\n")
        before = self._shown_code
        if before and shown.startswith(before):  # (an empty block has nothing to add to)
            out.appended = shown[len(before) :]
            self.parsed_chars += len(out.appended)
        n = len(self._codes)
        self._tail = Rendered(self._r.fence_html(lang, n, html.escape(shown)), (code,))
        self._shown_code = shown
        out.tail = self._tail.html
        return True


def _line_offset(text: str, line: int) -> int:
    """The character offset where 0-based ``line`` of ``text`` begins."""
    pos = 0
    for _ in range(line):
        pos = text.index("\n", pos) + 1
    return pos
