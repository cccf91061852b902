"""Chunk vectors of attached files, kept per (embedding model, file content, chunker): in
memory (the last :data:`MEMORY_FILES` files) and, given a folder, on disk as float32 files,
so a file attached again (or after a restart) is not embedded again.
Tested by tests/core/workspace/test_attachments.py and tests/runtimes/llama/test_retrieval_real.py."""

from __future__ import annotations

import hashlib
import json
import logging
import struct
import sys
from array import array
from collections import OrderedDict
from pathlib import Path
from typing import Any

from app.core.util.fsutil import atomic_write_bytes

log = logging.getLogger(__name__)

MEMORY_FILES = 64
_HEADER = struct.Struct("<4sII")  # magic, vectors, dimensions
_MAGIC = b"HVC1"


def cache_key(*parts: Any) -> str:
    """A file name safe key for ``parts`` (JSON-able)."""
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


class VectorCache:
    """``get``/``put`` lists of vectors by key; ``folder`` None keeps them in memory only."""

    def __init__(self, folder: Path | None = None) -> None:
        self.folder = folder
        self._memory: OrderedDict[str, list[list[float]]] = OrderedDict()
        self.disk_reads = 0  # what the tests watch: a hit from disk, not a re-embed

    def get(self, key: str) -> list[list[float]] | None:
        """The vectors stored under ``key`` (blocking on a disk read: call it off the loop)."""
        hit = self._memory.get(key)
        if hit is not None:
            self._memory.move_to_end(key)
            return hit
        if self.folder is None:
            return None
        try:
            data = (self.folder / f"{key}.vec").read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            log.warning("vector cache: cannot read %s: %s", key, e)
            return None
        vectors = _decode(data)
        if vectors is None:
            log.warning("vector cache: %s is damaged; embedding again", key)
            return None
        self.disk_reads += 1
        self._remember(key, vectors)
        return vectors

    def put(self, key: str, vectors: list[list[float]]) -> None:
        """Keep ``vectors`` (a failing disk costs the cache, never the chat)."""
        self._remember(key, vectors)
        if self.folder is None or not vectors:
            return
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(self.folder / f"{key}.vec", _encode(vectors))
        except OSError as e:
            log.warning("vector cache: cannot write %s: %s", key, e)

    def _remember(self, key: str, vectors: list[list[float]]) -> None:
        self._memory[key] = vectors
        self._memory.move_to_end(key)
        while len(self._memory) > MEMORY_FILES:
            self._memory.popitem(last=False)


def _encode(vectors: list[list[float]]) -> bytes:
    dim = len(vectors[0])
    flat = array("f", (x for v in vectors for x in v))
    if sys.byteorder == "big":
        flat.byteswap()  # the file is little-endian everywhere
    return _HEADER.pack(_MAGIC, len(vectors), dim) + flat.tobytes()


def _decode(data: bytes) -> list[list[float]] | None:
    if len(data) < _HEADER.size:
        return None
    magic, n, dim = _HEADER.unpack_from(data)
    body = data[_HEADER.size :]
    if magic != _MAGIC or dim == 0 or len(body) != n * dim * 4:
        return None
    flat = array("f")
    flat.frombytes(body)
    if sys.byteorder == "big":
        flat.byteswap()
    return [flat[i * dim : (i + 1) * dim].tolist() for i in range(n)]
