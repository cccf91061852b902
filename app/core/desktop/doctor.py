"""``hearth doctor``: what this install can run, where it keeps things, and what to fix.

One report for the CLI (``hearth doctor [--json]``) and the Settings page's Runtime section.
The runtimes describe themselves (``system_report()``: llama.cpp's build, backends and devices,
the AMX probe's verdict; MLX's availability; faster-whisper's and CTranslate2's versions);
``app.core.library.hardware`` says which GPUs the machine has, so a GPU that the llama.cpp build
cannot drive is reported with how to fix it. Speech to text adds whether the chat's Dictate
button can record (PySide6's QtMultimedia) and how many Whisper models the library has.
Tested by tests/e2e/cli/test_doctor.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.core.library.hardware import HardwareGpu
from app.core.util.units import human_bytes

# how to get a llama.cpp build that drives each vendor's GPU (README "GPU builds")
FIXES = {
    "nvidia": (
        'reinstall llama-cpp-python with CUDA: CMAKE_ARGS="-DGGML_CUDA=on" pip install '
        "--force-reinstall --no-cache-dir llama-cpp-python (needs the CUDA toolkit), or a "
        "prebuilt CUDA wheel: pip install --force-reinstall llama-cpp-python --extra-index-url "
        "https://abetlen.github.io/llama-cpp-python/whl/cu124"
    ),
    "amd": (
        'reinstall llama-cpp-python with Vulkan: CMAKE_ARGS="-DGGML_VULKAN=on" pip install '
        "--force-reinstall --no-cache-dir llama-cpp-python (needs the Vulkan SDK), or with ROCm: "
        'CMAKE_ARGS="-DGGML_HIP=on"'
    ),
    "apple": (
        'reinstall llama-cpp-python with Metal: CMAKE_ARGS="-DGGML_METAL=on" pip install '
        "--force-reinstall --no-cache-dir llama-cpp-python"
    ),
}


def _self_report(runtime: Any) -> dict[str, Any]:
    report = getattr(runtime, "system_report", None)
    return report() if callable(report) else {}


def build_report(
    *,
    version: str,
    runtimes: Mapping[str, Any],
    hardware: list[HardwareGpu],
    memory_budget_bytes: int,
    ram_bytes: int,
    paths: dict[str, str],
    server: dict[str, Any],
    whisper_models: int = 0,
    mic: tuple[bool, str] = (False, "not checked"),
) -> dict[str, Any]:
    """The doctor's report: {version, llama_cpp: {version, backends, system_info}, gpus:
    [{name, memory_bytes, backend}], mlx: {available, reason}, speech: {available, reason,
    faster_whisper, ctranslate2, microphone, microphone_reason, whisper_models}, amx_probe,
    memory_budget_bytes, paths, server, warnings}. ``runtime_ok`` is left out: see
    :func:`runtime_ok`. ``mic``: whether the chat's Dictate button can record, and why not
    (``app.gui.views.chat.dictation.can_record``: core imports no Qt)."""
    llama_self = _self_report(runtimes.get("gguf"))
    llama = llama_self.get("llama_cpp") or {
        "available": False,
        "reason": "no llama.cpp runtime in this install",
        "version": None,
        "backends": [],
        "system_info": "",
        "devices": [],
    }
    mlx = _self_report(runtimes.get("mlx")).get("mlx") or {
        "available": False,
        "reason": "no MLX runtime in this install",
    }
    speech = _self_report(runtimes.get("whisper")).get("speech") or {
        "available": False,
        "reason": "no speech runtime in this install",
    }
    warnings: list[str] = []
    gpus = [
        {
            "name": d["description"] or d["name"],
            "memory_bytes": d["memory_bytes"],
            "backend": d["backend"],
        }
        for d in llama.get("devices", ())
        if d.get("type") in ("gpu", "igpu")
    ]
    driven = {str(g["backend"]).lower() for g in gpus}
    for hw in hardware:
        if driven & {b.lower() for b in hw.backends}:
            continue  # llama.cpp lists it already, with its backend
        if hw.vendor == "apple" and mlx.get("available"):
            gpus.append({"name": hw.name, "memory_bytes": hw.memory_bytes, "backend": "MLX"})
        else:
            gpus.append({"name": hw.name, "memory_bytes": hw.memory_bytes, "backend": None})
        built = ", ".join(llama.get("backends") or ()) or "none"
        warnings.append(
            f"{hw.name} ({human_bytes(hw.memory_bytes)}) is present but this llama.cpp build cannot use "
            f"it (its backends: {built}), so GGUF models run on the CPU. To fix it, "
            f"{FIXES.get(hw.vendor, 'install a llama-cpp-python build for this GPU')}."
        )
    if not llama.get("available"):
        warnings.append(f"llama.cpp is unavailable: {llama.get('reason') or 'unknown reason'}.")
    if any(hw.vendor == "apple" for hw in hardware) and not mlx.get("available"):
        warnings.append(f"MLX is unavailable: {mlx.get('reason')}.")
    if whisper_models and not speech.get("available"):
        warnings.append(
            f"The library has {whisper_models} Whisper model(s) but speech to text is "
            f"unavailable: {speech.get('reason')}"
        )
    amx = llama_self.get("amx_probe") or {
        "cpu_has_amx": False,
        "override": None,
        "verdict": "not-probed",
        "weight_types": {},
    }
    if amx.get("verdict") == "off":
        warnings.append(
            "llama.cpp's extra CPU buffer types (AMX/repacked weights) crashed on this CPU in a "
            "probe, so models load without them (slower prompt processing, never a crash)."
        )
    if ram_bytes and memory_budget_bytes > ram_bytes and not gpus:
        warnings.append(
            f"The memory budget ({human_bytes(memory_budget_bytes)}) is larger than this machine's RAM "
            f"({human_bytes(ram_bytes)}): loads that fit it may swap. Lower it in Settings."
        )
    return {
        "version": version,
        "llama_cpp": {k: llama.get(k) for k in ("version", "backends", "system_info")},
        "gpus": gpus,
        "mlx": {"available": bool(mlx.get("available")), "reason": mlx.get("reason") or ""},
        "speech": {
            "available": bool(speech.get("available")),
            "reason": speech.get("reason") or "",
            "faster_whisper": speech.get("faster_whisper"),
            "ctranslate2": speech.get("ctranslate2"),
            "microphone": mic[0],
            "microphone_reason": mic[1],
            "whisper_models": whisper_models,
        },
        "amx_probe": amx,
        "memory_budget_bytes": memory_budget_bytes,
        "paths": paths,
        "server": server,
        "warnings": warnings,
    }


def runtime_ok(report: dict[str, Any]) -> bool:
    """Whether any runtime can load a model here (``hearth doctor`` exits 1 when none can)."""
    return bool(report["llama_cpp"].get("version") and report["llama_cpp"].get("backends")) or bool(
        report["mlx"]["available"]
    )


def text(report: dict[str, Any]) -> list[str]:
    """The report as lines for people (the CLI's plain output and the Settings page)."""
    ll = report["llama_cpp"]
    lines = [f"Hearth {report['version']}"]
    if ll.get("version"):
        lines.append(
            f"llama.cpp: llama-cpp-python {ll['version']}, backends: "
            f"{', '.join(ll['backends']) or 'none'}"
        )
        lines.append(f"  {ll['system_info']}")
    else:
        lines.append("llama.cpp: unavailable")
    if report["gpus"]:
        for g in report["gpus"]:
            used = f"used by {g['backend']}" if g["backend"] else "NOT USED"
            lines.append(f"GPU: {g['name']}, {human_bytes(g['memory_bytes'])} ({used})")
    else:
        lines.append("GPU: none found (models run on the CPU)")
    mlx = report["mlx"]
    lines.append("MLX: available" if mlx["available"] else f"MLX: unavailable ({mlx['reason']})")
    lines.extend(_speech_lines(report["speech"]))
    amx = report["amx_probe"]
    lines.append(
        f"AMX probe: {amx['verdict']}" + (" (this CPU has AMX)" if amx.get("cpu_has_amx") else "")
    )
    lines.append(f"Memory budget: {human_bytes(report['memory_budget_bytes'])}")
    for name, p in report["paths"].items():
        lines.append(f"{name.capitalize()} folder: {p}")
    srv = report["server"]
    state = "running" if srv.get("running") else "not running"
    lines.append(f"Server: {srv.get('url')} ({state})")
    lines.extend(f"Warning: {w}" for w in report["warnings"])
    return lines


def _speech_lines(sp: dict[str, Any]) -> list[str]:
    n = sp["whisper_models"]
    models = f"{n} Whisper model{'' if n == 1 else 's'} in the library"
    if sp["available"]:
        ct2 = f" (CTranslate2 {sp['ctranslate2']})" if sp["ctranslate2"] else ""
        head = f"Speech to text: faster-whisper {sp['faster_whisper']}{ct2}, {models}"
    else:
        head = f"Speech to text: unavailable ({sp['reason']}), {models}"
    mic = (
        "Microphone (chat Dictate): can record"
        if sp["microphone"]
        else f"Microphone (chat Dictate): cannot record ({sp['microphone_reason']})"
    )
    return [head, mic]


def collect(
    runtimes: Mapping[str, Any],
    *,
    version: str,
    paths: Any,
    models_dir: str,
    budget_bytes: int,
    server: dict[str, Any],
    whisper_models: int = 0,
    mic: tuple[bool, str] = (False, "not checked"),
) -> dict[str, Any]:
    """The report for this machine. ``paths``: ``app.paths.AppPaths``; ``models_dir``: the
    models folder setting (empty: the default); ``server``: {url, running};
    ``whisper_models``: how many the library has; ``mic``: as :func:`build_report`."""
    from app.core.library.fit import probe_memory
    from app.core.library.hardware import detect_gpus

    folders = {
        "config": str(paths.config),
        "data": str(paths.data),
        "models": models_dir or str(paths.models),
        "cache": str(paths.cache),
        "logs": str(paths.logs),
    }
    return build_report(
        version=version,
        runtimes=runtimes,
        hardware=detect_gpus(),
        memory_budget_bytes=budget_bytes,
        ram_bytes=probe_memory().ram_total,
        paths=folders,
        server=server,
        whisper_models=whisper_models,
        mic=mic,
    )
