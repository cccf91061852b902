"""Small GGUF files for tests: valid ones from the ``gguf`` package's writer, and a raw byte
builder for malformed ones (every field under the test's control)."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

# GGUF value types (the spec's numbering)
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
_FMT = {
    U8: "<B",
    I8: "<b",
    U16: "<H",
    I16: "<h",
    U32: "<I",
    I32: "<i",
    F32: "<f",
    BOOL: "<?",
    U64: "<Q",
    I64: "<q",
    F64: "<d",
}

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def write_model(
    path: Path,
    *,
    arch: str = "llama",
    context_length: int | None = 2048,
    chat_template: str | None = CHATML,
    file_type: int | None = 7,
    name: str | None = "Tiny Test",
    big_q8: bool = True,
    tokens: int = 0,
) -> Path:
    """A small valid GGUF written by the reference writer.

    Tensors: ``tok_embd`` F32 (8 x 4 = 32 elements) and ``out`` Q8_0 (64 x 2 = 128 elements, or
    32 x 1 when ``big_q8`` is False so that F32 is the larger type by bytes).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(path, arch)
    if name is not None:
        w.add_name(name)
    if context_length is not None:
        w.add_context_length(context_length)
    w.add_block_count(2)
    if chat_template is not None:
        w.add_chat_template(chat_template)
    if file_type is not None:
        w.add_file_type(file_type)
    if tokens:
        w.add_token_list([f"tok{i}" for i in range(tokens)])
        w.add_token_scores([float(i) for i in range(tokens)])
    w.add_tensor("tok_embd", np.arange(32, dtype=np.float32).reshape(4, 8))
    rows = 2 if big_q8 else 1
    cols = 64 if big_q8 else 32
    q = gguf.quants.quantize(
        np.ones((rows, cols), dtype=np.float32), gguf.GGMLQuantizationType.Q8_0
    )
    w.add_tensor("out", q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# -- raw builder -------------------------------------------------------------------------------


def gstr(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def value(vtype: int, v: Any) -> bytes:
    """Encode one value of ``vtype``. Arrays: ``v = (element type, items)``."""
    if vtype in _FMT:
        return struct.pack(_FMT[vtype], v)
    if vtype == STR:
        return gstr(v)
    if vtype == ARR:
        etype, items = v
        return struct.pack("<IQ", etype, len(items)) + b"".join(value(etype, x) for x in items)
    raise ValueError(vtype)


def kv(key: str, vtype: int, v: Any) -> bytes:
    return gstr(key) + struct.pack("<I", vtype) + value(vtype, v)


@dataclass
class Tensor:
    name: str
    shape: Sequence[int]  # ggml order (ne0 first), as stored in the file
    ggml_type: int = 0  # F32
    offset: int | None = None  # None: packed after the previous tensor, aligned

    @property
    def n_bytes(self) -> int:
        try:
            blk, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(self.ggml_type)]
        except (ValueError, KeyError):  # a type the reference does not know: no data
            return 0
        n = 1
        for d in self.shape:
            n *= d
        return n // blk * size


def build(
    kvs: Sequence[bytes] = (),
    tensors: Sequence[Tensor] = (),
    *,
    magic: bytes = b"GGUF",
    version: int = 3,
    n_tensors: int | None = None,
    n_kv: int | None = None,
    alignment: int = 32,
    data: bytes | None = None,
) -> bytes:
    """Raw GGUF bytes. Counts default to the real ones; tensor data is zeros unless given."""
    out = bytearray(magic)
    out += struct.pack(
        "<IQQ",
        version,
        len(tensors) if n_tensors is None else n_tensors,
        len(kvs) if n_kv is None else n_kv,
    )
    for item in kvs:
        out += item
    pos = 0
    end = 0
    for t in tensors:
        off = (pos + alignment - 1) // alignment * alignment if t.offset is None else t.offset
        out += gstr(t.name) + struct.pack("<I", len(t.shape))
        out += b"".join(struct.pack("<Q", d) for d in t.shape)
        out += struct.pack("<IQ", t.ggml_type, off)
        pos = off + t.n_bytes
        end = max(end, pos)
    out += b"\0" * (-len(out) % alignment)
    out += data if data is not None else b"\0" * end
    return bytes(out)


def minimal(**kw: Any) -> bytes:
    """A small valid file: a llama arch with a context length and one F32 tensor."""
    kvs = kw.pop(
        "kvs", [kv("general.architecture", STR, "llama"), kv("llama.context_length", U32, 128)]
    )
    tensors = kw.pop("tensors", [Tensor("w", (8, 2))])
    return build(kvs, tensors, **kw)
