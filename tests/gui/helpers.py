"""Small helpers the GUI tests share (fixtures live in conftest.py)."""

from __future__ import annotations

import socket

SLOW = 180_000  # ms: model loads and generations on a small, possibly busy CI machine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
