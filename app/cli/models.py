"""Library and model commands: import, ls, rm, run, and ps/load/unload on the running server.
Tested by tests/e2e/models/test_models_lifecycle.py and tests/e2e/cli/test_cli.py."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from app.cli.common import (
    EXIT_OK,
    api,
    api_key,
    context,
    find_server,
    human_bytes,
    human_count,
    log,
    require_server,
)
from app.cli.load_flags import add_load_flags, load_options_from_args
from app.compose import build_service
from app.core.inference.images import ImageLimits, InvalidImage, supports_vision
from app.core.requests import ChatRequest
from app.core.types import ChatMessage, LocalModel, SamplingParams
from app.core.workspace.chat_images import ChatImage, decode_messages, read_image_file, user_message
from app.errors import HearthError


def cmd_import(args: argparse.Namespace) -> int:
    paths, store = context()
    service = build_service(paths, store.load())
    model, created = service.models.import_path(args.path, copy=args.copy)
    print(model.id)
    if not created:
        log.info("already in the library")
    elif model.extra.get("projector"):
        print(f"vision: paired with {model.extra['projector']}", file=sys.stderr)
    if created and model.extra.get("projector_refused"):
        print(f"not paired with a projector: {model.extra['projector_refused']}", file=sys.stderr)
    return EXIT_OK


def cmd_ls(args: argparse.Namespace) -> int:
    paths, store = context()
    service = build_service(paths, store.load())
    models = [s.model for s in service.models.all()]
    if args.json:
        print(json.dumps([m.summary() for m in models], indent=2))
        return EXIT_OK
    if not models:
        print("No models yet. Add one with: hearth import PATH/model.gguf", file=sys.stderr)
        return EXIT_OK
    rows = [("ID", "FORMAT", "QUANT", "PARAMS", "SIZE", "CONTEXT", "INPUT")]
    for m in models:
        rows.append(
            (
                m.id,
                m.format,
                m.quantization or "-",
                human_count(m.parameters),
                human_bytes(m.size_bytes),
                str(m.context_length or "-"),
                # a Whisper model takes speech; a vision model images besides text
                "audio"
                if "transcription" in m.capabilities
                else "vision"
                if "vision" in m.capabilities
                else "-",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return EXIT_OK


def cmd_rm(args: argparse.Namespace) -> int:
    paths, store = context()
    service = build_service(paths, store.load())
    url = find_server(paths, None)
    if url:  # a running server frees the model first (best effort)
        try:
            api(url, "POST", "/api/v1/models/unload", {"model": args.model}, api_key(args))
        except HearthError:
            pass
    model, deleted = asyncio.run(service.models.remove(args.model, delete_file=args.delete_file))
    print(f"removed {model.id}" + (f" and deleted {model.path}" if deleted else " (file kept)"))
    return EXIT_OK


def attach_image(model: LocalModel, arg: str, limits: ImageLimits) -> ChatImage | None:
    """``/image PATH``: the image checked for the next message, or None (said on stderr)."""
    if not arg:
        print("usage: /image PATH (attaches an image to your next message)", file=sys.stderr)
        return None
    if not supports_vision(model):
        print(
            f"{model.id} cannot see images: it has no vision projector; run a vision model "
            f"(one with its mmproj projector) to send images",
            file=sys.stderr,
        )
        return None
    try:
        img = read_image_file(Path(arg).expanduser(), limits)
    except InvalidImage as e:
        print(f"image not attached: {e.message}", file=sys.stderr)
        return None
    print(f"attached {img.name} ({img.width}×{img.height}) to your next message", file=sys.stderr)
    return img


def cmd_run(args: argparse.Namespace) -> int:
    paths, store = context()
    settings = store.load()
    service = build_service(paths, settings)
    interactive = sys.stdin.isatty()
    vcfg = settings.vision
    limits = vcfg.limits()

    async def main() -> int:
        model = await service.models.resolve(args.model)
        await service.models.load(model.id, load_options_from_args(args) or None)
        history: list[ChatMessage] = []
        images: list[ChatImage] = []  # /image: for the next message
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
                if text.strip() == "/image" or text.startswith("/image "):
                    arg = text.strip()[len("/image") :].strip()
                    img = await loop.run_in_executor(None, attach_image, model, arg, limits)
                    if img is not None:
                        images.append(img)
                    continue
                if not text.strip():
                    continue
                msg = user_message(text, images)
                if images:  # decoded once, sent with every later turn in the history
                    msg = (await asyncio.to_thread(decode_messages, [msg], limits))[0]
                images = []
                history.append(msg)
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
                    if d.finish_reason is not None and args.stats and d.usage is not None:
                        u = d.usage
                        print(
                            f"\n[prompt {u.prompt_tokens} tokens ({u.cached_tokens} cached), "
                            f"answer {u.completion_tokens} tokens]",
                            end="",
                            file=sys.stderr,
                        )
                sys.stdout.write("\n")
                sys.stdout.flush()
                history.append(ChatMessage("assistant", "".join(parts)))
        finally:
            await service.close()
        return EXIT_OK

    return asyncio.run(main())


def cmd_ps(args: argparse.Namespace) -> int:
    paths, _ = context()
    url = require_server(paths, args.url)
    data = api(url, "GET", "/api/v1/ps", None, api_key(args))
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
                human_bytes(m["memory_bytes"]),
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
            f"memory: {human_bytes(mem['used'])} of {human_bytes(mem['budget'])} budget",
            file=sys.stderr,
        )
    return EXIT_OK


def cmd_load(args: argparse.Namespace) -> int:
    paths, _ = context()
    url = require_server(paths, args.url)
    body: dict[str, Any] = {
        "model": args.model,
        "options": load_options_from_args(args),
        "force": args.force,
        "wait": args.wait,
    }
    if args.ttl is not None:
        body["ttl"] = args.ttl
    if args.pin:
        body["pin"] = True
    # --wait may wait for long generations on the model before its reload
    timeout = 24 * 3600 if args.wait else 600
    data = api(url, "POST", "/api/v1/models/load", body, api_key(args), timeout=timeout)
    if args.json:
        keys = ("id", "action", "options", "context_length")
        print(json.dumps({k: data.get(k) for k in keys}))
    else:
        print(f"{data['action']} {data['id']} (context {data['context_length']})")
    return EXIT_OK


def cmd_unload(args: argparse.Namespace) -> int:
    paths, _ = context()
    url = require_server(paths, args.url)
    data = api(url, "POST", "/api/v1/models/unload", {"model": args.model}, api_key(args))
    print(json.dumps(data) if args.json else f"unloaded {data['id']}")
    return EXIT_OK


def add_parsers(sub: Any) -> None:
    """import, ls, rm, run, ps, load, unload."""
    s = sub.add_parser(
        "import",
        help="add a GGUF file, MLX or Whisper folder to the library (in place unless --copy)",
    )
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

    s = sub.add_parser(
        "run",
        help="chat with a model in the terminal (/image PATH attaches an image, /bye leaves)",
    )
    s.add_argument("model", metavar="ID_OR_PATH")
    s.add_argument(
        "--stats",
        action="store_true",
        help="after each answer, its token counts (prompt, cached, answer) on stderr",
    )
    s.add_argument("--system", default=None, help="system prompt")
    s.add_argument("--temperature", type=float, default=0.7)
    s.add_argument("--max-tokens", type=int, default=None)
    add_load_flags(s)
    s.set_defaults(func=cmd_run)

    for name, fn, hlp in (
        ("ps", cmd_ps, "list the models loaded in the running server"),
        ("load", cmd_load, "load (or reload with other options) a model in the running server"),
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
            add_load_flags(s)
            s.add_argument("--ttl", help='unload after this long idle: seconds or "5m"; -1 = never')
            s.add_argument("--pin", action="store_true", help="never unload on its own")
            s.add_argument(
                "--force", action="store_true", help="load even if the memory budget says no"
            )
            s.add_argument(
                "--wait",
                action="store_true",
                help="a reload while requests run on the model waits for them to finish "
                "(without it, that is refused)",
            )
        s.set_defaults(func=fn)
