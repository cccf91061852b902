"""llama.cpp's process-wide side: the import, backend init with native logs routed to logging,
returning freed memory to the system, the core count, flash-attention choice and build info.
Tested by tests/runtimes/llama/test_runtime.py, tests/runtimes/llama/test_probe.py and
tests/runtimes/llama/test_backend_load.py."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import sys
import threading
from pathlib import Path
from typing import Any

from app.errors import RuntimeUnavailable

try:
    import llama_cpp as L
except ImportError:  # pragma: no cover - the package is a hard dependency; be explicit anyway
    L = None  # type: ignore[assignment]

_init_lock = threading.Lock()
_initialized = False
_LOG_CB: Any = None
# ggml levels: 1 debug, 2 info (chatty: shown as debug), 3 warn, 4 error, 5 continuation
_LEVELS = {3: logging.WARNING, 4: logging.ERROR}
_native_log = logging.getLogger("llama_cpp.native")
log = logging.getLogger(__name__)
# the ggml library that holds the backend registry, by platform (llama_cpp/lib has the same names)
_GGML_NAMES = {"linux": "libggml.so", "darwin": "libggml.dylib", "win32": "ggml.dll"}


# what llama.cpp logs as a warning or error when a decode is stopped on purpose (an arriving
# keystroke, admission.py's Interrupts, or a cancel): GGML_STATUS_ABORTED is 1; a debug line here
_STOPPED = (
    b"failed with error 1\n",
    b"compute status: 1\n",
    b"failed to decode, ret = 2\n",
    b"removing memory module entries",
)


def _on_native_log(level: int, text: bytes, _data: object) -> None:
    if level in (3, 4) and any(s in text for s in _STOPPED):
        level = 1
    if level in (3, 4) or _native_log.isEnabledFor(logging.DEBUG):
        msg = text.decode("utf-8", errors="replace").rstrip()
        if msg:
            _native_log.log(_LEVELS.get(level, logging.DEBUG), "%s", msg)


def ensure_backend() -> None:
    global _initialized, _LOG_CB
    with _init_lock:
        if _initialized:
            return
        if L is None:
            raise RuntimeUnavailable("llama-cpp-python is not installed")
        _LOG_CB = L.llama_log_callback(_on_native_log)  # keep a reference: C holds the pointer
        L.llama_log_set(_LOG_CB, None)
        _load_backend_libraries()
        L.llama_backend_init()
        _fix_mmap_threshold()
        _initialized = True
        log.info("llama.cpp CPU backend: %s", cpu_backend_library() or "unknown")


def lib_dir() -> Path:
    """llama-cpp-python's folder of native libraries (llama_cpp/lib)."""
    return Path(L.__file__).resolve().parent / "lib"


def _load_backend_libraries() -> None:
    """Load llama.cpp's backends from llama_cpp/lib when it was built with GGML_BACKEND_DL.

    Such a build (how the installers ship it) has no backend linked in: the CPU backend is one
    library per x86-64 level (libggml-cpu-haswell.so, ...) and ggml picks the best one this CPU
    runs. llama_backend_init searches only beside the executable and the current folder, never
    llama_cpp/lib, so it would find none. A build without it (pip's default, a dev venv) has its
    backends registered already and is left alone."""
    ggml = _ggml_of_libllama()
    if ggml is None:
        return
    ggml.ggml_backend_reg_count.restype = ctypes.c_size_t
    if ggml.ggml_backend_reg_count() > 0:
        return
    ggml.ggml_backend_load_all_from_path.argtypes = [ctypes.c_char_p]
    ggml.ggml_backend_load_all_from_path(os.fsencode(lib_dir()))
    if ggml.ggml_backend_reg_count() == 0:
        raise RuntimeUnavailable(
            f"llama.cpp found no backend library for this computer in {lib_dir()}"
        )


def _ggml_of_libllama() -> Any:
    """The libggml that libllama runs with, or None. It is the copy loaded as libllama's
    dependency, by its soname (libggml.so.0): a wheel stores libggml.so as another copy of the
    file, and backends registered in that one would be invisible to llama.cpp."""
    lib = lib_dir()
    if sys.platform.startswith("linux"):
        for p in sorted(lib.glob("libggml.so.*"), key=lambda p: len(p.name)):
            with contextlib.suppress(OSError):  # already loaded (libllama needs it): no new copy
                return ctypes.CDLL(p.name, mode=os.RTLD_NOLOAD | os.RTLD_LOCAL)
    name = _GGML_NAMES.get("linux" if sys.platform.startswith("linux") else sys.platform)
    path = lib / name if name else None
    return ctypes.CDLL(str(path)) if path is not None and path.is_file() else None


def cpu_backend_library() -> str:
    """The file name of the CPU backend this process runs (libggml-cpu-haswell.so for a build
    with one library per CPU level, libggml-cpu.so for one built in), or "" where unknown
    (not Linux). Read from the process's mapped files: ggml itself does not say which."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return ""
    names = {line.rsplit("/", 1)[-1] for line in maps.splitlines() if "/libggml-cpu" in line}
    return min(names, default="")


_LIBC: Any = None
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
MMAP_THRESHOLD = 256 << 10


def _libc() -> Any:
    """glibc, or False (not Linux, or a libc without its malloc calls)."""
    global _LIBC
    if _LIBC is None:
        _LIBC = False
        if sys.platform.startswith("linux"):
            with contextlib.suppress(OSError):
                lib = ctypes.CDLL("libc.so.6")
                if hasattr(lib, "malloc_trim") and hasattr(lib, "mallopt"):
                    _LIBC = lib
    return _LIBC


def _fix_mmap_threshold() -> None:
    """Blocks of 256 KiB and more come straight from the system and go back when freed.

    glibc otherwise raises its mmap threshold to the size of each large block freed (up to
    32 MiB), after which such blocks (llama.cpp's buffers, batches, logits) come from the heap,
    where a freed model's memory stays behind its neighbours: the soak's server held 52-106 MiB
    more after unloading every model than at the start (45 s of model churn)."""
    lib = _libc()
    if lib:
        lib.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)


def release_free_memory() -> None:
    """Give the memory a freed model leaves in malloc's arenas back to the system (glibc).

    Measured: without it, RSS after unloading grew by tens of MiB per model swap (allocator
    fragmentation across worker threads' arenas), so the memory page showed memory as used
    that nothing held; load/unload cycles plateau either way (not a leak)."""
    lib = _libc()
    if lib:  # not glibc (musl, macOS): nothing to trim this way
        lib.malloc_trim(0)


def physical_cores() -> int:
    """Physical cores (hyper-threads share execution units; llama.cpp gains nothing from them)."""
    seen = set()
    base = Path("/sys/devices/system/cpu")
    try:
        for cpu in base.glob("cpu[0-9]*"):
            sib = cpu / "topology" / "thread_siblings_list"
            if sib.is_file():
                seen.add(sib.read_text().strip())
    except OSError:
        seen = set()
    n = len(seen) or (os.cpu_count() or 1)
    return max(1, min(n, available_cpus()))  # within a CPU affinity mask (containers, taskset)


# With OpenMP (how llama.cpp's CPU threads run in pip's source builds), each thread that computes
# a graph keeps a team of threads for the process's life, and libgomp counts the teams of all
# contexts together: once they outnumber the CPUs, every barrier (one per graph node) sleeps
# instead of spinning. Measured on 2 cores with SmolLM2: after a second model (2 threads too)
# decoded once, the first decoded at 46-54 tok/s instead of 96-98, the second at 32; with the
# second on 1 thread, the first kept 102-107. So "auto" threads stay within what is left.
_omp_lock = threading.Lock()
_omp_held: dict[int, tuple[int, bool]] = {}  # live contexts: (threads beyond the caller, generates)


@functools.cache
def openmp_build() -> bool:
    ensure_backend()
    return "OPENMP = 1" in L.llama_print_system_info().decode(errors="replace")


def claim_threads(key: int, threads: int, *, generates: bool) -> int:
    """The threads a new context ``key`` computes with: ``threads``, or with 0 ("auto") the
    physical cores, in an OpenMP build only as many as keep all contexts' threads within the
    CPUs (at least 1). An embedding or reranking model leaves a chat model's threads free while
    none is loaded. ``release_threads(key)`` when the context is freed."""
    want = n = threads or physical_cores()
    budget = not threads and want > 1 and openmp_build()
    with _omp_lock:
        if budget:
            room = available_cpus() - 1 - sum(extra for extra, _ in _omp_held.values())
            if not generates and not any(gen for _, gen in _omp_held.values()):
                room -= want - 1  # a chat model's own
            n = max(1, min(want, 1 + room))
        _omp_held[key] = (n - 1, generates)
    return n


def release_threads(key: int) -> None:
    with _omp_lock:
        _omp_held.pop(key, None)


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def flash_attn_type(choice: str) -> int:
    """llama.cpp's flash-attention setting for ``auto`` / ``on`` / ``off``.

    ``auto`` means llama.cpp's own auto where a GPU backend exists, and off on CPU-only builds
    (llama-server's auto turns it on there). Measured in process on SmolLM2 Q4_1, 2 threads of
    an AMX Xeon, decode tok/s after a prompt of 37 / 197 / 560 / 1,461 / 2,188 tokens: on
    160-175 / 87-100 / 55-64 / 30-34 / 16-18, off 148-151 / 140-146 / 107-119 / 73 / 47; a
    follow-up turn's few rows over a long cache likewise (0.30 s on, 0.107 s off). llama.cpp's
    CPU kernel walks the cache a cell at a time, so every cell costs each decoded token. On
    wins only below ~100 cells and in reading long prompts (2,188 tokens: 10.5 s on, 12.4 s
    off).
    """
    if choice == "on":
        return 1
    if choice == "off":
        return 0
    if L.llama_supports_gpu_offload():
        return -1
    return 0


def build_info() -> str:
    ensure_backend()
    return (
        f"llama-cpp-python {L.__version__}; {L.llama_print_system_info().decode(errors='replace')}"
    )
