"""llama.cpp's backends, as this interpreter's build has them and as the installers ship them.

A build with GGML_BACKEND_DL + GGML_CPU_ALL_VARIANTS (packaging/gpu.sh) has no backend linked
in: the CPU backend is one library per x86-64 level in llama_cpp/lib, which Hearth loads before
llama_backend_init (llama.cpp itself looks only beside the executable and in the current
folder). That build lives in a build venv, so its test runs there, in a child process: the
interpreter in HEARTH_LLAMA_DL_PYTHON, else build/venv-cpu*/bin/python made by
packaging/linux/build.sh; it is skipped where neither exists.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.runtimes.llama.backend import cpu_backend_library, ensure_backend, lib_dir

REPO = Path(__file__).resolve().parents[3]

CHILD = """
import ctypes, logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
from app.runtimes.llama.backend import L, cpu_backend_library, ensure_backend
ensure_backend()
model = L.llama_model_load_from_file(sys.argv[1].encode(), L.llama_model_default_params())
print("loaded" if model else "not loaded")
print(cpu_backend_library())
"""


def dl_python() -> Path | None:
    """An interpreter whose llama-cpp-python has the CPU backend per CPU level."""
    given = os.environ.get("HEARTH_LLAMA_DL_PYTHON")
    candidates = [Path(given)] if given else sorted(REPO.glob("build/venv-cpu*/bin/python"))
    for py in candidates:
        if not py.exists():
            continue
        found = subprocess.run(
            [
                str(py),
                "-c",
                "import llama_cpp, pathlib; print(pathlib.Path(llama_cpp.__file__).parent)",
            ],
            capture_output=True,
            text=True,
        )
        if (
            found.returncode == 0
            and (Path(found.stdout.strip()) / "lib" / "libggml-cpu-x64.so").is_file()
        ):
            return py
    return None


def test_the_cpu_backend_this_process_runs_is_named() -> None:
    ensure_backend()
    if not sys.platform.startswith("linux"):
        assert cpu_backend_library() == ""
        return
    name = cpu_backend_library()
    assert name.startswith("libggml-cpu"), name
    assert any(p.name == name for p in lib_dir().iterdir())


@pytest.mark.model
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the Linux x86-64 packages")
def test_a_build_with_a_cpu_library_per_level_loads_the_best_and_runs_a_model(
    smollm2_path: Path,
) -> None:
    py = dl_python()
    if py is None:
        pytest.skip("no llama.cpp built with GGML_CPU_ALL_VARIANTS (packaging/linux/build.sh)")
    got = subprocess.run(
        [str(py), "-c", CHILD, str(smollm2_path)],
        cwd=REPO,  # this checkout's app package, ahead of the venv's own copy
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert got.returncode == 0, got.stderr
    loaded, library = got.stdout.split()
    assert loaded == "loaded", got.stderr
    # ggml scored each level's library against this CPU and kept one; the log says which
    assert library.startswith("libggml-cpu-") and library != "libggml-cpu.so", library
    assert f"llama.cpp CPU backend: {library}" in got.stderr
