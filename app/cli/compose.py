"""The composition root: the core wired to the runtimes and the Hub on this machine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.core.events import EventHub
from app.core.gateway import AliasStore
from app.core.library.index import ModelLibrary
from app.core.service import Hearth
from app.core.types import LoadOptions
from app.paths import AppPaths
from app.settings import Settings, SettingsStore


def build_service(paths: AppPaths, settings: Settings) -> Hearth:
    """Wire the core to the runtimes available on this machine."""
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
    service = Hearth(
        library,
        runtimes,
        events=events,
        **hub_parts(paths, settings, library, events),  # issue #3: downloads, other apps' models
        load_defaults=load_defaults,
        jit_enabled=lambda: store.load().server.jit_loading,
        presets=PresetStore(paths.config / "presets.json"),
        budget_bytes=budget,
        default_ttl=jit_ttl,
        auto_context_cap=lambda: store.load().load.max_auto_context,
        calibration_file=paths.cache / "memory-calibration.json",
        aliases=AliasStore(paths.aliases_file),
        routing=lambda: store.load().routing_config(),
        providers=provider_pool(paths),
    )
    service.response_cache = response_cache(paths, store, service)
    return service


def mcp_manager(paths: AppPaths, store: SettingsStore) -> Any:
    """The chat's MCP servers (issue 15): mcp.json, logs/mcp-NAME.log, the live mcp settings.
    Nothing starts until the Chat page asks."""
    from app.core.workspace.mcp import McpManager

    return McpManager(paths.mcp_file, log_dir=paths.logs, live=lambda: store.load().mcp)


def response_cache(paths: AppPaths, store: SettingsStore, service: Hearth) -> Any:
    """The response cache (issue 14): its SQLite file, the live ``cache`` settings, and the
    service's own embed path for semantic mode."""
    from app.core.gateway.cache.replay import ResponseCache, local_identity
    from app.core.gateway.cache.store import CacheStore

    return ResponseCache(
        CacheStore(paths.response_cache_db),
        lambda: store.load().cache,
        embed=service.embed,
        identity=local_identity(service.library, service.presets),
    )


def build_runtimes(paths: AppPaths, settings: Settings) -> dict[str, Any]:
    """The in-process runtimes, by model format."""
    from app.runtimes.llama.runtime import LlamaCppRuntime
    from app.runtimes.mlx.runtime import MlxRuntime

    return {
        "gguf": LlamaCppRuntime(probe_file=paths.probe_file, queue_size=settings.server.queue_size),
        # MLX models are listed everywhere; loading one where mlx is missing is a clear 501
        "mlx": MlxRuntime(queue_size=settings.server.queue_size),
    }


def provider_store(paths: AppPaths) -> Any:
    from app.core.gateway.providers.store import ProviderStore

    return ProviderStore(paths.providers_file, paths.provider_keys_file)


def provider_pool(paths: AppPaths) -> Any:
    """Remote engines (issue #11): a client per provider in the providers file."""
    from app.core.gateway.providers.pool import ProviderPool
    from app.runtimes.remote.client import RemoteEngine

    return ProviderPool(provider_store(paths), RemoteEngine)


def hub_parts(
    paths: AppPaths, settings: Settings, library: ModelLibrary, events: EventHub
) -> dict[str, Any]:
    """The download manager and other apps' model stores, for build_service."""
    from app.core.hub.downloads import DownloadManager
    from app.core.library.stores import ForeignLocations

    hub = hub_client(paths, settings)
    downloads = DownloadManager(
        library,
        hub,
        events,
        stall_timeout=settings.downloads.stall_timeout_s,
        max_concurrent=settings.downloads.max_concurrent,
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
