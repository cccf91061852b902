"""The layer rules of STYLE.md, enforced: import-linter contracts and a core that imports alone."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_import_linter_contracts_hold() -> None:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which(
        "lint-imports"
    )
    assert exe, "import-linter is part of the dev extra"
    r = subprocess.run([exe], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout


def test_core_imports_without_qt_aiohttp_or_runtimes() -> None:
    """A machine without Qt, aiohttp or a runtime library can still import every core module."""
    code = r"""
import importlib, pkgutil, sys
BLOCKED = ("PySide6", "aiohttp", "llama_cpp", "mlx", "mlx_lm")
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"blocked: {name}")
        return None
sys.meta_path.insert(0, Block())
import app.core
for m in pkgutil.iter_modules(app.core.__path__):
    importlib.import_module(f"app.core.{m.name}")
import app.paths, app.settings, app.errors
print("ok")
"""
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
