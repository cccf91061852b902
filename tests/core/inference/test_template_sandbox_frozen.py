"""The chat-template compile deadline traces Jinja's own frames in a frozen (PyInstaller) app too.

A bundle compiles modules with their path stripped to the package: Jinja's code objects say
``jinja2/lexer.py`` while ``jinja2.__file__`` is absolute, so a prefix taken from ``__file__``
matched no Jinja frame there. This test lays out Jinja as the bundle does (sourceless modules
compiled with relative names, imported from a folder) and checks in a fresh interpreter that the
deadline's tracer follows a real Jinja frame.
"""

from __future__ import annotations

import os
import py_compile
import subprocess
import sys
from pathlib import Path

import jinja2

REPO = Path(__file__).resolve().parents[3]

CHECK = """
import sys
import jinja2, jinja2.lexer
assert jinja2.__file__.startswith(sys.argv[1]), jinja2.__file__
from app.core.inference import template_sandbox
gen = jinja2.lexer.Lexer(jinja2.Environment()).tokeniter("{{ x }}", "t")
next(gen)
frame = gen.gi_frame
print(frame.f_code.co_filename)
tracer = template_sandbox._CompileDeadline(60.0)
print("traced" if tracer(frame, "call", None) is tracer else "not traced")
"""


def frozen_like_jinja(dest: Path) -> Path:
    """A copy of jinja2 as PyInstaller ships it: .pyc only, each compiled as 'jinja2/NAME.py'."""
    src = Path(jinja2.__file__).parent
    pkg = dest / "jinja2"
    pkg.mkdir(parents=True)
    for py in src.glob("*.py"):
        py_compile.compile(str(py), cfile=str(pkg / (py.stem + ".pyc")), dfile=f"jinja2/{py.name}")
    return dest


def test_compile_deadline_traces_jinja_frames_in_a_bundle_layout(tmp_path: Path) -> None:
    root = frozen_like_jinja(tmp_path / "frozen")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(REPO)])}
    got = subprocess.run(
        [sys.executable, "-c", CHECK, str(root)], env=env, capture_output=True, text=True
    )
    assert got.returncode == 0, got.stderr
    filename, verdict = got.stdout.splitlines()
    assert filename == "jinja2/lexer.py"  # the layout is the bundle's
    assert verdict == "traced"


def test_compile_deadline_traces_jinja_frames_from_site_packages() -> None:
    from app.core.inference import template_sandbox

    gen = jinja2.lexer.Lexer(jinja2.Environment()).tokeniter("{{ x }}", "t")
    next(gen)
    tracer = template_sandbox._CompileDeadline(60.0)
    assert tracer(gen.gi_frame, "call", None) is tracer  # type: ignore[arg-type]
