"""create_app(): the aiohttp application, its typed state, and each protocol's routes.
Tested by tests/server/test_security.py and tests/server/edge/test_vision.py."""

from __future__ import annotations

import asyncio

from aiohttp import web

from app.core.gateway.telemetry import Telemetry
from app.core.service import Hearth
from app.server.edge.audio import AUDIO, AudioEdge
from app.server.edge.body import large_json_response, read_json_body
from app.server.edge.vision import VISION, VisionEdge
from app.server.keyguard import KeyGuard, add_rate_headers
from app.server.middleware import edge_middleware, mark_prepared
from app.server.state import REQUEST_LOG, SERVICE, STATE, ServerState
from app.settings import ServerSettings

__all__ = [
    "REQUEST_LOG",
    "SERVICE",
    "STATE",
    "ServerState",
    "create_app",
    "large_json_response",
    "read_json_body",
]


def create_app(
    service: Hearth,
    settings: ServerSettings,
    *,
    api_key_hashes: tuple[str, ...] = (),
    bound_host: str = "127.0.0.1",
    bound_addresses: tuple[str, ...] = (),
    guard: KeyGuard | None = None,
    telemetry: Telemetry | None = None,
    vision: VisionEdge | None = None,
    audio: AudioEdge | None = None,
) -> web.Application:
    """Build the application: OpenAI routes under /v1, the native API under /api/v1, /health.

    ``telemetry``: OpenTelemetry's exporters (a test's in-memory ones); by default those
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` asks for, or none (off)."""
    from app.server import telemetry as otel
    from app.server.routes import (
        anthropic,
        downloads,
        groups,
        infill,
        manage,
        metrics,
        native,
        ollama,
        openai,
        responses,
        speech,
        tokenizer,
    )

    tele = telemetry if telemetry is not None else Telemetry.from_env()
    app = web.Application(
        middlewares=[*otel.middlewares(tele), edge_middleware],
        client_max_size=settings.max_body_bytes,
    )
    app.on_response_prepare.append(mark_prepared)
    app.on_response_prepare.append(add_rate_headers)
    app[SERVICE] = service
    app[STATE] = ServerState(
        settings=settings,
        api_key_hashes=api_key_hashes,
        bound_host=bound_host,
        bound_addresses=bound_addresses,
        guard=guard,
    )
    app[VISION] = vision if vision is not None else VisionEdge()  # images
    app[AUDIO] = audio if audio is not None else AudioEdge()  # speech-to-text uploads
    if guard is not None:
        app.on_cleanup.append(lambda _app: _flush(guard))
    app.router.add_routes(openai.routes)
    app.router.add_routes(tokenizer.routes)  # /tokenize, /detokenize, /tokenizer_info
    app.router.add_routes(speech.routes)  # /v1/audio/transcriptions, translations
    app.router.add_routes(infill.routes)  # llama-server's /infill
    app.router.add_routes(native.routes)
    app.router.add_routes(ollama.routes)
    app.router.add_routes(anthropic.routes)
    app.router.add_routes(responses.routes)
    app.router.add_routes(downloads.routes)
    app.router.add_routes(groups.routes)  # replica groups (before /api/v1/providers/{name})
    app.router.add_routes(manage.routes)  # keys, providers
    metrics.install(app)  # /metrics, /api/v1/metrics
    otel.install(app, tele, owned=telemetry is None)  # spans and metrics, when on
    app.on_startup.append(_start_providers)
    return app


async def _flush(guard: KeyGuard) -> None:
    await asyncio.get_running_loop().run_in_executor(None, guard.flush)


async def _start_providers(app: web.Application) -> None:
    """Probe every provider as the server starts (not at the first request that needs one)."""
    service = app[SERVICE]
    service.routing.provider_statuses()  # starts probing the providers
    if service.routing.groups is not None:
        service.routing.groups.statuses()  # and the active checks of the groups' members
