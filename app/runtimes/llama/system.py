"""What this llama.cpp build can do here, from llama.cpp itself for ``hearth doctor``.

The backends and devices come from ggml's backend registry (``ggml_backend_dev_*``, through
ctypes on the libggml that llama-cpp-python ships: its Python bindings do not wrap them), the
CPU features from ``llama_print_system_info``, and the AMX verdict from the probe children's
record (``app.runtimes.llama.probe``).
Tested by tests/e2e/cli/test_doctor.py.
"""

from __future__ import annotations

import ctypes
import logging
import os
from pathlib import Path
from typing import Any

from app.runtimes.llama.backend import L, build_info, ensure_backend

log = logging.getLogger(__name__)

# enum ggml_backend_dev_type (ggml-backend.h)
_DEV_TYPES = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel", 4: "meta"}


def _ggml() -> Any:
    """libggml with the device functions' signatures declared (None where it cannot load)."""
    try:
        from llama_cpp import _ggml as g
    except (ImportError, OSError):
        return None
    lib = g.libggml
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    for name, res, args in (
        ("ggml_backend_dev_count", sz, []),
        ("ggml_backend_dev_get", vp, [sz]),
        ("ggml_backend_dev_name", ctypes.c_char_p, [vp]),
        ("ggml_backend_dev_description", ctypes.c_char_p, [vp]),
        ("ggml_backend_dev_type", ctypes.c_int, [vp]),
        ("ggml_backend_dev_memory", None, [vp, ctypes.POINTER(sz), ctypes.POINTER(sz)]),
        ("ggml_backend_dev_backend_reg", vp, [vp]),
        ("ggml_backend_reg_count", sz, []),
        ("ggml_backend_reg_get", vp, [sz]),
        ("ggml_backend_reg_name", ctypes.c_char_p, [vp]),
    ):
        fn = getattr(lib, name, None)
        if fn is None:
            return None
        fn.restype, fn.argtypes = res, args
    return lib


def _text(b: bytes | None) -> str:
    return (b or b"").decode("utf-8", errors="replace")


def devices() -> tuple[list[str], list[dict[str, Any]]]:
    """(backend names, devices as {name, description, type, backend, memory_bytes,
    free_bytes}) that this llama.cpp build registered."""
    lib = _ggml()
    if lib is None:
        return [], []
    backends = [
        _text(lib.ggml_backend_reg_name(lib.ggml_backend_reg_get(i)))
        for i in range(lib.ggml_backend_reg_count())
    ]
    out = []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        out.append(
            {
                "name": _text(lib.ggml_backend_dev_name(dev)),
                "description": _text(lib.ggml_backend_dev_description(dev)),
                "type": _DEV_TYPES.get(lib.ggml_backend_dev_type(dev), "unknown"),
                "backend": _text(lib.ggml_backend_reg_name(lib.ggml_backend_dev_backend_reg(dev))),
                "memory_bytes": int(total.value),
                "free_bytes": int(free.value),
            }
        )
    return backends, out


def llama_report() -> dict[str, Any]:
    """{available, reason, version, backends, system_info, devices, gpu_offload}."""
    if L is None:
        return {
            "available": False,
            "reason": "llama-cpp-python is not installed",
            "version": None,
            "backends": [],
            "system_info": "",
            "devices": [],
            "gpu_offload": False,
        }
    try:
        ensure_backend()
        backends, devs = devices()
        return {
            "available": True,
            "reason": "",
            "version": L.__version__,
            "backends": backends,
            "system_info": L.llama_print_system_info().decode(errors="replace").strip(),
            "devices": devs,
            "gpu_offload": bool(L.llama_supports_gpu_offload()),
        }
    except Exception as e:  # a broken native library: report it, do not crash the doctor
        log.exception("llama.cpp's system report failed")
        return {
            "available": False,
            "reason": f"llama.cpp failed to start: {e}",
            "version": getattr(L, "__version__", None),
            "backends": [],
            "system_info": "",
            "devices": [],
            "gpu_offload": False,
        }


def cpu_has_amx() -> bool:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return "amx_tile" in line.split()
    except OSError:
        pass
    return False


def amx_report(probe_file: Path | None) -> dict[str, Any]:
    """The probe's verdict on llama.cpp's extra buffer types (AMX and repacked weights) on
    this CPU and build: {cpu_has_amx, override, verdict, weight_types}.

    ``verdict``: "forced-on" / "forced-off" (HEARTH_LLAMA_EXTRA_BUFTS), "ok" (every weight type
    probed so far ran with them), "off" (a probe crashed with them: loads go without), or
    "not-probed" (no model was loaded on this CPU and build yet).
    """
    from app.core.util.fsutil import read_json
    from app.runtimes.llama.probe import ENV_OVERRIDE, probe_key

    forced = os.environ.get(ENV_OVERRIDE)
    seen: dict[str, bool] = {}
    if probe_file is not None and L is not None:
        try:
            known = read_json(probe_file, {})
        except (ValueError, OSError):
            known = {}
        info = build_info()
        for key, entry in known.items() if isinstance(known, dict) else ():
            if key.startswith("file:") or not isinstance(entry, dict):
                continue
            wt = str(entry.get("weight_type", ""))
            if wt and probe_key(info, wt) == key:  # this CPU and this build only
                seen[wt] = bool(entry.get("extra_bufts_ok"))
    if forced in ("0", "1"):
        verdict = "forced-on" if forced == "1" else "forced-off"
    elif not seen:
        verdict = "not-probed"
    else:
        verdict = "ok" if all(seen.values()) else "off"
    return {
        "cpu_has_amx": cpu_has_amx(),
        "override": forced,
        "verdict": verdict,
        "weight_types": dict(sorted(seen.items())),
    }
