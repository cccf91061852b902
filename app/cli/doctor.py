"""``hearth doctor [--json]``: the runtimes (speech to text too), GPUs, paths and server of
this install.

Exit 0 (with or without warnings); 1 when no runtime can load a model here.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from app import __version__
from app.cli.common import EXIT_FAIL, EXIT_OK, context, find_server


def _microphone() -> tuple[bool, str]:
    try:
        from app.gui.views.chat.dictation import can_record
    except ImportError as e:  # PySide6 itself is missing: no window, so no Dictate button
        return False, f"PySide6 cannot be imported ({e})"
    return can_record()


def cmd_doctor(args: argparse.Namespace) -> int:
    from app.compose import build_runtimes
    from app.core.desktop import doctor
    from app.core.library.fit import default_budget
    from app.core.library.index import ModelLibrary

    # the microphone check imports QtMultimedia, whose backend probe logs missing audio
    # servers (pipewire...) to stderr: noise in a report that states the verdict itself
    os.environ.setdefault("QT_LOGGING_RULES", "qt.multimedia.*=false")
    paths, store = context()
    settings = store.load()
    running = find_server(paths, None)
    s = settings.server
    configured = f"{'https' if s.tls_cert else 'http'}://{s.host}:{s.port}"
    models_dir = Path(settings.models_dir) if settings.models_dir else paths.models
    library = ModelLibrary(paths.library_file, models_dir)
    report = doctor.collect(
        build_runtimes(paths, settings),
        version=__version__,
        paths=paths,
        models_dir=settings.models_dir,
        budget_bytes=settings.load.memory_budget_bytes or default_budget(),
        server={"url": str(running) if running else configured, "running": bool(running)},
        whisper_models=sum(m.format == "whisper" for m in library.list()),
        mic=_microphone(),
    )
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print("\n".join(doctor.text(report)))
    return EXIT_OK if doctor.runtime_ok(report) else EXIT_FAIL


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "doctor",
        help="what this install can run: llama.cpp build, GPUs, MLX, speech, paths, server",
        description="Report the llama.cpp build and its backends, GPUs, MLX, speech to text "
        "(faster-whisper, the microphone, Whisper models), the AMX probe, the "
        "memory budget, data paths and the server, with warnings (e.g. a GPU the build cannot "
        "use, and how to fix it). Exit 0 with or without warnings, 1 when no runtime can load.",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_doctor)
