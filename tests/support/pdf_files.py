"""Small PDF files written by hand for the attachment tests: text pages (Helvetica, one line
per text line), pages with no text (as a scan's would be), and encrypted copies (pypdf)."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path


def _escape(line: str) -> str:
    return line.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")


def pdf_bytes(pages: Sequence[Sequence[str]]) -> bytes:
    """A PDF with one page per entry, each line of the entry a line of text on it (an empty
    entry is a page with no text)."""
    objects: list[bytes] = []
    n = len(pages)
    # 1 catalog, 2 pages, 3 font, then (page, contents) per page
    kids = " ".join(f"{4 + 2 * i} 0 R" for i in range(n))
    objects.append(b"<< /Type /Catalog /Pages 2 0 R >>")
    objects.append(f"<< /Type /Pages /Kids [{kids}] /Count {n} >>".encode())
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    for i, lines in enumerate(pages):
        body = ""
        if lines:
            ops = " T* ".join(f"({_escape(line)}) Tj" for line in lines)
            body = f"BT /F1 9 Tf 11 TL 36 760 Td {ops} ET"
        stream = body.encode("latin-1")
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources "
            f"<< /Font << /F1 3 0 R >> >> /Contents {5 + 2 * i} 0 R >>".encode()
        )
        objects.append(f"<< /Length {len(stream)} >>\nstream\n".encode() + stream + b"\nendstream")
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n")
    offsets = []
    for k, obj in enumerate(objects, 1):
        offsets.append(out.tell())
        out.write(f"{k} 0 obj\n".encode() + obj + b"\nendobj\n")
    xref = out.tell()
    out.write(f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode())
    for off in offsets:
        out.write(f"{off:010d} 00000 n \n".encode())
    out.write(
        f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    )
    return out.getvalue()


def write_pdf(path: Path, pages: Sequence[Sequence[str]]) -> Path:
    path.write_bytes(pdf_bytes(pages))
    return path


def write_encrypted_pdf(path: Path, pages: Sequence[Sequence[str]], password: str) -> Path:
    """The same PDF, encrypted with a user password (RC4, which pypdf writes without extras)."""
    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(pdf_bytes(pages))))
    writer.encrypt(user_password=password, owner_password=password, algorithm="RC4-128")
    with path.open("wb") as f:
        writer.write(f)
    return path
