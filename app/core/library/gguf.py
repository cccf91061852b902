"""A bounds-checked GGUF header reader.

Every count, length and offset is checked against the file's size before it is used, so a
malformed file (bad magic, absurd counts, offsets past the end, truncation) is refused here with
``InvalidModel`` before it reaches a native loader.
"""

from __future__ import annotations

import mmap
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.errors import InvalidModel

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
MAX_TENSORS = 1_000_000
MAX_KV = 100_000
MAX_DIMS = 4
MAX_STRING = 64 * 1024 * 1024  # a chat template or token can't sensibly be larger
MAX_ARRAY = 50_000_000
# Arrays longer than this are checked and skipped, not materialized (token lists, merges).
KEEP_ARRAY = 64
POOLING_RANK = 4  # llama.h: LLAMA_POOLING_TYPE_RANK (cross-encoders)

FIRST_SHARD_RE = re.compile(r"^(?P<stem>.+)-00001-of-(?P<n>\d{5})\.gguf$", re.IGNORECASE)
QUANT_RE = re.compile(
    r"(?<![A-Za-z0-9])("
    r"UD-(?:IQ|Q)\d[A-Z0-9_]*"
    r"|IQ[1-4]_(?:XXS|XS|NL|S|M)"
    r"|Q[2-8]_K(?:_(?:XL|S|M|L))?"
    r"|Q[4-8]_[01]"
    r"|TQ[12]_0|MXFP4|BF16|F16|F32|FP16|FP32"
    r")(?![A-Za-z0-9])",
    re.IGNORECASE,
)


def quant_of(filename: str) -> str | None:
    """The quantization named in a file name (``Q4_K_M``, ``IQ4_XS``, ``BF16``...), uppercased."""
    base = filename.rsplit("/", 1)[-1]
    m = QUANT_RE.search(base)
    if not m:
        return None
    q = m.group(1).upper()
    return {"FP16": "F16", "FP32": "F32"}.get(q, q)


# GGUF value types
_U8, _I8, _U16, _I16, _U32, _I32, _F32, _BOOL, _STR, _ARR, _U64, _I64, _F64 = range(13)
_SCALAR = {
    _U8: "<B",
    _I8: "<b",
    _U16: "<H",
    _I16: "<h",
    _U32: "<I",
    _I32: "<i",
    _F32: "<f",
    _BOOL: "<?",
    _U64: "<Q",
    _I64: "<q",
    _F64: "<d",
}

# ggml tensor types: (block size in elements, bytes per block)
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18),
    21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
}

# general.file_type -> the quantization name people search for
FILE_TYPES = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    7: "Q8_0",
    8: "Q5_0",
    9: "Q5_1",
    10: "Q2_K",
    11: "Q3_K_S",
    12: "Q3_K_M",
    13: "Q3_K_L",
    14: "Q4_K_S",
    15: "Q4_K_M",
    16: "Q5_K_S",
    17: "Q5_K_M",
    18: "Q6_K",
    19: "IQ2_XXS",
    20: "IQ2_XS",
    21: "Q2_K_S",
    22: "IQ3_XS",
    23: "IQ3_XXS",
    24: "IQ1_S",
    25: "IQ4_NL",
    26: "IQ3_S",
    27: "IQ3_M",
    28: "IQ2_S",
    29: "IQ2_M",
    30: "IQ4_XS",
    31: "IQ1_M",
    32: "BF16",
    36: "TQ1_0",
    37: "TQ2_0",
    38: "MXFP4",
}


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int
    n_bytes: int

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True, slots=True)
class GGUFHeader:
    version: int
    metadata: dict[str, Any]
    array_lengths: dict[str, int]
    tensors: tuple[TensorInfo, ...]
    data_offset: int
    file_size: int
    extra: dict[str, Any] = field(default_factory=dict)
    # key -> (element type, file offset of its first element): arrays are read lazily from here
    array_offsets: dict[str, tuple[int, int]] = field(default_factory=dict)
    # key -> GGUF value type, for values a loader reads with a fixed type
    value_types: dict[str, int] = field(default_factory=dict)

    @property
    def architecture(self) -> str | None:
        arch = self.metadata.get("general.architecture")
        return arch if isinstance(arch, str) else None

    def arch_value(self, key: str) -> Any:
        arch = self.architecture
        return self.metadata.get(f"{arch}.{key}") if arch else None

    @property
    def context_length(self) -> int | None:
        v = self.arch_value("context_length")
        return int(v) if isinstance(v, int) else None

    @property
    def parameters(self) -> int:
        return sum(t.n_elements for t in self.tensors)

    @property
    def chat_template(self) -> str | None:
        v = self.metadata.get("tokenizer.chat_template")
        return v if isinstance(v, str) and v.strip() else None

    @property
    def quantization(self) -> str | None:
        ft = self.metadata.get("general.file_type")
        if isinstance(ft, int) and ft in FILE_TYPES:
            return FILE_TYPES[ft]
        # no file_type: name the most common weight type by bytes
        by_type: dict[int, int] = {}
        for t in self.tensors:
            by_type[t.ggml_type] = by_type.get(t.ggml_type, 0) + t.n_bytes
        if not by_type:
            return None
        best = max(by_type, key=lambda k: by_type[k])
        return GGML_TYPES.get(best, (f"type{best}", 0, 0))[0]

    @property
    def is_embedding_model(self) -> bool:
        arch = self.architecture or ""
        return arch in {"bert", "nomic-bert", "jina-bert-v2", "t5encoder"} or (
            self.arch_value("pooling_type") not in (None, 0)
        )

    @property
    def is_reranker(self) -> bool:
        """A cross-encoder: rank pooling (llama.h's LLAMA_POOLING_TYPE_RANK) makes one
        relevance score per sequence instead of an embedding."""
        return self.arch_value("pooling_type") == POOLING_RANK


class TruncatedHeader(InvalidModel):
    """The header runs past the bytes given, but not past the file: read more and parse again.

    Raised only when ``parse_header`` gets the beginning of a larger file (``file_size``).
    """

    def __init__(self, message: str, *, needed: int) -> None:
        super().__init__(message)
        self.needed = needed  # a lower bound on the bytes the header needs


class _Reader:
    def __init__(self, buf: mmap.mmap | bytes, size: int, file_size: int | None = None) -> None:
        self.buf = buf
        self.size = size
        self.pos = 0
        self.file_size = file_size
        self.arrays: dict[str, tuple[int, int]] = {}

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            if n >= 0 and self.file_size is not None and self.pos + n <= self.file_size:
                raise TruncatedHeader(
                    f"GGUF header: {what} lies past the {self.size} bytes read",
                    needed=self.pos + n,
                )
            raise InvalidModel(
                f"invalid GGUF: {what} runs past the end of the file (offset {self.pos})"
            )

    def unpack(self, fmt: str, what: str) -> Any:
        n = struct.calcsize(fmt)
        self.need(n, what)
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return v

    def string(self, what: str) -> str:
        n = self.unpack("<Q", what)
        if n > MAX_STRING:
            raise InvalidModel(f"invalid GGUF: {what} has an absurd length ({n})")
        self.need(n, what)
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def skip_string(self, what: str) -> None:
        n = self.unpack("<Q", what)
        if n > MAX_STRING:
            raise InvalidModel(f"invalid GGUF: {what} has an absurd length ({n})")
        self.need(n, what)
        self.pos += n

    def value(self, vtype: int, key: str, *, depth: int = 0) -> tuple[Any, int | None]:
        """Read one value; returns (value, array length or None)."""
        if vtype in _SCALAR:
            return self.unpack(_SCALAR[vtype], key), None
        if vtype == _STR:
            return self.string(key), None
        if vtype == _ARR:
            if depth > 2:
                raise InvalidModel(f"invalid GGUF: nested arrays too deep at {key!r}")
            etype = self.unpack("<I", key)
            count = self.unpack("<Q", key)
            if count > MAX_ARRAY:
                raise InvalidModel(f"invalid GGUF: array {key!r} has an absurd length ({count})")
            if depth == 0:
                self.arrays[key] = (etype, self.pos)
            if etype in _SCALAR:
                width = struct.calcsize(_SCALAR[etype])
                self.need(count * width, f"array {key!r}")
                if count <= KEEP_ARRAY:
                    vals = list(
                        struct.unpack_from(f"<{count}{_SCALAR[etype][1]}", self.buf, self.pos)
                    )
                else:
                    vals = None
                self.pos += count * width
                return vals, count
            if etype == _STR:
                if count <= KEEP_ARRAY:
                    return [self.string(key) for _ in range(count)], count
                for _ in range(count):
                    self.skip_string(key)
                return None, count
            if etype == _ARR:
                items = [self.value(_ARR, key, depth=depth + 1)[0] for _ in range(count)]
                return (items if count <= KEEP_ARRAY else None), count
            raise InvalidModel(f"invalid GGUF: unknown array element type {etype} at {key!r}")
        raise InvalidModel(f"invalid GGUF: unknown value type {vtype} at {key!r}")


def parse_header(data: bytes | mmap.mmap, file_size: int | None = None) -> GGUFHeader:
    """Parse and validate a GGUF header from ``data``.

    ``file_size`` is the whole file's size when ``data`` holds only its beginning (a remote
    header read with an HTTP Range request): then tensor offsets are checked against it and a
    header that runs past ``data`` raises TruncatedHeader (an InvalidModel): read more bytes.

    Raises:
        TruncatedHeader: ``data`` ends inside the header but ``file_size`` says the file goes on.
        InvalidModel: the header is malformed.
    """
    size = len(data)
    r = _Reader(data, size, file_size if file_size is not None and file_size > size else None)
    r.need(4, "magic")
    if bytes(data[0:4]) != MAGIC:
        raise InvalidModel("invalid GGUF: bad magic (not a GGUF file)")
    r.pos = 4
    version = r.unpack("<I", "version")
    if version not in SUPPORTED_VERSIONS:
        raise InvalidModel(f"invalid GGUF: unsupported version {version}")
    n_tensors = r.unpack("<Q", "tensor count")
    n_kv = r.unpack("<Q", "metadata count")
    if n_tensors > MAX_TENSORS:
        raise InvalidModel(f"invalid GGUF: absurd tensor count ({n_tensors})")
    if n_kv > MAX_KV:
        raise InvalidModel(f"invalid GGUF: absurd metadata count ({n_kv})")
    metadata: dict[str, Any] = {}
    lengths: dict[str, int] = {}
    vtypes: dict[str, int] = {}
    for _ in range(n_kv):
        key = r.string("metadata key")
        vtype = r.unpack("<I", f"type of {key!r}")
        vtypes[key] = vtype
        if key == "general.alignment" and vtype != _U32:
            # llama.cpp reads it as u32 and aborts the process on any other type
            raise InvalidModel("invalid GGUF: general.alignment must be a u32")
        val, count = r.value(vtype, key)
        if count is not None:
            lengths[key] = count
        metadata[key] = val
    tensors = []
    names = set()
    for _ in range(n_tensors):
        name = r.string("tensor name")
        n_dims = r.unpack("<I", f"dims of tensor {name!r}")
        if n_dims == 0 or n_dims > MAX_DIMS:
            raise InvalidModel(f"invalid GGUF: tensor {name!r} has {n_dims} dimensions")
        shape = tuple(r.unpack("<Q", f"shape of tensor {name!r}") for _ in range(n_dims))
        ttype = r.unpack("<I", f"type of tensor {name!r}")
        offset = r.unpack("<Q", f"offset of tensor {name!r}")
        if ttype not in GGML_TYPES:
            raise InvalidModel(f"invalid GGUF: tensor {name!r} has unknown type {ttype}")
        if name in names:
            raise InvalidModel(f"invalid GGUF: duplicate tensor {name!r}")
        names.add(name)
        n_el = 1
        for d in shape:
            if d == 0 or d > 1 << 40:
                raise InvalidModel(f"invalid GGUF: tensor {name!r} has an absurd shape {shape}")
            n_el *= d
            if n_el > 1 << 48:
                raise InvalidModel(f"invalid GGUF: tensor {name!r} is absurdly large")
        _, blk, blk_bytes = GGML_TYPES[ttype]
        if shape[0] % blk:
            raise InvalidModel(f"invalid GGUF: tensor {name!r} row is not a whole number of blocks")
        n_bytes = n_el // blk * blk_bytes
        tensors.append(TensorInfo(name, shape, ttype, offset, n_bytes))
    alignment = metadata.get("general.alignment", 32)
    if (
        not isinstance(alignment, int)
        or alignment <= 0
        or alignment & (alignment - 1)
        or alignment > 1 << 20
    ):
        raise InvalidModel(f"invalid GGUF: bad alignment {alignment!r}")
    data_offset = (r.pos + alignment - 1) // alignment * alignment
    total = file_size if file_size is not None else size
    for t in tensors:
        if t.offset % alignment:
            raise InvalidModel(f"invalid GGUF: tensor {t.name!r} is misaligned")
        if data_offset + t.offset + t.n_bytes > total:
            raise InvalidModel(
                f"invalid GGUF: tensor {t.name!r} data lies past the end of the file (truncated?)"
            )
    return GGUFHeader(
        version=version,
        metadata=metadata,
        array_lengths=lengths,
        tensors=tuple(tensors),
        data_offset=data_offset,
        file_size=total,
        array_offsets=r.arrays,
        value_types=vtypes,
    )


def read_header(path: str | Path) -> GGUFHeader:
    """Read and validate the GGUF header of the file at ``path``.

    Raises:
        InvalidModel: the file is missing, empty or malformed.
    """
    p = Path(path)
    try:
        with p.open("rb") as f:
            size = p.stat().st_size
            if size < 24:
                raise InvalidModel(
                    f"invalid GGUF: {p.name} is too small to be a model ({size} bytes)"
                )
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                return parse_header(mm)
    except OSError as e:
        raise InvalidModel(f"cannot read {p}: {e.strerror or e}") from e


def shard_siblings(path: Path) -> list[Path]:
    """All shards of a split GGUF given its first shard (``-00001-of-0000N``); else ``[path]``."""
    m = FIRST_SHARD_RE.match(path.name)
    if not m:
        return [path]
    n = int(m["n"])
    return [path.with_name(f"{m['stem']}-{i:05d}-of-{n:05d}.gguf") for i in range(1, n + 1)]
