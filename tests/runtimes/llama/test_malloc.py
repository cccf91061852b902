"""Large blocks freed go back to the system once llama.cpp's backend is up (glibc only).

glibc raises its mmap threshold to the size of each large block freed (up to 32 MiB); after
that, blocks below it come from the heap and stay there when freed. Hearth fixes the threshold
at backend init (app/runtimes/llama/backend._fix_mmap_threshold). Each case runs in a child
process, so the allocator starts fresh and nothing else in the test process moves its RSS."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")

CHILD = """
import ctypes, sys
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
if sys.argv[1] == "hearth":
    from app.runtimes.llama.backend import ensure_backend
    ensure_backend()
def rss_mib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
big = libc.malloc(16 << 20)
libc.free(big)  # glibc (left alone) now serves blocks up to 16 MiB from the heap
blocks = []
for _ in range(200):
    p = libc.malloc(1 << 20)
    ctypes.memset(p, 1, 1 << 20)
    blocks.append(p)
pin = libc.malloc(300 << 10)  # a live block above them (from the top): the heap cannot shrink past it
before = rss_mib()
for p in blocks:
    libc.free(p)
print(before - rss_mib())
"""


def returned_mib(mode: str) -> float:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return float(out.stdout.strip().splitlines()[-1])


def test_blocks_freed_after_the_backend_starts_go_back_to_the_system() -> None:
    # 200 MiB in 1 MiB blocks, freed: with the fixed threshold each was its own mapping
    assert returned_mib("hearth") > 150
    # the same without Hearth's backend: they stay in the heap (what the fix is for)
    assert returned_mib("plain") < 50
