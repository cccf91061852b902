"""The front door: no subcommand opens the desktop app; subcommands script the same core.

Exit codes: 0 success, 1 failure, 2 usage error. Results go to stdout, logs to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from app import __version__
from app.core.events import EventHub
from app.core.library import ModelLibrary
from app.core.requests import ChatRequest
from app.core.service import Hearth
from app.core.types import ChatMessage, LoadOptions, SamplingParams
from app.errors import HearthError
from app.paths import AppPaths
from app.settings import Settings, SettingsStore

log = logging.getLogger("app.cli")

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


# -- composition root ------------------------------------------------------------------------
def build_service(paths: AppPaths, settings: Settings) -> Hearth:
    """Wire the core to the runtimes available on this machine."""
    from app.core.presets import PresetStore
    from app.core.scheduler import default_budget
    from app.runtimes.llama_cpp import LlamaCppRuntime
    from app.runtimes.mlx import MlxRuntime

    models_dir = Path(settings.models_dir) if settings.models_dir else paths.models
    library = ModelLibrary(paths.library_file, models_dir)
    runtimes: dict[str, Any] = {
        "gguf": LlamaCppRuntime(probe_file=paths.probe_file, queue_size=settings.server.queue_size),
        # MLX models are listed everywhere; loading one where mlx is missing is a clear 501
        "mlx": MlxRuntime(queue_size=settings.server.queue_size),
    }
    store = SettingsStore(paths.settings_file)

    def load_defaults() -> LoadOptions:
        d = store.load().load
        return LoadOptions(
            context_length=d.context_length,
            threads=d.threads,
            batch_size=d.batch_size,
            parallel=d.parallel,
        )

    def jit_ttl() -> float | None:
        d = store.load().load
        return None if d.jit_keep_forever else float(d.jit_ttl_s)

    def budget() -> int:
        return store.load().load.memory_budget_bytes or default_budget()

    events = EventHub()
    return Hearth(
        library,
        runtimes,
        events=events,
        **_hub_parts(paths, settings, library, events),  # issue #3: downloads, other apps' models
        load_defaults=load_defaults,
        jit_enabled=lambda: store.load().server.jit_loading,
        presets=PresetStore(paths.config / "presets.json"),
        budget_bytes=budget,
        default_ttl=jit_ttl,
        calibration_file=paths.cache / "memory-calibration.json",
    )


def _setup_logging(verbose: int) -> None:
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(
        level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


def _context() -> tuple[AppPaths, SettingsStore]:
    paths = AppPaths.default().ensure()
    return paths, SettingsStore(paths.settings_file)


def _fail(msg: str) -> int:
    print(f"hearth: error: {msg}", file=sys.stderr)
    return EXIT_FAIL


# -- commands ----------------------------------------------------------------------------------
def cmd_import(args: argparse.Namespace) -> int:
    paths, store = _context()
    service = build_service(paths, store.load())
    model, created = service.import_model(args.path, copy=args.copy)
    print(model.id)
    if not created:
        log.info("already in the library")
    return EXIT_OK


def cmd_ls(args: argparse.Namespace) -> int:
    paths, store = _context()
    service = build_service(paths, store.load())
    models = service.library.list()
    if args.json:
        print(json.dumps([m.summary() for m in models], indent=2))
        return EXIT_OK
    if not models:
        print("No models yet. Add one with: hearth import PATH/model.gguf", file=sys.stderr)
        return EXIT_OK
    rows = [("ID", "FORMAT", "QUANT", "PARAMS", "SIZE", "CONTEXT")]
    for m in models:
        rows.append(
            (
                m.id,
                m.format,
                m.quantization or "-",
                _human_count(m.parameters),
                _human_bytes(m.size_bytes),
                str(m.context_length or "-"),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return EXIT_OK


def cmd_rm(args: argparse.Namespace) -> int:
    paths, store = _context()
    service = build_service(paths, store.load())
    url = _find_server(paths, None)
    if url:  # a running server frees the model first (best effort)
        try:
            _api(url, "POST", "/api/v1/models/unload", {"model": args.model}, _api_key(args))
        except HearthError:
            pass
    model, deleted = service.library.remove(args.model, delete_file=args.delete_file)
    print(f"removed {model.id}" + (f" and deleted {model.path}" if deleted else " (file kept)"))
    return EXIT_OK


def cmd_serve(args: argparse.Namespace) -> int:
    from app.server.runner import ServerController

    paths, store = _context()
    settings = store.load()
    api_key = args.api_key or os.environ.get("HEARTH_API_KEY") or None
    service = build_service(paths, settings)
    controller = ServerController(service, store, paths)
    controller.set_api_key(api_key)

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, stop.set)
            except (NotImplementedError, RuntimeError):  # pragma: no cover - Windows
                signal.signal(sig, lambda *_: loop.call_soon_threadsafe(stop.set))
        try:
            url = await controller.start(args.host, args.port)
        except HearthError as e:
            return _fail(e.message)
        print(url, flush=True)
        rc = EXIT_OK
        try:
            for ref in args.model or []:
                model = await service.resolve_model(ref)
                lm = await service.load(model.id)
                log.warning("model %s ready (context %d)", model.id, lm.context_length)
            await stop.wait()
        except HearthError as e:
            rc = _fail(e.message)
        finally:
            await controller.stop("shutdown")
            await service.close()
        return rc

    return asyncio.run(main())


def cmd_run(args: argparse.Namespace) -> int:
    paths, store = _context()
    service = build_service(paths, store.load())
    interactive = sys.stdin.isatty()

    async def main() -> int:
        model = await service.resolve_model(args.model)
        await service.load(model.id)
        history: list[ChatMessage] = []
        if args.system:
            history.append(ChatMessage("system", args.system))
        loop = asyncio.get_running_loop()
        if interactive:
            print(f"Chatting with {model.id}. Type /bye to leave.", file=sys.stderr)
        try:
            while True:
                if interactive:
                    print(">>> ", end="", file=sys.stderr, flush=True)
                line = await loop.run_in_executor(None, sys.stdin.readline)
                if not line:
                    break
                text = line.rstrip("\n")
                if text.strip() == "/bye":
                    break
                if not text.strip():
                    continue
                history.append(ChatMessage("user", text))
                req = ChatRequest(
                    model.id,
                    tuple(history),
                    sampling=SamplingParams(temperature=args.temperature),
                    max_tokens=args.max_tokens,
                )
                gen = (await service.chat(req)).first
                parts = []
                async for d in gen:
                    if d.text:
                        parts.append(d.text)
                        sys.stdout.write(d.text)
                        sys.stdout.flush()
                    if d.finish_reason == "error":
                        raise HearthError(d.error or "generation failed")
                sys.stdout.write("\n")
                sys.stdout.flush()
                history.append(ChatMessage("assistant", "".join(parts)))
        finally:
            await service.close()
        return EXIT_OK

    return asyncio.run(main())


def cmd_ps(args: argparse.Namespace) -> int:
    paths, _ = _context()
    url = _require_server(paths, args.url)
    data = _api(url, "GET", "/api/v1/ps", None, _api_key(args))
    if args.json:
        print(json.dumps(data["models"], indent=2))
        return EXIT_OK
    if not data["models"]:
        print("No models loaded.", file=sys.stderr)
        return EXIT_OK
    rows = [("ID", "RUNTIME", "CONTEXT", "MEMORY", "UNTIL", "PENDING")]
    now = time.time()
    for m in data["models"]:
        if m["pinned"]:
            until = "pinned"
        elif m["ttl"] is None:
            until = "forever"
        elif m["expires_at"] is None:
            until = "busy"
        else:
            until = f"{max(0, int(m['expires_at'] - now))}s"
        rows.append(
            (
                m["id"],
                m["runtime"],
                str(m["context_length"]),
                _human_bytes(m["memory_bytes"]),
                until,
                str(m["pending_requests"]),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    mem = data.get("memory") or {}
    if mem:
        print(
            f"memory: {_human_bytes(mem['used'])} of {_human_bytes(mem['budget'])} budget",
            file=sys.stderr,
        )
    return EXIT_OK


def cmd_load(args: argparse.Namespace) -> int:
    paths, _ = _context()
    url = _require_server(paths, args.url)
    body: dict[str, Any] = {
        "model": args.model,
        "options": _load_options(args),
        "force": args.force,
    }
    if args.ttl is not None:
        body["ttl"] = args.ttl
    if args.pin:
        body["pin"] = True
    data = _api(url, "POST", "/api/v1/models/load", body, _api_key(args), timeout=600)
    print(
        json.dumps(data) if args.json else f"loaded {data['id']} (context {data['context_length']})"
    )
    return EXIT_OK


def cmd_unload(args: argparse.Namespace) -> int:
    paths, _ = _context()
    url = _require_server(paths, args.url)
    data = _api(url, "POST", "/api/v1/models/unload", {"model": args.model}, _api_key(args))
    print(json.dumps(data) if args.json else f"unloaded {data['id']}")
    return EXIT_OK


def cmd_gui(args: argparse.Namespace) -> int:
    from app.core.loop import LoopThread
    from app.gui.context import GuiContext
    from app.gui.main_window import run_gui
    from app.server.runner import ServerController

    paths, store = _context()
    service = build_service(paths, store.load())
    loop = LoopThread().start()
    server = ServerController(service, store, paths)
    server.set_api_key(os.environ.get("HEARTH_API_KEY") or None)
    ctx = GuiContext(service=service, loop=loop, settings_store=store, paths=paths, server=server)
    try:
        return run_gui(ctx)
    finally:
        try:
            loop.call(server.stop("quit"), timeout=15)
            loop.call(service.close(), timeout=30)
        finally:
            loop.stop()


def _load_options(args: argparse.Namespace) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    for flag, key in (
        ("ctx", "context_length"),
        ("gpu_layers", "gpu_layers"),
        ("threads", "threads"),
        ("batch", "batch_size"),
        ("kv_type", "kv_type"),
        ("flash_attention", "flash_attention"),
        ("seed", "seed"),
        ("parallel", "parallel"),
    ):
        v = getattr(args, flag, None)
        if v is not None:
            opts[key] = v
    if getattr(args, "no_mmap", False):
        opts["use_mmap"] = False
    if getattr(args, "mlock", False):
        opts["use_mlock"] = True
    return opts


# -- talking to a running server ---------------------------------------------------------------
def _api_key(args: argparse.Namespace) -> str | None:
    return getattr(args, "api_key", None) or os.environ.get("HEARTH_API_KEY") or None


def _find_server(paths: AppPaths, url: str | None) -> str | None:
    if url:
        return url.rstrip("/").removesuffix("/v1")
    try:
        info = json.loads(paths.server_file.read_text())
    except (OSError, ValueError):
        return None
    pid = info.get("pid")
    if isinstance(pid, int):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
    u = info.get("url")
    return u.removesuffix("/v1") if isinstance(u, str) else None


def _require_server(paths: AppPaths, url: str | None) -> str:
    found = _find_server(paths, url)
    if not found:
        raise HearthError(
            "no running Hearth server found (start one with `hearth serve`, or pass --url)"
        )
    return found


def _api(base: str, method: str, path: str, body: Any, key: str | None, timeout: float = 30) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        try:
            msg = json.loads(e.read())["error"]["message"]
        except (ValueError, KeyError, TypeError):
            msg = f"HTTP {e.code}"
        raise HearthError(msg) from e
    except (urllib.error.URLError, OSError) as e:
        raise HearthError(f"cannot reach the Hearth server at {base}: {e}") from e


# -- formatting ---------------------------------------------------------------------------------
def _human_bytes(n: int | None) -> str:
    if not n:
        return "-"
    size = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{n} B"


def _size_range(size_range: tuple[int, int] | None) -> str:
    """``"1.2-7.7 GB"`` (ASCII for any terminal); one size when both ends match; ``-`` unknown."""
    if not size_range:
        return "-"
    lo, hi = _human_bytes(size_range[0]), _human_bytes(size_range[1])
    if lo == hi:
        return lo
    lo_num, _, lo_unit = lo.partition(" ")
    return f"{lo_num}-{hi}" if hi.endswith(" " + lo_unit) else f"{lo}-{hi}"


def _human_count(n: int | None) -> str:
    if not n:
        return "-"
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.1f}{suffix}"
    return str(n)


# -- Hugging Face Hub: search, pull, scan (issue #3) -------------------------------------------------
def _hub_parts(
    paths: AppPaths, settings: Settings, library: ModelLibrary, events: EventHub
) -> dict[str, Any]:
    """The download manager and other apps' model stores, for build_service."""
    from app.core.downloads import DownloadManager
    from app.core.stores import ForeignLocations

    hub = _hub_client(paths, settings)
    downloads = DownloadManager(
        library,
        hub,
        events,
        stall_timeout=settings.downloads.stall_timeout_s,
        max_concurrent=settings.downloads.max_concurrent,
    )
    return {"downloads": downloads, "foreign": ForeignLocations.default()}


def _hub_client(paths: AppPaths, settings: Settings) -> Any:
    from app.core.hub import HubClient
    from app.settings import TokenStore

    # the token file is read on every request, so a token set in the app applies at once
    tokens = TokenStore(paths.hf_token_file)
    return HubClient(token=tokens.load, context_length=settings.load.context_length)


def cmd_search(args: argparse.Namespace) -> int:
    paths, store = _context()
    hub = _hub_client(paths, store.load())
    fmt = None if args.format == "any" else args.format

    async def search() -> list[Any]:
        found = await hub.search(
            args.query, format=fmt, sort=args.sort, limit=args.limit, author=args.author
        )
        # the search answer has no file sizes: one repo lookup each, a few at a time
        return found if args.no_sizes else await hub.with_sizes(found)

    results = asyncio.run(search())
    if args.json:
        print(json.dumps([r.as_dict() for r in results], indent=2))
        return EXIT_OK
    if not results:
        print("No models found.", file=sys.stderr)
        return EXIT_OK
    rows = [("ID", "FORMAT", "SIZE", "DOWNLOADS", "LIKES", "UPDATED", "LICENSE", "ACCESS")]
    for r in results:
        access = "private" if r.private else f"gated ({r.gated})" if r.gated else "open"
        updated = r.last_modified.date().isoformat() if r.last_modified else "-"
        fmt = r.format or "-"
        size = _size_range(r.size_range)
        rows.append(
            (r.id, fmt, size, str(r.downloads), str(r.likes), updated, r.license or "-", access)
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return EXIT_OK


class _ProgressBar:
    """One line on stderr, redrawn in place on a terminal; state changes only otherwise."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.last_state: str | None = None
        self.drawn = False

    def show(self, p: dict[str, Any]) -> None:
        state = str(p.get("status") or p.get("state") or "")
        done, total = int(p.get("completed") or 0), int(p.get("total") or 0)
        name = p.get("name") or p.get("file") or ""
        if self.tty:
            pct = done / total if total else 0.0
            bar = "#" * int(pct * 24)
            speed = float(p.get("speed_bps") or 0)
            eta = p.get("eta_s")
            tail = f"{_human_bytes(int(speed))}/s" if speed else ""
            if eta is not None:
                tail += f" ETA {int(eta) // 60}:{int(eta) % 60:02d}"
            line = f"{name} [{bar:<24}] {pct * 100:5.1f}% {_human_bytes(done)}/{_human_bytes(total)} {state} {tail}"
            self.stream.write("\r" + line[:160].ljust(100))
            self.stream.flush()
            self.drawn = True
        elif state != self.last_state:
            self.stream.write(f"{state}: {name} {done}/{total} bytes\n")
            self.stream.flush()
        self.last_state = state

    def close(self) -> None:
        if self.tty and self.drawn:
            self.stream.write("\n")
            self.stream.flush()


def _report_pull_error(msg: str, choices: list[str] | None) -> int:
    rc = _fail(msg)
    if choices:
        print("choices:", file=sys.stderr)
        for c in choices:
            print(f"  {c}", file=sys.stderr)
    return rc


def cmd_pull(args: argparse.Namespace) -> int:
    paths, store = _context()
    url = _find_server(paths, args.url)
    if url:
        return _pull_via_server(url, args.model, _api_key(args))
    from app.errors import AmbiguousChoice

    service = build_service(paths, store.load())
    dm = service.downloads
    if dm is None:  # pragma: no cover - build_service always wires it
        return _fail("downloads are not available")
    bar = _ProgressBar()

    async def main() -> int:
        try:
            plan = await dm.resolve(args.model)
            status = await dm.start(plan)
            async for s in dm.watch(status.id):
                bar.show({**s.as_dict(), "completed": s.bytes_done, "total": s.total_bytes})
            model = await dm.wait(status.id)
        except AmbiguousChoice as e:
            bar.close()
            return _report_pull_error(e.message, e.choices)
        except HearthError as e:
            bar.close()
            return _fail(e.message)
        finally:
            await service.close()
        bar.close()
        print(model.id)
        return EXIT_OK

    return asyncio.run(main())


def _pull_via_server(base: str, ref: str, key: str | None) -> int:
    """POST /api/v1/pull on the running server and follow its NDJSON progress."""
    req = urllib.request.Request(
        base + "/api/v1/pull", data=json.dumps({"model": ref}).encode(), method="POST"
    )
    req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    bar = _ProgressBar()
    download_id = None
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            for raw in r:
                if not raw.strip():
                    continue
                line = json.loads(raw)
                download_id = line.get("id") or download_id
                if line.get("status") == "success":
                    bar.close()
                    print(line["model"])
                    return EXIT_OK
                if line.get("status") == "error":
                    bar.close()
                    err = line.get("error") or {}
                    return _report_pull_error(err.get("message", "pull failed"), err.get("choices"))
                bar.show(line)
    except urllib.error.HTTPError as e:
        bar.close()
        try:
            err = json.loads(e.read())["error"]
        except (ValueError, KeyError, TypeError):
            err = {"message": f"HTTP {e.code}"}
        return _report_pull_error(err.get("message", f"HTTP {e.code}"), err.get("choices"))
    except KeyboardInterrupt:
        bar.close()
        if download_id:  # stop it like an in-process pull stops: paused, resumable
            try:
                _api(base, "POST", f"/api/v1/downloads/{download_id}/pause", None, key)
            except HearthError:
                pass
        raise
    except (urllib.error.URLError, OSError, ValueError) as e:
        bar.close()
        return _fail(f"lost the Hearth server at {base} during the pull: {e}")
    bar.close()
    return _fail("the server ended the pull without a result")


def cmd_scan(args: argparse.Namespace) -> int:
    paths, store = _context()
    service = build_service(paths, store.load())
    added = asyncio.run(service.scan_foreign_stores())
    if args.json:
        print(json.dumps([m.summary() for m in added], indent=2))
    else:
        for m in added:
            print(f"{m.id}  ({m.origin})")
        if not added:
            print("No new models found in the HF cache, LM Studio or Ollama.", file=sys.stderr)
    return EXIT_OK


def _add_hub_commands(sub: Any) -> None:
    s = sub.add_parser("search", help="search the Hugging Face Hub for GGUF (or MLX) models")
    s.add_argument("query", nargs="?", default="")
    s.add_argument("--json", action="store_true", help="one JSON array on stdout")
    sorts = ("downloads", "likes", "recent", "created")
    s.add_argument("--sort", choices=sorts, default="downloads")
    s.add_argument("--limit", type=int, default=20)
    s.add_argument("--format", choices=("gguf", "mlx", "any"), default="gguf")
    s.add_argument("--author", default=None)
    s.add_argument(
        "--no-sizes",
        action="store_true",
        help="skip reading each repo's file list (no SIZE; size_range is null)",
    )
    s.set_defaults(func=cmd_search)

    s = sub.add_parser(
        "pull",
        help="download a model from the Hub: REPO, REPO:QUANT or REPO/FILE (prints its id)",
    )
    s.add_argument("model", metavar="REPO[:QUANT|/FILE]")
    s.add_argument("--url", default=None, help="a running server to download through")
    s.add_argument("--api-key", default=None)
    s.set_defaults(func=cmd_pull)

    s = sub.add_parser(
        "scan", help="index models from the HF cache, LM Studio and Ollama (in place, no copy)"
    )
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_scan)


# -- parser -----------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hearth",
        description="Run open LLMs locally; serve them over an OpenAI-compatible API.",
    )
    p.add_argument("--version", action="version", version=f"hearth {__version__}")
    p.add_argument(
        "-v", "--verbose", action="count", default=0, help="more logging on stderr (-vv for debug)"
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    s = sub.add_parser("serve", help="run the server headless until SIGINT/SIGTERM")
    s.add_argument("--host", default=None, help="bind address (default from settings: 127.0.0.1)")
    s.add_argument(
        "--port",
        type=int,
        default=None,
        help="port (default from settings: 8421; 0 = any free port)",
    )
    s.add_argument(
        "--model",
        action="append",
        metavar="ID_OR_PATH",
        help="preload a model (repeatable); a GGUF path is imported",
    )
    s.add_argument("--api-key", default=None, help="require this bearer key (also HEARTH_API_KEY)")
    s.set_defaults(func=cmd_serve)

    s = sub.add_parser("import", help="add a GGUF file to the library (in place unless --copy)")
    s.add_argument("path")
    s.add_argument("--copy", action="store_true", help="copy the file into Hearth's models folder")
    s.set_defaults(func=cmd_import)

    s = sub.add_parser("ls", help="list the library")
    s.add_argument("--json", action="store_true", help="one JSON array on stdout")
    s.set_defaults(func=cmd_ls)

    s = sub.add_parser(
        "rm", help="remove a model from the library (deletes the file only if Hearth owns it)"
    )
    s.add_argument("model", metavar="ID")
    s.add_argument(
        "--delete-file",
        action="store_true",
        help="also delete the file of a model another app downloaded (HF cache, LM Studio, Ollama)",
    )
    s.set_defaults(func=cmd_rm)

    s = sub.add_parser("run", help="chat with a model in the terminal (/bye to leave)")
    s.add_argument("model", metavar="ID_OR_PATH")
    s.add_argument("--system", default=None, help="system prompt")
    s.add_argument("--temperature", type=float, default=0.7)
    s.add_argument("--max-tokens", type=int, default=None)
    s.set_defaults(func=cmd_run)

    for name, fn, hlp in (
        ("ps", cmd_ps, "list the models loaded in the running server"),
        ("load", cmd_load, "load a model in the running server"),
        ("unload", cmd_unload, "unload a model from the running server"),
    ):
        s = sub.add_parser(name, help=hlp)
        if name != "ps":
            s.add_argument("model", metavar="ID")
        s.add_argument(
            "--url",
            default=None,
            help="the server's base URL (default: the one recorded by the running server)",
        )
        s.add_argument("--api-key", default=None)
        s.add_argument("--json", action="store_true")
        if name == "load":
            s.add_argument("--ctx", type=int, help="context length to allocate")
            s.add_argument("--gpu-layers", type=int, help="layers to offload (-1 auto, 0 none)")
            s.add_argument("--threads", type=int)
            s.add_argument("--batch", type=int, help="batch size")
            s.add_argument("--kv-type", choices=("f16", "q8_0", "q4_0"))
            s.add_argument("--flash-attention", choices=("auto", "on", "off"))
            s.add_argument("--seed", type=int)
            s.add_argument(
                "--parallel",
                type=int,
                help="requests decoded together (each with the full context; memory grows)",
            )
            s.add_argument("--no-mmap", action="store_true", help="read the weights into memory")
            s.add_argument("--mlock", action="store_true", help="lock the weights in RAM")
            s.add_argument("--ttl", help='unload after this long idle: seconds or "5m"; -1 = never')
            s.add_argument("--pin", action="store_true", help="never unload on its own")
            s.add_argument(
                "--force", action="store_true", help="load even if the memory budget says no"
            )
        s.set_defaults(func=fn)
    _add_hub_commands(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _setup_logging(args.verbose)
    func = getattr(args, "func", cmd_gui)
    try:
        return func(args)
    except HearthError as e:
        return _fail(e.message)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
