"""The layer rules of STYLE.md, enforced: import-linter contracts and a core that imports alone."""

from __future__ import annotations

import ast
import re
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
BLOCKED = ("PySide6", "aiohttp", "llama_cpp", "mlx", "mlx_lm", "mlx_vlm")
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"blocked: {name}")
        return None
sys.meta_path.insert(0, Block())
import app.core
for m in pkgutil.walk_packages(app.core.__path__, "app.core."):
    importlib.import_module(m.name)
import app.paths, app.settings, app.errors
print("ok")
"""
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


# -- no import cycles, no oversized modules ----------------------------------------------------
MAX_MODULE_LINES = 600


def _import_cycles() -> list[list[str]]:
    """Groups of app modules that import each other, directly or through others (Tarjan's
    strongly connected components over grimp's graph; lazy imports inside functions count, and
    so do ``if TYPE_CHECKING:`` imports: a type-level circle is still a circle to a reader)."""
    import grimp

    # no cache: grimp's on-disk cache answered with a graph of files as they were before an edit
    graph = grimp.build_graph("app", exclude_type_checking_imports=True, cache_dir=None)
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in sorted(graph.modules)}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in edges:  # iterative, so a long chain cannot hit the recursion limit
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = len(index)
                stack.append(v)
                on_stack.add(v)
            if i < len(edges[v]):
                work.append((v, i + 1))
                w = edges[v][i]
                if w not in index:
                    work.append((w, 0))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            if low[v] == index[v]:
                group = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    group.append(w)
                    if w == v:
                        break
                if len(group) > 1:
                    cycles.append(sorted(group))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    return cycles


def test_the_cycle_finder_finds_a_cycle(tmp_path: Path) -> None:
    """The check below can fail: a two-module cycle in a scratch package is found."""
    code = r"""
import sys
sys.path.insert(0, sys.argv[1])
import tests.test_architecture as t, grimp
real = grimp.build_graph
grimp.build_graph = lambda name, **kw: real("cyc", **kw)
print(t._import_cycles())
"""
    pkg = tmp_path / "cyc"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from cyc import b\n")  # a lazy import counts
    (pkg / "b.py").write_text("from cyc import a\n")
    (pkg / "c.py").write_text("from cyc import a\n")
    r = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[['cyc.a', 'cyc.b']]"


def test_no_import_cycle_in_app() -> None:
    cycles = _import_cycles()
    assert cycles == [], f"import cycles among app's modules: {cycles}"


def test_no_module_over_600_lines() -> None:
    over = {
        str(p.relative_to(REPO)): n
        for p in sorted((REPO / "app").rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert over == {}, f"modules over {MAX_MODULE_LINES} lines (split them by concern): {over}"


# -- every app module has its tests ----------------------------------------------------------
# A module is tested by tests/**/test_<its name>.py, or its docstring names the test files
# that exercise it ("Tested by tests/....py"): a reader finds the tests from either side.
TEST_PATH = re.compile(r"\btests/[\w/.-]+?\.py\b")


def _docstring_test_paths(module: Path) -> list[str]:
    doc = ast.get_docstring(ast.parse(module.read_text(encoding="utf-8"))) or ""
    return TEST_PATH.findall(doc)


def _app_modules() -> list[Path]:
    skip = {"__init__.py", "__main__.py"}
    return [p for p in sorted((REPO / "app").rglob("*.py")) if p.name not in skip]


def test_every_app_module_has_a_test_module_or_names_its_tests() -> None:
    tests = REPO / "tests"
    stems = {
        p.stem.removeprefix("test_")
        for p in tests.rglob("test_*.py")
        if not {"bench", "fixtures"} & set(p.relative_to(tests).parts)
    }
    untested = [
        str(m.relative_to(REPO))
        for m in _app_modules()
        if m.stem not in stems
        and not any(
            Path(t).name.startswith("test_") and (REPO / t).is_file()
            for t in _docstring_test_paths(m)
        )
    ]
    assert untested == [], (
        "app modules with neither a tests/**/test_<name>.py nor a 'Tested by tests/....py' "
        f"line in their docstring: {untested}"
    )


def test_test_files_named_in_app_docstrings_exist() -> None:
    """A moved or renamed test leaves no stale path in a docstring."""
    missing = {
        str(m.relative_to(REPO)): gone
        for m in _app_modules()
        if (gone := [t for t in _docstring_test_paths(m) if not (REPO / t).is_file()])
    }
    assert missing == {}, f"docstrings naming test files that do not exist: {missing}"
