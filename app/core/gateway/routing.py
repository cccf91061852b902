"""What a request may name besides a local model: the providers' models (``PREFIX/id``) and
the aliases, as the GUI, the server and the CLI list and edit them.

Lists take the caller's ``scope`` (a key's model patterns; None: every name): an alias shows
only the targets the scope reaches, and a provider's model outside it is never listed.
Tested by tests/core/gateway/test_gateway.py and tests/server/gateway/test_gateway.py.
"""

from __future__ import annotations

from collections.abc import Sequence

from app.core.gateway.auto import RequestFacts
from app.core.gateway.groups.router import GroupRouter
from app.core.gateway.providers import manage
from app.core.gateway.providers.pool import ProviderPool, ProviderStatus, RemoteListing
from app.core.gateway.providers.store import ProviderConfig
from app.core.gateway.resolve import Gateway
from app.core.library.index import ModelLibrary
from app.core.util import access
from app.core.util.access import Patterns
from app.errors import InvalidRequest


class RoutingService:
    """Providers and aliases behind one face (providers: None where remote engines are off)."""

    def __init__(
        self, library: ModelLibrary, gateway: Gateway, providers: ProviderPool | None = None
    ) -> None:
        self._library = library
        self._gateway = gateway
        self._providers = providers

    # -- names -----------------------------------------------------------------------------------
    def is_target(self, model_id: str) -> bool:
        """A model id a request may name besides aliases: local, or a provider's PREFIX/id."""
        return self._is_remote(model_id) or self._library.has(model_id)  # one lookup, not two

    def _is_remote(self, model_id: str) -> bool:
        return (
            self._providers is not None
            and self._providers.is_target(model_id)
            and not self._library.has(model_id)
        )

    def is_routable(self, name: str) -> bool:
        """True for a name the gateway answers besides a local model id (an alias, ``auto``,
        a provider's ``PREFIX/id``)."""
        return self._gateway.is_routable(name) or self._is_remote(name)

    def targets(self, name: str, scope: Patterns = None) -> list[str]:
        """The ids a request naming ``name`` would try, in order (ModelNotFound, InvalidRequest
        as a request would get them)."""
        return self._gateway.targets(name, RequestFacts(), scope)

    def provider_of(self, model_id: str) -> str:
        """``local`` for a library model (or an id no provider owns), else its provider's name."""
        entry = self._providers.owner(model_id) if self._providers is not None else None
        if entry is None or self._library.has(model_id):  # a library id wins over a prefix
            return "local"
        return entry.cfg.name

    # -- remote models -----------------------------------------------------------------------------
    def remote_listing(self, model_id: str, scope: Patterns = None) -> RemoteListing | None:
        """The provider's listing of ``model_id`` (None for an id that is not remote).

        Raises:
            ProviderUnavailable (503) / ProviderError (401): its provider is not ready;
            ModelNotFound: the provider lists no such model.
        """
        if (
            self._providers is None
            or not self._is_remote(model_id)
            or not access.in_scope(model_id, scope)
        ):
            return None
        return self._providers.listing(model_id)

    def remote_models(self, scope: Patterns = None) -> list[RemoteListing]:
        """The models of every ready provider (``PREFIX + remote id``) in ``scope``."""
        if self._providers is None:
            return []
        return access.visible(self._providers.listings(), lambda r: r.id, scope)

    # -- providers ---------------------------------------------------------------------------------
    @property
    def has_providers(self) -> bool:
        """Whether remote engines are served here at all."""
        return self._providers is not None

    def provider_statuses(self) -> list[ProviderStatus]:
        """Every provider and its state (asking starts the probes of a new one)."""
        return self._providers.statuses() if self._providers is not None else []

    def provider_states(self) -> list[dict[str, str]]:
        """``[{name, state}]``: what /health says of each provider."""
        return self._providers.states() if self._providers is not None else []

    def provider(self, name: str) -> ProviderConfig | None:
        return self._providers.store.get(name) if self._providers is not None else None

    def add_provider(self, cfg: ProviderConfig, api_key: str | None) -> ProviderConfig:
        """Add or replace a provider (its prefix may not shadow a library id or an alias)."""
        pool = self._pool()
        ids = [m.id for m in self._library.list()]
        aliases = self._gateway.alias_map()
        saved = pool.store.add(cfg, api_key, lambda p: manage.prefix_clash(p, ids, aliases))
        pool.poke(saved.name)  # probe it now, not at the next refresh
        return saved

    async def detect_kind(
        self, cfg: ProviderConfig, api_key: str | None
    ) -> tuple[ProviderConfig, str | None]:
        """``cfg`` with the kind its engine answers as, and why that failed (None: it did not)."""
        return await self._pool().detect(cfg, api_key)

    def remove_provider(self, name: str) -> bool:
        return self._providers is not None and self._providers.store.remove(name)

    async def test_provider(self, name: str) -> manage.ProviderTest:
        e = self._pool().entry(name)
        return await manage.test(e.cfg, e.client)

    def _pool(self) -> ProviderPool:
        if self._providers is None:
            raise InvalidRequest("remote providers are not available here")
        return self._providers

    # -- groups ------------------------------------------------------------------------------------
    @property
    def groups(self) -> GroupRouter | None:
        """The replica groups (None where they are off: no providers, or no groups file)."""
        return self._gateway.groups

    # -- aliases -----------------------------------------------------------------------------------
    def set_alias(self, name: str, targets: Sequence[str]) -> tuple[str, ...]:
        if self._gateway.aliases is None:
            raise InvalidRequest("aliases are not available here")
        return self._gateway.aliases.set(name, targets, self.is_target)

    def remove_alias(self, name: str) -> bool:
        return self._gateway.aliases is not None and self._gateway.aliases.remove(name)

    def aliases(self, scope: Patterns = None) -> dict[str, tuple[str, ...]]:
        """Every alias ``scope`` reaches and its targets (a fallback chain when more than
        one), in file order."""
        return self._gateway.visible_aliases("", scope)

    def alias(self, name: str, scope: Patterns = None) -> tuple[str, ...] | None:
        """One alias's targets, or None; an alias another process just wrote is found."""
        return self._gateway.visible_aliases(name, scope).get(name)

    async def close(self) -> None:
        if self._gateway.groups is not None:
            await self._gateway.groups.close()
        if self._providers is not None:
            await self._providers.close()
