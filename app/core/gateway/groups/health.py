"""Each provider's health as the groups route by it: a circuit (closed, open for a cool-down
after failures in a row, then half-open: one request let through, whose outcome closes or
re-opens it), a cool-down an engine asked for (429/503 with ``Retry-After``), and the
"unreachable" mark a request that could not reach it leaves.

The records live on a :class:`HealthBoard`: :class:`LocalBoard` in process; a shared one
(app/redis_state/health.py) keeps them where every gateway reads them, so one gateway's
discovery that an engine is down spares the others the timeout. Times are epoch seconds, so
gateways on several hosts read one another's records.
Tested by tests/core/gateway/groups/test_health.py."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

READY, OPEN, HALF_OPEN, COOLING, UNREACHABLE = (
    "ready",
    "open",
    "half-open",
    "cooling",
    "unreachable",
)
DEFAULT_COOLDOWN_S = 15.0
# two failures in a row open a circuit: one stray timeout or 5xx (a restart's first request)
# does not eject a replica, while a dead one is out after its second failed request
DEFAULT_FAILURES_TO_OPEN = 2
RECENT_ERRORS_S = 60.0  # how long a failure counts among a member's "recent errors"


@dataclass(frozen=True, slots=True)
class Health:
    """One provider's record: ``state`` (open, cooling, unreachable; ready when absent), until
    when (epoch seconds), why, and the failures in a row that led there."""

    state: str
    until: float = 0.0
    error: str = ""
    failures: int = 0


class HealthBoard(Protocol):
    """Where the records are kept (in process, or shared by several gateways)."""

    def get(self, provider: str) -> Health | None: ...

    def put(self, provider: str, health: Health | None) -> None:
        """Keep ``health`` (None: the provider is ready again, its record dropped)."""
        ...


class LocalBoard:
    """The records in this process only."""

    def __init__(self) -> None:
        self._records: dict[str, Health] = {}

    def get(self, provider: str) -> Health | None:
        return self._records.get(provider)

    def put(self, provider: str, health: Health | None) -> None:
        if health is None:
            self._records.pop(provider, None)
        else:
            self._records[provider] = health


Settings = Callable[[str], tuple[int, float]]  # provider -> (failures to open, cool-down s)


class Circuits:
    """The circuit logic over a board (see the module doc). ``settings(provider)`` gives the
    failures that open its circuit and how long it stays open (its group's settings)."""

    def __init__(
        self,
        board: HealthBoard | None = None,
        settings: Settings | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.board: HealthBoard = board if board is not None else LocalBoard()
        self.settings: Settings = settings or (
            lambda _p: (DEFAULT_FAILURES_TO_OPEN, DEFAULT_COOLDOWN_S)
        )
        self._clock = clock
        self._failures: dict[str, int] = {}  # in a row, this gateway's count
        self._recent: dict[str, list[float]] = {}  # when each recent failure happened
        self._trial: dict[str, float] = {}  # a half-open provider's one request, let through at

    def state(self, provider: str) -> str:
        """ready | open | half-open | cooling | unreachable, now."""
        h = self.board.get(provider)
        if h is None:
            return READY
        if self._clock() < h.until:
            return h.state
        return READY if h.state == COOLING else HALF_OPEN

    def detail(self, provider: str) -> Health | None:
        return self.board.get(provider)

    def admits(self, provider: str) -> bool:
        """Whether a request may go to ``provider`` now: ready; or half-open and its one trial
        request not yet out (that request is then counted as out)."""
        state = self.state(provider)
        if state == READY:
            return True
        if state != HALF_OPEN:
            return False
        h = self.board.get(provider)
        started = self._trial.get(provider)
        if started is not None and h is not None and started >= h.until:
            return False  # this cool-down's trial is already out
        self._trial[provider] = self._clock()
        return True

    def available(self, provider: str) -> bool:
        """Like :meth:`admits` without taking the half-open trial (for ordering)."""
        state = self.state(provider)
        if state == READY:
            return True
        if state != HALF_OPEN:
            return False
        h = self.board.get(provider)
        started = self._trial.get(provider)
        return started is None or h is None or started < h.until

    def failure(self, provider: str, error: str) -> None:
        """A connection error, a timeout or a 5xx before the first byte (or a failed check)."""
        now = self._clock()
        recent = [t for t in self._recent.get(provider, []) if now - t < RECENT_ERRORS_S]
        self._recent[provider] = [*recent[-99:], now]
        n = self._failures.get(provider, 0) + 1
        self._failures[provider] = n
        to_open, cooldown = self.settings(provider)
        if self.state(provider) == HALF_OPEN or n >= to_open:
            self.board.put(provider, Health(OPEN, now + cooldown, error[:300], n))
            self._trial.pop(provider, None)

    def success(self, provider: str) -> None:
        """A request started (or a check answered): its circuit closes."""
        self._failures.pop(provider, None)
        self._trial.pop(provider, None)
        h = self.board.get(provider)
        if h is not None and (h.state != COOLING or self._clock() >= h.until):
            self.board.put(provider, None)

    def cool(self, provider: str, seconds: float, error: str) -> None:
        """The engine asked for a pause (``Retry-After``): no circuit count."""
        until = self._clock() + max(0.0, min(seconds, 3_600.0))
        self.board.put(provider, Health(COOLING, until, error[:300], 0))

    def unreachable(self, provider: str, error: str) -> None:
        """A request could not reach the engine: marked for a cool-down (its probe clears it)."""
        _, cooldown = self.settings(provider)
        now = self._clock()
        self._recent[provider] = [*self._recent.get(provider, [])[-99:], now]
        self.board.put(provider, Health(UNREACHABLE, now + cooldown, error[:300], 1))

    def reachable(self, provider: str) -> None:
        """A probe answered: an unreachable mark goes (a circuit keeps its own course)."""
        h = self.board.get(provider)
        if h is not None and h.state == UNREACHABLE:
            self.board.put(provider, None)

    def recent_errors(self, provider: str) -> int:
        now = self._clock()
        return sum(1 for t in self._recent.get(provider, []) if now - t < RECENT_ERRORS_S)


class InFlight:
    """Requests this gateway has in flight on each target (the least-busy count)."""

    def __init__(self) -> None:
        self._n: dict[str, int] = {}

    def get(self, target: str) -> int:
        return self._n.get(target, 0)

    def add(self, target: str) -> None:
        self._n[target] = self._n.get(target, 0) + 1

    def done(self, target: str) -> None:
        n = self._n.get(target, 0) - 1
        if n > 0:
            self._n[target] = n
        else:
            self._n.pop(target, None)
