"""Tidy a PyInstaller bundle after the build, and measure what it needs from the system.

    python tidy_bundle.py BUNDLE                 one real file per shared library; no dangling links
    python tidy_bundle.py --glibc-floor BUNDLE   print the oldest glibc the bundle runs on

A wheel cannot hold links, so llama-cpp-python's libllama.so, libllama.so.0 and
libllama.so.0.5.0 arrive as three copies of one file: the copies become relative links to the
one the loader asks for (the soname, libllama.so.0). That also means one copy in memory: the
loader tells libraries apart by file, so libggml.so and libggml.so.0 as two files were two
libggml's, each with its own backend registry.

The glibc floor is the newest GLIBC_x.y symbol version that any ELF file in the bundle asks for
(readelf, from binutils): PyInstaller bundles no libc, so the user's must be at least that.
Standard library only: runs under the build's Python.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

SHARED = re.compile(r"^(lib.+?)\.so(\.\d+)*$")
SONAME_FORM = re.compile(r"\.so\.\d+$")  # libfoo.so.0: what NEEDED entries name
GLIBC = re.compile(r"Name: GLIBC_(\d+(?:\.\d+)+)")


def digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def keeper_rank(path: Path) -> tuple[int, int, str]:
    """The copy that stays: the soname form first, then the deepest (the package's own folder,
    where its RUNPATH $ORIGIN looks), then by name."""
    return (0 if SONAME_FORM.search(path.name) else 1, -len(path.parts), str(path))


def link_duplicates(bundle: Path) -> list[tuple[Path, Path]]:
    """Replace identical copies of a shared library with relative links to one of them."""
    groups: dict[tuple[str, int], list[Path]] = defaultdict(list)
    for p in bundle.rglob("*"):
        m = SHARED.match(p.name)
        if m and p.is_file() and not p.is_symlink():
            groups[(m.group(1), p.stat().st_size)].append(p)
    linked = []
    for paths in groups.values():
        if len(paths) < 2:
            continue
        by_digest: dict[str, list[Path]] = defaultdict(list)
        for p in paths:
            by_digest[digest(p)].append(p)
        for same in by_digest.values():
            keep, *copies = sorted(same, key=keeper_rank)
            for c in copies:
                c.unlink()
                c.symlink_to(os.path.relpath(keep, c.parent))
                linked.append((c, keep))
    return linked


def broken_links(bundle: Path) -> list[Path]:
    return sorted(p for p in bundle.rglob("*") if p.is_symlink() and not p.exists())


def is_elf(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def glibc_floor(bundle: Path) -> tuple[str, Path | None]:
    """The newest GLIBC_ version the bundle's ELF files need, and one file that needs it."""
    best: tuple[int, ...] = (2, 2, 5)  # x86-64's first glibc symbol version
    who = None
    for p in sorted(bundle.rglob("*")):
        if p.is_symlink() or not p.is_file() or not is_elf(p):
            continue
        out = subprocess.run(
            ["readelf", "--version-info", "-W", str(p)], capture_output=True, text=True
        ).stdout
        for v in GLIBC.findall(out):
            t = tuple(int(x) for x in v.split("."))
            if t > best:
                best, who = t, p
    return ".".join(map(str, best)), who


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--glibc-floor":
        floor, who = glibc_floor(Path(argv[1]))
        print(floor)
        if who is not None:
            print(f"glibc {floor} is needed by {who}", file=sys.stderr)
        return 0
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    bundle = Path(argv[0])
    linked = link_duplicates(bundle)
    saved = sum(keep.stat().st_size for _, keep in linked)
    print(f"tidy: {len(linked)} duplicate libraries now links ({saved / 2**20:.1f} MiB saved)")
    # PyInstaller adds top-level links to libraries it collected in a package folder, also to
    # those the spec then leaves out (Qt's EGLFS ones): nothing can load through them
    for p in broken_links(bundle):
        print(f"tidy: removed broken link {p.relative_to(bundle)} -> {os.readlink(p)}")
        p.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
