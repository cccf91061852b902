"""Cut an attachment's text into overlapping chunks for retrieval.

Chunks follow the text's own shape: paragraphs (blank lines) and Markdown headings are the
pieces; a piece over the target is cut at lines, then at spaces. Pieces are packed up to
:data:`TARGET_TOKENS`, a heading starts a new chunk once the current one is half full, and
each chunk begins with the last :data:`OVERLAP_TOKENS` of the one before (so a fact cut at
a boundary is whole in one of them). A PDF's chunks never cross pages and keep the page
number. Sizes are counted with :func:`estimate_tokens`: the chat model's tokenizer is not
needed to chunk, and the budget later counts what goes in the prompt exactly.
Tested by tests/core/workspace/test_attachments.py and tests/runtimes/llama/test_retrieval_real.py.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from app.core.workspace.attachments import Attachment

CHARS_PER_TOKEN = 3  # the estimate: English prose runs ~4 characters a token, code ~3
TARGET_TOKENS = 400  # ~1200 characters: ~300-400 real tokens of prose
OVERLAP_TOKENS = 50
VERSION = 1  # part of the embedding cache key: a change here re-embeds

_HEADING = re.compile(r"^(#{1,6}\s|\S.*\n(=+|-+)\s*$)")


def estimate_tokens(text: str) -> int:
    """Tokens of ``text`` when no tokenizer is at hand: one per 3 characters, rounded up
    (more than most tokenizers give for prose and code, so an estimate errs on the safe side)."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)


@dataclass(frozen=True, slots=True)
class Chunk:
    """A piece of a file: ``index`` from 1 within the file, ``page`` for a PDF."""

    file: str
    index: int
    page: int | None
    text: str

    @property
    def label(self) -> str:
        """How the prompt and the "Used:" notice name it: ``report.pdf p.3``,
        ``notes.txt chunk 12``."""
        if self.page is not None:
            return f"{self.file} p.{self.page}"
        return f"{self.file} chunk {self.index}"


def chunk_attachment(
    a: Attachment, *, target: int = TARGET_TOKENS, overlap: int = OVERLAP_TOKENS
) -> list[Chunk]:
    """The file's chunks, in order."""
    out: list[Chunk] = []
    for page in a.pages:
        for text in chunk_text(page.text, target=target, overlap=overlap):
            out.append(Chunk(a.name, len(out) + 1, page.number, text))
    return out


def chunk_text(
    text: str, *, target: int = TARGET_TOKENS, overlap: int = OVERLAP_TOKENS
) -> list[str]:
    """``text`` cut into chunks of about ``target`` estimated tokens (see the module)."""
    limit = target * CHARS_PER_TOKEN
    keep = overlap * CHARS_PER_TOKEN
    pieces: list[_Piece] = []
    for block in _blocks(text):
        heading = bool(_HEADING.match(block))
        for i, part in enumerate(_split(block, limit)):
            pieces.append(_Piece(part, "\n\n" if i == 0 else "\n", heading and i == 0))
    chunks: list[str] = []
    current: list[_Piece] = []
    fresh = False  # ``current`` holds more than the previous chunk's overlap
    for piece in pieces:
        full = _size(current + [piece]) > limit
        if fresh and (full or (piece.heading and _size(current) * 2 >= limit)):
            carried = [current.pop()] if current[-1].heading else []  # a heading leads its text
            if current:
                chunks.append(_join(current))
            current = carried or _tail(current, keep)
            if _size(current + [piece]) > limit:  # the overlap and this piece do not fit
                current = carried
        current.append(piece)
        fresh = True
    if fresh and current:
        chunks.append(_join(current))
    return chunks


@dataclass(frozen=True, slots=True)
class _Piece:
    text: str
    sep: str  # what joins it to the piece before: a blank line between blocks, else a newline
    heading: bool = False


def _size(pieces: list[_Piece]) -> int:
    return sum(len(p.text) + len(p.sep) for p in pieces) - (len(pieces[0].sep) if pieces else 0)


def _join(pieces: list[_Piece]) -> str:
    return pieces[0].text + "".join(p.sep + p.text for p in pieces[1:])


def _tail(pieces: list[_Piece], keep: int) -> list[_Piece]:
    """The last pieces of a chunk, up to ``keep`` characters: the next chunk's start."""
    out: list[_Piece] = []
    for p in reversed(pieces):
        if _size([p] + out) > keep:
            break
        out.insert(0, p)
    return out


def _blocks(text: str) -> list[str]:
    """Paragraphs (split at blank lines), each Markdown heading line its own block."""
    out: list[str] = []
    for para in re.split(r"\n[ \t]*\n+", text):
        lines: list[str] = []
        for line in para.split("\n"):
            if line.startswith("#") and re.match(r"#{1,6}\s", line):
                if lines:
                    out.append("\n".join(lines))
                lines = [line]
            else:
                lines.append(line)
        block = "\n".join(lines).strip("\n")
        if block.strip():
            out.append(block)
    return out


def _split(block: str, limit: int) -> list[str]:
    """A block over ``limit`` characters as its lines, and a line over it cut at spaces."""
    if len(block) <= limit:
        return [block]
    return [piece for line in block.split("\n") for piece in _split_line(line, limit)]


def _split_line(line: str, limit: int) -> list[str]:
    if len(line) <= limit:
        return [line]
    out: list[str] = []
    while len(line) > limit:
        cut = line.rfind(" ", limit // 2, limit)
        cut = cut if cut > 0 else limit  # one long word: cut it
        out.append(line[:cut])
        line = line[cut:].lstrip(" ")
    if line:
        out.append(line)
    return out
