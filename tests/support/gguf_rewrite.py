"""Test helper: a copy of a real GGUF model with another chat template, patched bytes, or keys and
tensors changed (``rewrite_gguf``).

Rewrites only the header (the template's length-prefixed string) and re-pads it to the file's
alignment; tensor offsets are relative to the data section, so the data is copied verbatim.
"""

from __future__ import annotations

import shutil
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.core.library.gguf import read_header

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


# -- same-size rewrites in place (one value of a copy's header) ---------------------------------


def _value_at(head: bytes, key: str) -> int:
    """Offset of the value of metadata ``key`` (after its name and u32 value type)."""
    k = key.encode()
    return head.index(struct.pack("<Q", len(k)) + k) + 8 + len(k) + 4


def patch_copy(src: Path, dst: Path, edits: list[tuple[int, bytes]]) -> Path:
    """A copy of ``src`` with ``bytes`` written at each offset (same-size edits only)."""
    shutil.copyfile(src, dst)
    with dst.open("r+b") as f:
        for at, raw in edits:
            f.seek(at)
            f.write(raw)
    return dst


def header_bytes(src: Path) -> bytes:
    with src.open("rb") as f:
        return f.read(read_header(src).data_offset)


def value_offset(src: Path, key: str) -> int:
    """Where metadata ``key``'s value starts (a scalar, or a string's u64 length)."""
    return _value_at(header_bytes(src), key)


def tensor_type_offset(src: Path, name: str) -> int:
    """Where tensor ``name``'s ggml type (u32) is in the tensor infos."""
    head = header_bytes(src)
    n = name.encode()
    at = head.index(struct.pack("<Q", len(n)) + n) + 8 + len(n)
    (n_dims,) = struct.unpack_from("<I", head, at)
    return at + 4 + 8 * n_dims


def token_offsets(src: Path, count: int) -> list[tuple[int, bytes]]:
    """(offset of the string's bytes, the bytes) of the first ``count`` tokens."""
    head = header_bytes(src)
    pos = _value_at(head, "tokenizer.ggml.tokens") + 4 + 8  # after element type and count
    out = []
    for _ in range(count):
        (n,) = struct.unpack_from("<Q", head, pos)
        out.append((pos + 8, head[pos + 8 : pos + 8 + n]))
        pos += 8 + n
    return out


def rewrite_gguf(
    src: Path,
    dst: Path,
    *,
    value: Callable[[str, Any], Any] = lambda _name, v: v,
    drop: Callable[[str], bool] = lambda _name: False,
    add: Callable[[Any, Any], None] = lambda _reader, _writer: None,
) -> Path:
    """A copy of ``src`` written again with the ``gguf`` package: every key (its ``value``
    changed by ``value(name, value)``, or left out where ``drop(name)``) and every tensor, then
    what ``add(reader, writer)`` writes (keys, tensors)."""
    import gguf

    reader = gguf.GGUFReader(src)
    arch = str(reader.fields["general.architecture"].contents())
    writer = gguf.GGUFWriter(dst, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or drop(name):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, value(name, field.contents()), vtype, sub_type=sub)
    for t in reader.tensors:
        # t.data: the element array (F32) or the raw bytes by row (quantized), as written
        writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    add(reader, writer)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst
