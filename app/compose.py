"""The composition root: the core wired, once, to the runtimes, files and settings of this
machine. The CLI, the desktop app and ``hearth serve`` all start here.
Tested by tests/gui/views/providers/test_page.py and tests/runtimes/llama/test_autofit_real.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.core.events import EventHub, ProvidersChanged
from app.core.gateway import AliasStore
from app.core.library.index import ModelLibrary
from app.core.service import Hearth, assemble
from app.core.types import LoadOptions
from app.paths import AppPaths
from app.settings import Settings, SettingsStore


def build_service(
    paths: AppPaths,
    settings: Settings,
    *,
    cache_mode: str | None = None,
    state_url: str | None = None,
) -> Hearth:
    """Wire the core to the runtimes available on this machine (``cache_mode``: this run's
    response-cache mode over the settings', ``hearth serve --cache``; ``state_url``: the Redis
    several gateways share, ``hearth serve --state``)."""
    from app.core.engine.presets import PresetStore
    from app.core.library.fit import default_budget

    models_dir = Path(settings.models_dir) if settings.models_dir else paths.models
    library = ModelLibrary(paths.library_file, models_dir)
    runtimes = build_runtimes(paths, settings)
    store = SettingsStore(paths.settings_file)

    def load_defaults() -> LoadOptions:
        settings = store.load()
        d = settings.load
        return LoadOptions(
            context_length=d.context_length,
            threads=d.threads,
            batch_size=d.batch_size,
            parallel=d.parallel,
            prompt_cache=settings.prompt_cache.mode,
        )

    def jit_ttl() -> float | None:
        d = store.load().load
        return None if d.jit_keep_forever else float(d.jit_ttl_s)

    def budget() -> int:
        return store.load().load.memory_budget_bytes or default_budget()

    events = EventHub()
    presets = PresetStore(paths.config / "presets.json")
    shared = shared_state(state_url)
    service = assemble(
        library,
        runtimes,
        events=events,
        **hub_parts(paths, settings, library, events),  # downloads, other apps' models
        load_defaults=load_defaults,
        jit_enabled=lambda: store.load().server.jit_loading,
        presets=presets,
        budget_bytes=budget,
        default_ttl=jit_ttl,
        auto_context_cap=lambda: store.load().load.max_auto_context,
        calibration_file=paths.cache / "memory-calibration.json",
        aliases=AliasStore(paths.aliases_file),
        routing=lambda: store.load().routing_config(),
        providers=provider_pool(paths, lambda: events.publish(ProvidersChanged()), shared=shared),
        groups=group_store(paths),
        cache=lambda embed: response_cache(
            paths, store, embed, library, presets, cache_mode, shared
        ),
        responses=response_store(paths, store, shared),
    )
    service.shared = shared
    return service


def shared_state(url: str | None) -> Any:
    """The shared state at ``url`` (None: none); the caller starts it on the serving loop."""
    if not url:
        return None
    from app.redis_state.connection import SharedState

    return SharedState(url)


def mcp_manager(paths: AppPaths, store: SettingsStore) -> Any:
    """The chat's MCP servers: mcp.json, logs/mcp-NAME.log, the live mcp settings.
    Nothing starts until the Chat page asks."""
    from app.core.workspace.mcp import McpManager

    return McpManager(paths.mcp_file, log_dir=paths.logs, live=lambda: store.load().mcp)


def response_cache(
    paths: AppPaths,
    store: SettingsStore,
    embed: Any,
    library: ModelLibrary,
    presets: Any,
    mode: str | None = None,
    shared: Any = None,
) -> Any:
    """The response cache: its SQLite file (or, with ``shared``, the shared Redis over that
    file while Redis cannot be reached), the live ``cache`` settings, and the pipeline's own
    embed path for semantic mode."""
    from app.core.gateway.cache.replay import ResponseCache, local_identity
    from app.core.gateway.cache.store import CacheStore

    answers: Any = CacheStore(paths.response_cache_db)
    if shared is not None:
        from app.redis_state.cache import RedisCacheStore

        answers = RedisCacheStore(shared, local=answers)
    return ResponseCache(
        answers,
        lambda: store.load().cache,
        embed=embed,
        identity=local_identity(library, presets),
        mode=mode,
    )


def response_store(paths: AppPaths, store: SettingsStore, shared: Any = None) -> Any:
    """The Responses API's stored responses: their SQLite file (or, with ``shared``, the shared
    Redis over that file while Redis cannot be reached), the live ``responses`` bounds."""
    from app.core.gateway.response_store import ResponseStore

    local = ResponseStore(paths.responses_db, lambda: store.load().responses)
    if shared is None:
        return local
    from app.redis_state.responses import SharedResponseStore

    return SharedResponseStore(shared, local, lambda: store.load().responses)


def build_runtimes(paths: AppPaths, settings: Settings) -> dict[str, Any]:
    """The in-process runtimes, by model format."""
    from app.runtimes.llama.runtime import LlamaCppRuntime
    from app.runtimes.mlx.runtime import MlxRuntime
    from app.runtimes.speech.runtime import SpeechRuntime

    return {
        "gguf": LlamaCppRuntime(probe_file=paths.probe_file, queue_size=settings.server.queue_size),
        # MLX models are listed everywhere; loading one where mlx is missing is a clear 501
        "mlx": MlxRuntime(queue_size=settings.server.queue_size),
        # Whisper folders: faster-whisper; without it a load says to install the speech extra
        "whisper": SpeechRuntime(queue_size=settings.server.queue_size),
    }


def provider_store(paths: AppPaths) -> Any:
    from app.core.gateway.providers.store import ProviderStore

    return ProviderStore(paths.providers_file, paths.provider_keys_file)


def provider_pool(paths: AppPaths, on_change: Any = None, *, shared: Any = None) -> Any:
    """Remote engines: a client per provider in the providers file (``on_change``: a
    provider's state or models changed). With ``shared`` (a SharedState) each provider's
    health is kept in Redis, where every gateway reads it."""
    from app.core.gateway.providers.pool import ProviderPool
    from app.runtimes.remote.client import RemoteEngine

    board = None
    if shared is not None:
        from app.redis_state.health import RedisHealthBoard

        board = RedisHealthBoard(shared)
    return ProviderPool(provider_store(paths), RemoteEngine, on_change=on_change, board=board)


def group_store(paths: AppPaths) -> Any:
    """The replica groups file (groups.json in the config folder)."""
    from app.core.gateway.groups.store import GroupStore

    return GroupStore(paths.config / "groups.json")


def hub_parts(
    paths: AppPaths, settings: Settings, library: ModelLibrary, events: EventHub
) -> dict[str, Any]:
    """The download manager and other apps' model stores, for build_service."""
    from app.core.hub.downloads import DownloadManager
    from app.core.hub.downloads.manager import DownloadPolicy
    from app.core.library.stores import ForeignLocations

    hub = hub_client(paths, settings)
    downloads = DownloadManager(
        library,
        hub,
        events,
        policy=DownloadPolicy(
            stall_timeout=settings.downloads.stall_timeout_s,
            max_concurrent=settings.downloads.max_concurrent,
        ),
    )
    return {"downloads": downloads, "foreign": ForeignLocations.default()}


def hub_client(paths: AppPaths, settings: Settings) -> Any:
    from app.core.hub import HubClient
    from app.settings import TokenStore

    # the token file is read on every request, so a token set in the app applies at once
    tokens = TokenStore(paths.hf_token_file)
    return HubClient(
        token=tokens.load,
        context_length=settings.load.context_length,
        listing_cache=paths.cache / "hub-listings.json",  # Discover's featured models, offline
    )
