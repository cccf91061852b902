"""``hearth doctor [--json]`` as a script runs it: this machine's CPU build, a
simulated GPU the build cannot use (the warning path), an install with no runtime, and speech
to text (faster-whisper, the microphone, Whisper models; without the speech extra)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

import app
from app.core.desktop.doctor import build_report, runtime_ok
from app.core.library.hardware import HardwareGpu, detect_gpus
from app.core.util.fsutil import atomic_write_json
from app.runtimes.llama.backend import build_info
from app.runtimes.llama.probe import ENV_OVERRIDE, probe_key
from app.runtimes.llama.system import amx_report
from tests.support.speech import whisper_or_skip

KEYS = {
    "version",
    "llama_cpp",
    "gpus",
    "mlx",
    "speech",
    "amx_probe",
    "memory_budget_bytes",
    "paths",
    "server",
    "warnings",
}

SPEECH_KEYS = {
    "available",
    "reason",
    "faster_whisper",
    "ctranslate2",
    "microphone",
    "microphone_reason",
    "whisper_models",
}


def doctor(
    home: Path, *args: str, path_prefix: Path | None = None, pythonpath: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HEARTH_HOME": str(home)}
    if path_prefix is not None:
        env["PATH"] = f"{path_prefix}{os.pathsep}{env.get('PATH', '')}"
    if pythonpath is not None:
        env["PYTHONPATH"] = f"{pythonpath}{os.pathsep}{env.get('PYTHONPATH', '')}"
    return subprocess.run(
        [sys.executable, "-m", "app", "doctor", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def test_doctor_json_on_this_machine(tmp_path: Path) -> None:
    r = doctor(tmp_path / "h", "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert set(rep) == KEYS
    assert rep["version"] == app.__version__
    ll = rep["llama_cpp"]
    assert set(ll) == {"version", "backends", "system_info"}
    assert "CPU" in ll["backends"] and ll["system_info"].startswith("CPU :")
    assert set(rep["mlx"]) == {"available", "reason"}
    assert rep["mlx"]["available"] or rep["mlx"]["reason"]
    assert rep["amx_probe"]["verdict"] == "not-probed"  # a fresh home: nothing loaded yet
    assert rep["memory_budget_bytes"] > 0
    assert set(rep["paths"]) == {"config", "data", "models", "cache", "logs"}
    assert all(p.startswith(str(tmp_path / "h")) for p in rep["paths"].values())
    assert rep["server"] == {"url": "http://127.0.0.1:8421", "running": False}
    if shutil.which("nvidia-smi") is None and not Path("/sys/class/drm").exists():
        assert rep["gpus"] == [] and rep["warnings"] == []
    for g in rep["gpus"]:
        assert set(g) == {"name", "memory_bytes", "backend"}
    plain = doctor(tmp_path / "h")
    assert plain.returncode == 0
    assert plain.stdout.startswith(f"Hearth {app.__version__}\nllama.cpp: llama-cpp-python ")
    assert "Server: http://127.0.0.1:8421 (not running)" in plain.stdout


def test_doctor_reports_speech_to_text(tmp_path: Path) -> None:
    real = whisper_or_skip()
    home = tmp_path / "h"
    rep = json.loads(doctor(home, "--json").stdout)
    sp = rep["speech"]
    assert set(sp) == SPEECH_KEYS
    assert sp["available"] and sp["reason"] == ""
    assert sp["faster_whisper"] == metadata.version("faster-whisper")
    assert sp["ctranslate2"] == metadata.version("ctranslate2")
    assert sp["microphone"] is True and sp["microphone_reason"] == ""  # the extra is installed
    assert sp["whisper_models"] == 0
    imported = subprocess.run(
        [sys.executable, "-m", "app", "import", str(real)],
        capture_output=True,
        text=True,
        env={**os.environ, "HEARTH_HOME": str(home)},
        timeout=120,
    )
    assert imported.returncode == 0, imported.stderr
    assert json.loads(doctor(home, "--json").stdout)["speech"]["whisper_models"] == 1
    plain = doctor(home)
    fw = metadata.version("faster-whisper")
    assert f"Speech to text: faster-whisper {fw} (CTranslate2 " in plain.stdout
    assert "1 Whisper model in the library" in plain.stdout
    assert "Microphone (chat Dictate): can record" in plain.stdout
    assert "pipewire" not in plain.stderr  # QtMultimedia's backend probe stays quiet


def test_without_the_speech_extra_it_says_what_to_install(tmp_path: Path) -> None:
    real = whisper_or_skip()
    home = tmp_path / "h"
    env = {**os.environ, "HEARTH_HOME": str(home)}
    r = subprocess.run(
        [sys.executable, "-m", "app", "import", str(real)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    shadow = tmp_path / "shadow"  # faster_whisper and PySide6 that fail, as where not installed
    for pkg in ("faster_whisper", "PySide6"):
        (shadow / pkg).mkdir(parents=True)
        (shadow / pkg / "__init__.py").write_text(f"raise ImportError('no {pkg} here')\n")
    r = doctor(home, "--json", pythonpath=shadow)
    assert r.returncode == 0, r.stderr  # llama.cpp still runs models
    rep = json.loads(r.stdout)
    sp = rep["speech"]
    assert not sp["available"] and "hearth[speech]" in sp["reason"]
    assert not sp["microphone"] and "PySide6 cannot be imported" in sp["microphone_reason"]
    assert sp["whisper_models"] == 1
    [warning] = [w for w in rep["warnings"] if "Whisper" in w]
    assert "1 Whisper model(s)" in warning and "hearth[speech]" in warning


def test_a_gpu_the_build_cannot_use_is_reported_with_the_fix(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"  # NVIDIA's driver tool, as it answers on a machine with a card
    smi.write_text("#!/bin/sh\necho 'NVIDIA GeForce RTX 4090, 24564'\n")
    smi.chmod(0o755)
    r = doctor(tmp_path / "h", "--json", path_prefix=bin_dir)
    assert r.returncode == 0, r.stderr  # warnings do not fail the doctor
    rep = json.loads(r.stdout)
    gpu = {"name": "NVIDIA GeForce RTX 4090", "memory_bytes": 24564 * 1024**2, "backend": None}
    assert gpu in rep["gpus"]  # this CPU-only build does not drive it
    (warning,) = [w for w in rep["warnings"] if "RTX 4090" in w]
    assert "cannot use it" in warning and "run on the CPU" in warning
    assert 'CMAKE_ARGS="-DGGML_CUDA=on"' in warning
    plain = doctor(tmp_path / "h", path_prefix=bin_dir)
    assert "GPU: NVIDIA GeForce RTX 4090, 24.0 GiB (NOT USED)" in plain.stdout
    assert "Warning: NVIDIA GeForce RTX 4090" in plain.stdout


def test_no_runtime_exits_1(tmp_path: Path) -> None:
    shadow = tmp_path / "shadow"  # llama_cpp and mlx that fail to import, as where not installed
    (shadow / "mlx").mkdir(parents=True)
    (shadow / "llama_cpp.py").write_text("raise ImportError('no llama_cpp here')\n")
    (shadow / "mlx" / "__init__.py").write_text("raise ImportError('no mlx here')\n")
    r = doctor(tmp_path / "h", "--json", pythonpath=shadow)
    assert r.returncode == 1, r.stderr
    rep = json.loads(r.stdout)
    assert rep["llama_cpp"]["version"] is None and not rep["mlx"]["available"]
    assert any(w.startswith("llama.cpp is unavailable") for w in rep["warnings"])


def test_amx_verdict_comes_from_the_probe_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV_OVERRIDE, raising=False)
    record = tmp_path / "runtime-probe.json"
    info = build_info()
    entry = {"extra_bufts_ok": False, "detail": "SIGSEGV", "at": 1.0, "weight_type": "Q4_1"}
    other_cpu = {"extra_bufts_ok": True, "detail": "", "at": 1.0, "weight_type": "Q8_0"}
    atomic_write_json(
        record, {probe_key(info, "Q4_1"): entry, "0" * 32: other_cpu, "file:abc": {"ok": True}}
    )
    rep = amx_report(record)
    assert rep["verdict"] == "off" and rep["weight_types"] == {"Q4_1": False}
    atomic_write_json(record, {probe_key(info, "Q4_1"): {**entry, "extra_bufts_ok": True}})
    assert amx_report(record)["verdict"] == "ok"
    monkeypatch.setenv(ENV_OVERRIDE, "0")
    assert amx_report(record)["verdict"] == "forced-off"
    assert amx_report(None)["verdict"] == "forced-off"


class _Llama:
    def __init__(self, backends: list[str], devices: list[dict[str, object]]) -> None:
        self.report = {
            "llama_cpp": {
                "available": True,
                "reason": "",
                "version": "0.3.36",
                "backends": backends,
                "system_info": "CPU : AVX2 = 1",
                "devices": devices,
            },
            "amx_probe": {
                "cpu_has_amx": True,
                "override": None,
                "verdict": "off",
                "weight_types": {"Q4_1": False},
            },
        }

    def system_report(self) -> dict[str, object]:
        return self.report


def _report(llama: _Llama, hardware: list[HardwareGpu]) -> dict[str, object]:
    return build_report(
        version="1",
        runtimes={"gguf": llama},
        hardware=hardware,
        memory_budget_bytes=8 << 30,
        ram_bytes=16 << 30,
        paths={},
        server={},
    )


def test_a_gpu_the_build_drives_is_listed_once_without_a_warning() -> None:
    cuda_dev = {
        "name": "CUDA0",
        "description": "NVIDIA H200",
        "type": "gpu",
        "backend": "CUDA",
        "memory_bytes": 140 << 30,
        "free_bytes": 139 << 30,
    }
    llama = _Llama(["CUDA", "CPU"], [cuda_dev])
    rep = _report(llama, [HardwareGpu("NVIDIA H200", 140 << 30, "nvidia", ("CUDA", "Vulkan"))])
    assert rep["gpus"] == [{"name": "NVIDIA H200", "memory_bytes": 140 << 30, "backend": "CUDA"}]
    assert not [w for w in rep["warnings"] if "H200" in w]  # type: ignore[union-attr]
    assert any("AMX" in w for w in rep["warnings"])  # type: ignore[union-attr]
    assert runtime_ok(rep)
    assert not runtime_ok(
        build_report(
            version="1",
            runtimes={},
            hardware=[],
            memory_budget_bytes=1,
            ram_bytes=1,
            paths={},
            server={},
        )
    )


def test_hardware_detection_reads_amd_cards_and_apple_silicon(tmp_path: Path) -> None:
    card = tmp_path / "drm" / "card1" / "device"
    card.mkdir(parents=True)
    (card / "vendor").write_text("0x1002\n")
    (card / "mem_info_vram_total").write_text(str(16 << 30))
    (tmp_path / "drm" / "card1-DP-1").mkdir()  # a connector, not a device
    apu = tmp_path / "drm" / "card0" / "device"
    apu.mkdir(parents=True)
    (apu / "vendor").write_text("0x1002\n")
    (apu / "mem_info_vram_total").write_text(str(512 << 20))  # an APU's carve-out: skipped
    amd = [g for g in detect_gpus(drm_root=tmp_path / "drm", system="Linux") if g.vendor == "amd"]
    assert amd == [HardwareGpu("AMD GPU (card1)", 16 << 30, "amd", ("HIP", "Vulkan"))]
    (mac,) = detect_gpus(system="Darwin", machine="arm64")
    assert mac.vendor == "apple" and mac.backends == ("Metal",) and mac.memory_bytes > 0
    assert detect_gpus(system="Darwin", machine="x86_64") == []
    rep = _report(_Llama(["CPU"], []), [mac])
    assert any("-DGGML_METAL=on" in w for w in rep["warnings"])  # type: ignore[union-attr]
