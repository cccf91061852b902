"""The frozen app's entry point: ``hearth`` is ``app.cli:main``, as the console script is.

A frozen executable has no interpreter to run ``python -m MODULE``, yet Hearth starts its
llama.cpp check child as ``[sys.executable, "-m", "app.runtimes.llama.probe_child", SPEC]``;
in the bundle ``sys.executable`` is this program, so ``hearth -m app.X ARGS`` runs that module
the way the interpreter would. Only Hearth's own modules are runnable this way.
"""

from __future__ import annotations

import os
import sys


def _restore_child_environment() -> None:
    """Give the programs Hearth starts (xdg-open and the browser behind a clicked link, ...)
    the library path the user had, not the bundle's: PyInstaller's bootloader points
    LD_LIBRARY_PATH at _internal/, and a system program loading the bundle's libstdc++ or glib
    can fail. This process is unaffected (the loader read the variable at start), and Hearth's
    own children are the bundle again, whose bootloader sets it anew."""
    if not getattr(sys, "frozen", False) or not sys.platform.startswith("linux"):
        return
    orig = os.environ.pop("LD_LIBRARY_PATH_ORIG", None)
    if orig is None:
        os.environ.pop("LD_LIBRARY_PATH", None)
    else:
        os.environ["LD_LIBRARY_PATH"] = orig


def _run_module(name: str, args: list[str]) -> int:
    import runpy

    if name != "app" and not name.startswith("app."):
        sys.stderr.write(f"hearth: -m runs only Hearth's own modules, not {name!r}\n")
        return 2
    sys.argv = [name, *args]
    try:
        runpy.run_module(name, run_name="__main__", alter_sys=True)
    except SystemExit as e:  # the module's own sys.exit(code)
        code = e.code
        if code is None or isinstance(code, int):
            return code or 0
        sys.stderr.write(f"{code}\n")
        return 1
    return 0


def _main() -> int:
    _restore_child_environment()
    argv = sys.argv
    if len(argv) >= 3 and argv[1] == "-m":
        return _run_module(argv[2], argv[3:])
    from app.cli import main

    return main()


if __name__ == "__main__":
    sys.exit(_main())
