"""Files attached to a chat: text, code, Markdown and PDF read into text.

A file is read once, when it is attached, into an :class:`Attachment`: its text per page (one
page for anything but a PDF) and the hash of its bytes, which keys the embedding cache. What
Hearth cannot read as text is refused with :class:`~app.errors.UnreadableAttachment` naming
the file and the reason.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from app.errors import UnreadableAttachment

log = logging.getLogger(__name__)

MAX_FILE_BYTES = 16 * 1024 * 1024  # a file bigger than this is refused before it is read
MAX_TEXT_CHARS = 1_000_000  # text after extraction (~250k tokens): more is refused
BINARY_SNIFF_BYTES = 8192  # a NUL or many control bytes in the first 8 KB: not text

Kind = Literal["text", "code", "markdown", "pdf"]

MARKDOWN_SUFFIXES = frozenset({".md", ".markdown", ".mdown", ".mkd", ".rst"})
CODE_SUFFIXES = frozenset(
    ".py .pyi .js .jsx .ts .tsx .mjs .c .h .cc .cpp .hpp .cs .java .kt .go .rs .rb .php .swift "
    ".m .mm .scala .sh .bash .zsh .ps1 .bat .sql .r .lua .pl .hs .ex .exs .clj .dart .vue "
    ".svelte .html .htm .css .scss .json .jsonl .yaml .yml .toml .ini .cfg .xml .csv .tsv "
    ".dockerfile .makefile .cmake .gradle .proto .graphql .tex".split()
)


@dataclass(frozen=True, slots=True)
class Page:
    """A PDF page's text (``number`` from 1), or a whole text file (``number`` None)."""

    number: int | None
    text: str


@dataclass(frozen=True, slots=True)
class Attachment:
    """A file read into text. ``digest``: sha256 of the bytes read (the embedding cache key)."""

    name: str
    kind: Kind
    size_bytes: int
    pages: tuple[Page, ...]
    digest: str
    encoding: str = "utf-8"

    @property
    def chars(self) -> int:
        return sum(len(p.text) for p in self.pages)

    def text(self) -> str:
        """The whole text; a PDF's pages each under a ``[page N]`` line."""
        if self.kind != "pdf":
            return "".join(p.text for p in self.pages)
        return "\n\n".join(f"[page {p.number}]\n{p.text}" for p in self.pages if p.text)


def kind_of(name: str) -> Kind:
    suffix = Path(name).suffix.lower()
    if suffix == ".pdf":
        return "pdf"
    if suffix in MARKDOWN_SUFFIXES:
        return "markdown"
    if suffix in CODE_SUFFIXES or Path(name).name.lower() in ("makefile", "dockerfile"):
        return "code"
    return "text"


def read_attachment(path: str | Path) -> Attachment:
    """Read ``path`` (blocking: call it off the event loop).

    Raises:
        UnreadableAttachment: not a file, over :data:`MAX_FILE_BYTES`, binary, a PDF that is
            encrypted, damaged or has no text layer, or text over :data:`MAX_TEXT_CHARS`.
    """
    p = Path(path)
    try:
        size = p.stat().st_size
        if not p.is_file():
            raise UnreadableAttachment(f"{p.name} is not a file", param="file")
        if size > MAX_FILE_BYTES:
            raise UnreadableAttachment(
                f"{p.name} is {size / 2**20:.1f} MiB; files of at most "
                f"{MAX_FILE_BYTES // 2**20} MiB can be attached",
                param="file",
            )
        data = p.read_bytes()
    except OSError as e:
        raise UnreadableAttachment(f"cannot read {p.name}: {e.strerror or e}", param="file") from e
    if kind_of(p.name) == "pdf" or data.startswith(b"%PDF-"):
        return _checked(Attachment(p.name, "pdf", size, _pdf_pages(p.name, data), _sha(data)))
    return attachment_from_bytes(p.name, data)


def attachment_from_bytes(name: str, data: bytes) -> Attachment:
    """A text file's bytes as an attachment: UTF-8 (a BOM allowed), else Windows-1252.

    Raises:
        UnreadableAttachment: binary data, or text over :data:`MAX_TEXT_CHARS`.
    """
    if looks_binary(data):
        raise UnreadableAttachment(
            f"{name} is a binary file, not text: attach text, code, Markdown or PDF files",
            param="file",
        )
    encoding = "utf-8"
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        # legacy editors' files: cp1252 reads every Latin text; undefined bytes become U+FFFD
        encoding = "cp1252"
        text = data.decode("cp1252", errors="replace")
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    page = Page(None, text)
    return _checked(Attachment(name, kind_of(name), len(data), (page,), _sha(data), encoding))


def attachment_from_text(name: str, text: str) -> Attachment:
    """Pasted text as an attachment (``name`` e.g. ``pasted-1.txt``)."""
    data = text.encode("utf-8", errors="surrogatepass")
    page = Page(None, text.replace("\r\n", "\n"))
    return _checked(Attachment(name, kind_of(name), len(data), (page,), _sha(data)))


def looks_binary(data: bytes) -> bool:
    """A NUL byte, or over 10% control bytes (other than tab, newline, CR, FF), early on."""
    head = data[:BINARY_SNIFF_BYTES]
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):  # UTF-16 text: not read, said as binary
        return True
    if b"\x00" in head:
        return True
    controls = sum(1 for b in head if b < 32 and b not in (9, 10, 12, 13))
    return bool(head) and controls * 10 > len(head)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _checked(a: Attachment) -> Attachment:
    if a.chars > MAX_TEXT_CHARS:
        raise UnreadableAttachment(
            f"{a.name} has {a.chars:,} characters of text; at most {MAX_TEXT_CHARS:,} can be "
            f"attached",
            param="file",
        )
    return a


def _pdf_pages(name: str, data: bytes) -> tuple[Page, ...]:
    """Each page's text, numbered from 1 (pypdf)."""
    import io

    from pypdf import PdfReader
    from pypdf.errors import DependencyError, PdfReadError, PyPdfError

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            # an empty user password still lets anyone read some "protected" files
            try:
                ok = bool(reader.decrypt(""))
            except (PyPdfError, DependencyError, NotImplementedError) as e:  # AES: cryptography
                log.info("%s: cannot decrypt: %s", name, e)
                ok = False
            if not ok:
                raise UnreadableAttachment(
                    f"{name} is an encrypted (password-protected) PDF; save an unprotected copy "
                    f"and attach that",
                    param="file",
                )
        pages = tuple(
            Page(i, (page.extract_text() or "").strip()) for i, page in enumerate(reader.pages, 1)
        )
    except UnreadableAttachment:
        raise
    except (PdfReadError, PyPdfError, DependencyError, ValueError, KeyError, TypeError) as e:
        raise UnreadableAttachment(f"{name} is not a readable PDF ({e})", param="file") from e
    if not any(p.text for p in pages):
        raise UnreadableAttachment(
            f"{name} has no text layer (a scanned or image-only PDF); Hearth does not read text "
            f"from images: attach a PDF with selectable text",
            param="file",
        )
    return pages
