"""Test helper: a copy of a real GGUF model with another chat template.

Rewrites only the header (the template's length-prefixed string) and re-pads it to the file's
alignment; tensor offsets are relative to the data section, so the data is copied verbatim.
"""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

from app.core.gguf import read_header

KEY = b"tokenizer.chat_template"


def copy_with_template(src: Path, dst: Path, template: str) -> Path:
    header = read_header(src)
    alignment = header.metadata.get("general.alignment", 32)
    with src.open("rb") as f:
        head = f.read(header.data_offset)
    key_at = head.index(struct.pack("<Q", len(KEY)) + KEY)
    value_at = key_at + 8 + len(KEY) + 4  # after the key and its value type (u32)
    (old_len,) = struct.unpack_from("<Q", head, value_at)
    end_of_value = value_at + 8 + old_len
    # the header proper ends after the last tensor's info: name, n_dims, dims, type, offset
    last = header.tensors[-1]
    name = last.name.encode()
    at = head.rindex(struct.pack("<Q", len(name)) + name)
    body_end = at + 8 + len(name) + 4 + 8 * len(last.shape) + 4 + 8
    new = (
        head[:value_at]
        + struct.pack("<Q", len(template.encode()))
        + template.encode()
        + head[end_of_value:body_end]
    )
    pad = (-len(new)) % alignment
    with src.open("rb") as fin, dst.open("wb") as fout:
        fout.write(new + b"\0" * pad)
        fin.seek(header.data_offset)
        shutil.copyfileobj(fin, fout, 1 << 20)
    return dst
