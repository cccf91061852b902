"""The GPUs this machine has, whatever llama.cpp was built for (``hearth doctor``).

llama.cpp reports only the devices its build can drive; a CPU-only build on a machine with an
NVIDIA card sees no GPU at all. To say "a GPU is present but unused", the doctor also asks the
machine: ``nvidia-smi`` (NVIDIA's driver tool), the kernel's DRM devices (AMD's VRAM size), and
the platform (Apple silicon always has a Metal GPU sharing the RAM).
Tested by tests/e2e/cli/test_doctor.py.
"""

from __future__ import annotations

import functools
import platform
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

NVIDIA, AMD, APPLE = "0x10de", "0x1002", "apple"
SMI_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class HardwareGpu:
    name: str
    memory_bytes: int
    vendor: str  # "nvidia" | "amd" | "apple"
    backends: tuple[str, ...]  # llama.cpp backends that can drive it, best first

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _nvidia_smi() -> list[HardwareGpu]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=SMI_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    if out.returncode != 0:
        return []
    gpus = []
    for line in out.stdout.splitlines():
        name, _, mib = line.rpartition(",")
        try:
            size = int(float(mib.strip()) * 1024 * 1024)
        except ValueError:
            continue
        if name.strip():
            gpus.append(HardwareGpu(name.strip(), size, "nvidia", ("CUDA", "Vulkan")))
    return gpus


def _drm(root: Path) -> list[HardwareGpu]:
    """AMD cards from /sys/class/drm (amdgpu reports VRAM; integrated parts have little)."""
    gpus = []
    for card in sorted(root.glob("card[0-9]*")):
        if "-" in card.name:  # connectors (card0-HDMI-A-1), not devices
            continue
        dev = card / "device"
        try:
            vendor = (dev / "vendor").read_text().strip().lower()
        except OSError:
            continue
        if vendor != AMD:
            continue
        try:
            vram = int((dev / "mem_info_vram_total").read_text().strip())
        except (OSError, ValueError):
            vram = 0
        if vram >= 1 << 30:  # a discrete card (an APU's carve-out is smaller)
            gpus.append(HardwareGpu(f"AMD GPU ({card.name})", vram, "amd", ("HIP", "Vulkan")))
    return gpus


def detect_gpus(
    *,
    drm_root: Path = Path("/sys/class/drm"),
    system: str | None = None,
    machine: str | None = None,
) -> list[HardwareGpu]:
    """The machine's GPUs worth offloading to. ``drm_root``, ``system`` and ``machine`` are
    for tests (another machine's sysfs tree, platform.system(), platform.machine())."""
    system = system or platform.system()
    machine = machine or platform.machine()
    if system == "Darwin":
        if machine == "arm64":
            from app.core.library.fit import probe_memory

            ram = probe_memory().ram_total
            return [HardwareGpu("Apple silicon GPU", ram, APPLE, ("Metal",))]
        return []
    gpus = _nvidia_smi()
    if sys.platform.startswith("linux") or system == "Linux":
        gpus += _drm(drm_root)
    return gpus


@functools.cache
def offload_gpus() -> bool:
    """Whether this machine has a GPU worth offloading to (looked for once per process)."""
    return bool(detect_gpus())
