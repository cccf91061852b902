"""``hearth transcribe FILE``: speech to text in process (no server needed), on a Whisper model
of the library; the transcript is printed in the asked format (the same renderer as
/v1/audio/transcriptions). Exit codes: 0, 1 (the transcription failed), 2 (a bad argument).
Tested by tests/server/audio/test_transcribe_cli.py."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from app.cli.common import EXIT_OK, EXIT_USAGE, context
from app.compose import build_service
from app.core.engine.models import speech_models
from app.core.requests import TranscriptionRequest
from app.core.service import Hearth
from app.core.types import AudioInput
from app.server.protocols.openai import audio as wire


def _usage(msg: str) -> int:
    print(f"hearth transcribe: error: {msg}", file=sys.stderr)
    return EXIT_USAGE


def _speech_model(service: Hearth, asked: str | None) -> str | None:
    """The model asked for (an id or a folder's path), or the library's only speech model
    (None: none or several)."""
    if asked:
        return asked
    ids = speech_models(service.models.all())
    return ids[0] if len(ids) == 1 else None


def cmd_transcribe(args: argparse.Namespace) -> int:
    path = Path(args.file).expanduser()
    if not path.is_file():
        return _usage(f"{args.file}: no such file")
    paths, store = context()
    settings = store.load()
    service = build_service(paths, settings)
    model = _speech_model(service, args.model)
    if model is None:
        return _usage(
            "name the speech model with --model (the library has none or several Whisper "
            "models; import one with: hearth import PATH/whisper-folder)"
        )
    task = "translate" if args.translate else "transcribe"
    fields = {"response_format": [args.format]}
    if args.language:
        fields["language"] = [args.language]
    audio = AudioInput(path.read_bytes(), path.name, settings.audio.max_seconds)
    parsed = wire.parse(fields, audio, task=task)

    async def main() -> str:
        try:
            model_id = (await service.models.resolve(model)).id  # an id, or a folder's path
            result = await service.transcribe(TranscriptionRequest(model_id, parsed.request.job))
            segments = [s async for s in result.transcript]
            t = result.transcript
            return wire.render(parsed, segments, t.language, t.duration)[0]
        finally:
            await service.close()

    body = asyncio.run(main())
    sys.stdout.write(body if body.endswith("\n") else body + "\n")
    return EXIT_OK


def add_parsers(sub: Any) -> None:
    s = sub.add_parser(
        "transcribe", help="speech to text on a Whisper model (in process, no server needed)"
    )
    s.add_argument("file", metavar="FILE", help="an audio file (wav, mp3, flac, ogg, m4a...)")
    s.add_argument("--model", metavar="ID", help="the Whisper model (default: the only one)")
    s.add_argument("--format", choices=wire.FORMATS, default="text", help="default: text")
    s.add_argument("--language", metavar="L", help="the spoken language (ISO-639-1: en, de...)")
    s.add_argument("--translate", action="store_true", help="translate the speech into English")
    s.set_defaults(func=cmd_transcribe)
