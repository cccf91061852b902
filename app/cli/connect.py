"""``hearth connect TOOL [--model ID] [--json] [--set-context] [--exec -- CMD...]``: the settings
an app needs to use Hearth (app/core/desktop/connect.py), printed or put in a child's environment.

Nothing here edits another app's files. The server's address is the running server's (its
record in the data folder), else the one in settings; the key is ``--key`` or
``HEARTH_API_KEY`` (Hearth keeps only hashes of its keys, so it cannot print one).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import urllib.parse
from pathlib import Path
from typing import Any

from app.cli.common import EXIT_FAIL, EXIT_OK, api, context, fail, find_server
from app.core.desktop.connect import (
    TOOLS,
    ContextCheck,
    Target,
    check_context,
    check_fim,
    connection,
    effective_context,
    known_capabilities,
    pick_model,
    with_context,
)
from app.core.engine.presets import PresetStore
from app.core.gateway.keys import KeyStore
from app.core.library.index import ModelLibrary
from app.core.types import LocalModel
from app.errors import HearthError, ModelNotFound
from app.paths import AppPaths
from app.server.runner import planned_url
from app.settings import Settings


def _root(paths: AppPaths, settings: Settings, url: str | None) -> tuple[str, bool]:
    """The server's root URL (no ``/v1``) and whether it is running now."""
    running = find_server(paths, url)
    if running:
        return str(running), True
    return planned_url(settings.server).removesuffix("/v1"), False


def _pick_model(lib: ModelLibrary, settings: Settings, asked: str | None, tool: str) -> str:
    capability = "fim" if TOOLS[tool].fim else "chat"
    picked = asked or pick_model(settings.default_model, lib.list(), capability)
    if not picked:
        raise HearthError(
            "no model to connect: add one (hearth pull / hearth import) or pass --model"
        )
    return picked


def _served(root: str, model: str, key: str | None) -> dict[str, Any] | None:
    """The running server's view of ``model`` (its state and context), or None."""
    try:
        got = api(root, "GET", "/v1/models/" + urllib.parse.quote(model, safe=""), None, key, 5)
    except HearthError:
        return None
    return got if isinstance(got, dict) else None


def _context(
    paths: AppPaths, settings: Settings, model: LocalModel | None, served: dict[str, Any] | None
) -> tuple[int | None, int | None]:
    """(the context the model runs or will load with — None: auto —, its trained length)."""
    trained = model.context_length if model is not None else None
    loaded = None
    if served is not None:
        trained = served.get("max_context_length") or trained
        if served.get("state") == "loaded" and served.get("context_length"):
            loaded = int(served["context_length"])
    preset = None
    if model is not None and loaded is None:
        preset = PresetStore(paths.config / "presets.json").get(model.id).get("context_length")
    current = effective_context(
        loaded=loaded, preset=int(preset) if preset else None, default=settings.load.context_length
    )
    return current, trained


def _set_context(paths: AppPaths, model_id: str, needed: int) -> None:
    store = PresetStore(paths.config / "presets.json")
    store.set(model_id, with_context(store.get(model_id), needed))


def cmd_connect(args: argparse.Namespace) -> int:
    paths, store = context()
    settings = store.load()
    root, running = _root(paths, settings, args.url)
    key = args.key or os.environ.get("HEARTH_API_KEY") or None
    key_required = bool(settings.server.api_key_hashes or KeyStore(paths.keys_file).all())
    models_dir = Path(settings.models_dir) if settings.models_dir else paths.models
    lib = ModelLibrary(paths.library_file, models_dir)
    model_id = _pick_model(lib, settings, args.model, args.tool)
    try:
        local: LocalModel | None = lib.get(model_id)
    except ModelNotFound:
        local = None  # an alias, a provider's model: the server knows it
    served = _served(root, model_id, key) if running else None
    conn = connection(args.tool, Target(root, model_id, key, key_required))
    current, trained = _context(paths, settings, local, served)
    cap = settings.load.max_auto_context
    check = check_context(
        conn.context_needed, model_id, current=current, trained=trained, auto_cap=cap
    )
    if args.set_context and not check.ok:
        _apply_context(paths, local, conn.context_needed, check, running and served is not None)
        check = ContextCheck(True)
    out = conn.as_json()
    out.update(context_ok=check.ok, context_warning=check.message or None)
    fim = check_fim(args.tool, model_id, _capabilities(local, served))
    if TOOLS[args.tool].fim:
        out.update(fim_ok=fim.ok, fim_warning=fim.message or None)
    if args.exec is not None:
        return _exec(args.exec, conn.env, check)
    if args.json:
        print(json.dumps(out, indent=2))
        return EXIT_OK
    _print(out, key_required and not key)
    if not fim.ok:
        print(f"warning: {fim.message}", file=sys.stderr)
    if not check.ok:
        print(f"warning: {_advice(check, model_id, conn.context_needed)}", file=sys.stderr)
    return EXIT_OK


def _capabilities(local: LocalModel | None, served: dict[str, Any] | None) -> list[str] | None:
    """What the model does: the library's word, else the running server's; None: unknown."""
    if local is not None:
        known = known_capabilities(local)
        return list(known) if known is not None else None
    caps = served.get("capabilities") if served is not None else None
    return [str(c) for c in caps] if isinstance(caps, list) else None


def _advice(check: ContextCheck, model_id: str, needed: int) -> str:
    if not check.can_raise:
        return check.message
    return (
        f"{check.message} (hearth connect ... --set-context saves {needed:,} in the model's "
        f"preset; or hearth load {model_id} --context-length {needed})"
    )


def _apply_context(
    paths: AppPaths, local: LocalModel | None, needed: int, check: ContextCheck, loaded: bool
) -> None:
    if local is None or not check.can_raise:
        raise HearthError(check.message or "this model's context cannot be set here")
    _set_context(paths, local.id, needed)
    print(f"'{local.id}' loads with a {needed:,}-token context from now on", file=sys.stderr)
    if loaded:
        print(f"it is loaded now: hearth unload {local.id} to reload it with that", file=sys.stderr)


def _exec(cmd: list[str], env: dict[str, str], check: ContextCheck) -> int:
    if not cmd:
        return fail("--exec needs a command: hearth connect TOOL --exec -- CMD [ARGS...]")
    if not env:
        return fail("this tool reads no environment variables: use the printed settings instead")
    if not check.ok:
        print(f"warning: {check.message}", file=sys.stderr)
    try:
        return subprocess.call(cmd, env={**os.environ, **env})
    except OSError as e:
        print(f"hearth: error: cannot run {cmd[0]}: {e.strerror or e}", file=sys.stderr)
        return EXIT_FAIL


def _print(out: dict[str, Any], key_missing: bool) -> None:
    print(f"{out['title']}: base URL {out['base_url']}, model {out['model']}")
    print(f"context needed: {out['context_needed']:,} tokens")
    if out["env"]:
        print("\nenvironment:")
        for k, v in out["env"].items():
            print(f"  {k}={v}")
    print(f"\n{out['snippet']}")
    for n in out["notes"]:
        print(f"note: {n}")
    if key_missing:
        print(
            "note: this server requires an API key: pass --key, or make one with "
            "hearth keys add NAME (it is printed once)"
        )


def exec_argv(argv: list[str]) -> list[str]:
    """``connect ... --exec -- CMD``: argparse takes a ``--`` as the end of options, never as
    the start of ``--exec``'s command, so the one right after ``--exec`` is dropped here."""
    if "connect" in argv and "--exec" in argv:
        i = argv.index("--exec")
        if argv[i + 1 : i + 2] == ["--"]:
            return argv[: i + 1] + argv[i + 2 :]
    return argv


def add_parsers(sub: Any) -> None:
    s = sub.add_parser(
        "connect",
        help="settings for an app (Continue, Cline, Zed, Claude Code, llama.vscode...) to use "
        "Hearth",
    )
    s.add_argument("tool", choices=list(TOOLS), metavar="TOOL", help=", ".join(TOOLS))
    s.add_argument("--model", help="the model id (default: default_model, else the first)")
    s.add_argument("--key", help="the API key to show (default: HEARTH_API_KEY)")
    s.add_argument("--url", help="the server's URL (default: the running one, else settings)")
    s.add_argument("--json", action="store_true", help="one JSON object")
    s.add_argument(
        "--set-context",
        action="store_true",
        help="when the model's context is too small for the tool, save a larger one in its preset",
    )
    s.add_argument(
        "--exec",
        nargs=argparse.REMAINDER,
        metavar="-- CMD",
        help="run CMD with the tool's environment variables set; exits with its exit code",
    )
    s.set_defaults(func=cmd_connect)
