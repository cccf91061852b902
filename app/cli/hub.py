"""Hugging Face Hub commands: search, pull (in process or through the running server), scan.
Tested by tests/e2e/pull/test_pull.py."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import urllib.error
import urllib.request
from typing import Any

from app.cli.common import (
    EXIT_OK,
    api,
    api_key,
    context,
    fail,
    find_server,
    human_bytes,
    size_range,
    ssl_context_of,
)
from app.compose import build_service, hub_client
from app.errors import HearthError


def cmd_search(args: argparse.Namespace) -> int:
    paths, store = context()
    hub = hub_client(paths, store.load())
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
        size = size_range(r.size_range)
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
            tail = f"{human_bytes(int(speed))}/s" if speed else ""
            if eta is not None:
                tail += f" ETA {int(eta) // 60}:{int(eta) % 60:02d}"
            line = f"{name} [{bar:<24}] {pct * 100:5.1f}% {human_bytes(done)}/{human_bytes(total)} {state} {tail}"
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
    rc = fail(msg)
    if choices:
        print("choices:", file=sys.stderr)
        for c in choices:
            print(f"  {c}", file=sys.stderr)
    return rc


def cmd_pull(args: argparse.Namespace) -> int:
    paths, store = context()
    url = find_server(paths, args.url)
    if url:
        return _pull_via_server(url, args.model, api_key(args))
    from app.errors import AmbiguousChoice

    service = build_service(paths, store.load())
    dm = service.hub
    if dm is None:  # pragma: no cover - build_service always wires it
        return fail("downloads are not available")
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
            return fail(e.message)
        finally:
            await service.close()
        bar.close()
        print(model.id)
        _report_projector(model.extra.get("projector"), model.extra.get("projector_refused"))
        return EXIT_OK

    return asyncio.run(main())


def _report_projector(path: Any, refused: Any) -> None:
    """Say whether the pull brought a vision projector, and why not when it was refused."""
    if refused:
        print(f"no vision: the projector was refused: {refused}", file=sys.stderr)
    elif path:
        print(f"vision: with the projector {path}", file=sys.stderr)


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
        with urllib.request.urlopen(req, timeout=120, context=ssl_context_of(base)) as r:
            for raw in r:
                if not raw.strip():
                    continue
                line = json.loads(raw)
                download_id = line.get("id") or download_id
                if line.get("status") == "success":
                    bar.close()
                    print(line["model"])
                    proj = line.get("projector") or {}
                    _report_projector(proj.get("path"), line.get("projector_refused"))
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
                api(base, "POST", f"/api/v1/downloads/{download_id}/pause", None, key)
            except HearthError:
                pass
        raise
    except (urllib.error.URLError, OSError, ValueError) as e:
        bar.close()
        return fail(f"lost the Hearth server at {base} during the pull: {e}")
    bar.close()
    return fail("the server ended the pull without a result")


def cmd_scan(args: argparse.Namespace) -> int:
    paths, store = context()
    service = build_service(paths, store.load())
    added = asyncio.run(service.models.scan_foreign())
    if args.json:
        print(json.dumps([m.summary() for m in added], indent=2))
    else:
        for m in added:
            print(f"{m.id}  ({m.origin})")
        if not added:
            print("No new models found in the HF cache, LM Studio or Ollama.", file=sys.stderr)
    return EXIT_OK


def add_parsers(sub: Any) -> None:
    s = sub.add_parser(
        "search", help="search the Hugging Face Hub for GGUF (or MLX, or Whisper speech) models"
    )
    s.add_argument("query", nargs="?", default="")
    s.add_argument("--json", action="store_true", help="one JSON array on stdout")
    sorts = ("downloads", "likes", "recent", "created")
    s.add_argument("--sort", choices=sorts, default="downloads")
    s.add_argument("--limit", type=int, default=20)
    s.add_argument("--format", choices=("gguf", "mlx", "whisper", "any"), default="gguf")
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
