"""The providers in use: a client per provider in the providers file, its state from probing
(at start, then every ``REFRESH_S`` while ready, with backoff while not), and the remote models
it lists. Lives on the service loop; the file is re-read (one stat, at most every second) on
each use, so ``hearth providers add``/``rm`` take effect at once in a running server.

Each provider's health as groups route by it (circuits, cool-downs, the "unreachable" mark a
failed request leaves) is kept on ``circuits``, over the board given (shared by several
gateways, or in process), and the requests in flight on each target on ``in_flight``.
Tested by tests/core/gateway/providers/test_pool.py and tests/core/gateway/groups/test_router.py."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from app.core.gateway.groups.health import Circuits, HealthBoard, InFlight
from app.core.gateway.providers import manage
from app.core.gateway.providers.base import Probe, RemoteClient, RemoteModel
from app.core.gateway.providers.store import ProviderConfig, ProviderStore
from app.errors import (
    HearthError,
    ModelNotFound,
    ProviderError,
    ProviderTimeout,
    ProviderUnavailable,
)

log = logging.getLogger(__name__)

REFRESH_S = 30.0  # a ready provider's model list is re-read this often
BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0)  # between probes of one that is not ready
FIRST_PROBE_WAIT_S = 15.0  # a request to a provider never probed yet waits this long for it

MakeClient = Callable[[ProviderConfig, str | None], RemoteClient]


@dataclass(frozen=True, slots=True)
class ProviderStatus:
    """One provider as ``providers ls --json`` and the GUI show it."""

    name: str
    url: str
    kind: str
    prefix: str
    state: str
    models: tuple[str, ...]
    latency_ms: float | None
    error: str | None

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "url": self.url,
            "kind": self.kind,
            "prefix": self.prefix,
            "state": self.state,
            "models": list(self.models),
            "latency_ms": self.latency_ms,
            "error": self.error,
        }


@dataclass(frozen=True, slots=True)
class RemoteListing:
    """A remote model in a model list: ``PREFIX + remote id``, the provider owning it."""

    id: str
    provider: str
    model: RemoteModel


@dataclass(slots=True)
class _Entry:
    cfg: ProviderConfig
    key: str | None = field(repr=False)  # never in a log line or a traceback's locals
    client: RemoteClient = field(repr=False)
    probe: Probe | None = None  # the last probe's result (None: never probed yet)
    failures: int = 0
    probed: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def state(self) -> str:
        return self.probe.state if self.probe is not None else "starting"

    def status(self) -> ProviderStatus:
        p = self.probe
        ready = p is not None and p.state == "ready"
        return ProviderStatus(
            self.cfg.name,
            self.cfg.url,
            self.cfg.kind,
            self.cfg.prefix,
            self.state,
            tuple(self.cfg.prefix + m.id for m in p.models) if ready and p else (),
            p.latency_ms if p else None,
            p.error if p else None,
        )


class ProviderPool:
    """Every provider's client and state (see the module doc)."""

    def __init__(
        self,
        store: ProviderStore,
        make_client: MakeClient,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[], None] | None = None,
        board: HealthBoard | None = None,
    ) -> None:
        self.store = store
        self.circuits = Circuits(board)
        self.in_flight = InFlight()
        self._make = make_client
        self._clock = clock
        self._on_change = on_change  # a provider's state or models changed (the GUI re-lists)
        self._entries: dict[str, _Entry] = {}
        self._retiring: set[asyncio.Task[None]] = set()
        self._signature: Any = None
        self._closed = False

    # -- the file -> entries --------------------------------------------------------------------
    def _sync(self) -> dict[str, _Entry]:
        """The entries, the files re-read when they changed. Only on the service loop (where
        clients live and probe); elsewhere the entries as they are."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return self._entries
        sig = self.store.signature()
        if sig == self._signature or self._closed:
            return self._entries
        self._signature = sig
        configs = self.store.all()
        for name in list(self._entries):
            e = self._entries[name]
            cfg = configs.get(name)
            if cfg != e.cfg or self.store.key(name) != e.key:
                self._drop(name)
        for name, cfg in configs.items():
            if name not in self._entries:
                key = self.store.key(name)
                self._entries[name] = _Entry(cfg, key, self._make(cfg, key))
                log.info("provider %s (%s) at %s", name, cfg.kind, cfg.url)
        self._start_probing()
        if self._on_change is not None:
            self._on_change()
        return self._entries

    def _drop(self, name: str) -> None:
        """Forget a provider changed or removed; its client closes once the streams still
        running on it end (they finish what they were answering)."""
        e = self._entries.pop(name)
        if e.task is not None:
            e.task.cancel()
        task = asyncio.ensure_future(e.client.close_when_idle())
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    def _start_probing(self) -> None:
        for e in self._entries.values():
            if e.task is None or e.task.done():
                e.task = asyncio.ensure_future(self._probe_forever(e))

    async def _probe_forever(self, e: _Entry) -> None:
        while not self._closed:
            p = await e.client.probe()
            changed = e.probe is None or p.state != e.state
            listed = e.probe is not None and e.probe.models == p.models
            e.probe = p
            if (changed or not listed) and self._on_change is not None:
                self._on_change()
            e.probed.set()
            if p.state == "ready":
                self.circuits.reachable(e.cfg.name)
                e.failures = 0
                wait = REFRESH_S
            else:
                wait = BACKOFF_S[min(e.failures, len(BACKOFF_S) - 1)]
                e.failures += 1
            if changed:
                log.info(
                    "provider %s: %s%s", e.cfg.name, p.state, f" ({p.error})" if p.error else ""
                )
            e.wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(e.wake.wait(), wait)

    # -- reading ------------------------------------------------------------------------------
    def statuses(self) -> list[ProviderStatus]:
        return [e.status() for e in self._sync().values()]

    def states(self) -> list[dict[str, str]]:
        """``/health``'s ``providers``: each one's name and state."""
        return [{"name": e.cfg.name, "state": e.state} for e in self._sync().values()]

    def listings(self) -> list[RemoteListing]:
        """The remote models of every ready provider (a provider that is down lists none)."""
        out: list[RemoteListing] = []
        for e in self._sync().values():
            if e.probe is not None and e.probe.state == "ready":
                out += [RemoteListing(e.cfg.prefix + m.id, e.cfg.name, m) for m in e.probe.models]
        return out

    def owner(self, model_id: str) -> _Entry | None:
        """The provider whose prefix ``model_id`` starts with (the id after it not empty)."""
        for e in self._sync().values():
            if model_id.startswith(e.cfg.prefix) and len(model_id) > len(e.cfg.prefix):
                return e
        return None

    def find(self, name: str) -> _Entry | None:
        """The provider ``name``, or None."""
        return self._sync().get(name)

    def entry(self, name: str) -> _Entry:
        """The provider ``name`` (ModelNotFound when there is none)."""
        e = self._sync().get(name)
        if e is None:
            raise ModelNotFound(f"no provider '{name}'", param="name")
        return e

    async def detect(
        self, cfg: ProviderConfig, key: str | None
    ) -> tuple[ProviderConfig, str | None]:
        """``cfg`` with the kind its engine's answers say, or why that failed (a client of its
        own, closed after: the provider may not be added yet)."""
        client = self._make(cfg, key)
        try:
            return await manage.detect(cfg, client)
        finally:
            await client.close()

    def is_target(self, model_id: str) -> bool:
        return self.owner(model_id) is not None

    def prefixes(self) -> dict[str, str]:
        """Every provider's prefix -> its name."""
        return {e.cfg.prefix: e.cfg.name for e in self._sync().values()}

    # -- serving ------------------------------------------------------------------------------
    async def client_for(self, model_id: str) -> tuple[RemoteClient, str, RemoteModel | None]:
        """The client serving ``model_id`` (``PREFIX/remote``), the remote id, and what the
        engine's list says of that model.

        Raises:
            ModelNotFound: no provider has the prefix, or its engine lists no such model.
            ProviderUnavailable: the provider is not ready (its state and reason said).
        """
        e = self.owner(model_id)
        if e is None:
            raise ModelNotFound(f"no provider serves '{model_id}'", param="model")
        remote_id = model_id[len(e.cfg.prefix) :]
        if e.probe is None:  # just added: its first probe is under way
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(e.probed.wait(), FIRST_PROBE_WAIT_S)
        p = self._check_ready(e)
        found = next((m for m in p.models if m.id == remote_id), None)
        if found is None and p.models:
            raise ModelNotFound(
                f"provider '{e.cfg.name}' serves no model '{remote_id}'", param="model"
            )
        return e.client, remote_id, found

    def failed(self, model_id: str, *, mark: bool = True) -> None:
        """A request found the provider unreachable: probe it now (and mark it meanwhile,
        on its circuit too unless ``mark`` is off), so later requests fail fast and its models
        leave the lists until it answers again."""
        e = self.owner(model_id)
        if e is None:
            return
        if mark:
            self.circuits.unreachable(e.cfg.name, "a request could not reach it")
        if e.probe is not None and e.probe.state == "ready":
            e.probe = Probe("unreachable", error="a request could not reach it; probing")
            if self._on_change is not None:
                self._on_change()
        e.wake.set()

    def record(self, model_id: str, err: HearthError | None) -> None:
        """What one upstream call found, before its first byte, for the provider's circuit:
        a start closes it; a connection error marks it unreachable; a timeout or a 5xx counts
        a failure; a 429 or 503 with ``Retry-After`` cools it down that long (no count)."""
        e = self.owner(model_id)
        if e is None:
            return
        name = e.cfg.name
        if err is None:
            self.circuits.success(name)
        elif isinstance(err, ProviderTimeout):
            self.circuits.failure(name, err.message)
            self.failed(model_id, mark=False)
        elif isinstance(err, ProviderUnavailable):
            self.failed(model_id)
        elif isinstance(err, ProviderError):
            status, wait = err.upstream_status, err.upstream_retry_after
            if status in (429, 503) and wait is not None:
                self.circuits.cool(name, wait, err.message)
            elif status >= 500 or status == 0:
                self.circuits.failure(name, err.message)

    def poke(self, name: str) -> None:
        """Probe ``name`` now (after a change, or when asked)."""
        e = self._sync().get(name)
        if e is not None:
            e.wake.set()

    def listing(self, model_id: str) -> RemoteListing:
        """What the provider's list says of ``model_id``, now (no waiting).

        Raises:
            ModelNotFound: no provider has the prefix, or its list lacks the id.
            ProviderUnavailable / ProviderError (401): the provider is not ready.
        """
        e = self.owner(model_id)
        if e is None:
            raise ModelNotFound(f"no provider serves '{model_id}'", param="model")
        p = self._check_ready(e)
        remote_id = model_id[len(e.cfg.prefix) :]
        for m in p.models:
            if m.id == remote_id:
                return RemoteListing(model_id, e.cfg.name, m)
        raise ModelNotFound(f"provider '{e.cfg.name}' serves no model '{remote_id}'", param="model")

    def _check_ready(self, e: _Entry) -> Probe:
        """The provider's last probe, when it is ready (else the error its state means)."""
        p = e.probe
        if p is not None and p.state == "unauthorized":  # the key is wrong: no fallback fixes it
            raise ProviderError(
                f"provider '{e.cfg.name}' refused its API key: {p.error or 'unauthorized'}",
                provider=e.cfg.name,
                status=401,
            )
        if p is None or p.state != "ready":
            why = f": {p.error}" if p is not None and p.error else ""
            raise ProviderUnavailable(
                f"provider '{e.cfg.name}' is {e.state}{why}", provider=e.cfg.name
            )
        return p

    async def close(self) -> None:
        self._closed = True
        for name in list(self._entries):
            e = self._entries.pop(name)
            if e.task is not None:
                e.task.cancel()
            await e.client.close()
        for t in list(self._retiring):
            t.cancel()
