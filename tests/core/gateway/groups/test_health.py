"""The circuit over a board: opens after the failures in a row its group allows, lets one
request through once its cool-down passes (half-open), closes on success, re-opens on failure;
a Retry-After cool-down counts no failure; an unreachable mark goes when a probe answers."""

from __future__ import annotations

from app.core.gateway.groups.health import Circuits, InFlight, LocalBoard


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def make(to_open: int = 2, cooldown: float = 15.0) -> tuple[Circuits, Clock]:
    clock = Clock()
    return Circuits(LocalBoard(), lambda _p: (to_open, cooldown), clock), clock


def test_failures_in_a_row_open_the_circuit_for_the_cooldown() -> None:
    c, clock = make(to_open=2)
    c.failure("gpu1", "502")
    assert c.state("gpu1") == "ready" and c.admits("gpu1")  # one failure is not enough
    c.failure("gpu1", "timeout")
    assert c.state("gpu1") == "open" and not c.admits("gpu1")
    assert c.detail("gpu1") is not None and c.detail("gpu1").error == "timeout"  # type: ignore[union-attr]
    clock.now += 14.9
    assert c.state("gpu1") == "open"


def test_half_open_lets_exactly_one_request_through_and_its_success_closes() -> None:
    c, clock = make(to_open=1)
    c.failure("gpu1", "502")
    clock.now += 15.0
    assert c.state("gpu1") == "half-open"
    assert c.available("gpu1")
    assert c.admits("gpu1")  # the trial
    assert not c.admits("gpu1") and not c.available("gpu1")  # no second one meanwhile
    c.success("gpu1")
    assert c.state("gpu1") == "ready" and c.admits("gpu1") and c.admits("gpu1")


def test_a_failed_trial_reopens_the_circuit() -> None:
    c, clock = make(to_open=3)
    for _ in range(3):
        c.failure("gpu1", "502")
    clock.now += 15.0
    assert c.admits("gpu1")
    c.failure("gpu1", "still 502")  # one failure while half-open is enough
    assert c.state("gpu1") == "open"
    clock.now += 15.0
    assert c.admits("gpu1")  # the next cool-down's trial


def test_a_success_resets_the_failures_in_a_row() -> None:
    c, _ = make(to_open=2)
    c.failure("gpu1", "502")
    c.success("gpu1")
    c.failure("gpu1", "502")
    assert c.state("gpu1") == "ready"
    assert c.recent_errors("gpu1") == 2  # still counted among recent errors (least-busy ties)


def test_retry_after_cools_down_without_counting_a_failure() -> None:
    c, clock = make(to_open=1)
    c.cool("gpu1", 3.0, "429")
    assert c.state("gpu1") == "cooling" and not c.admits("gpu1")
    c.success("gpu1")  # a request that started elsewhere meanwhile does not end the pause
    assert c.state("gpu1") == "cooling"
    clock.now += 3.0
    assert c.state("gpu1") == "ready" and c.admits("gpu1")  # straight back, no trial
    assert c.recent_errors("gpu1") == 0


def test_an_unreachable_mark_goes_when_a_probe_answers() -> None:
    c, _ = make()
    c.unreachable("gpu1", "connection refused")
    assert c.state("gpu1") == "unreachable" and not c.available("gpu1")
    c.reachable("gpu1")
    assert c.state("gpu1") == "ready"
    c.failure("gpu1", "502")
    c.failure("gpu1", "502")
    c.reachable("gpu1")  # a probe answering does not close a circuit opened by 5xx answers
    assert c.state("gpu1") == "open"


def test_in_flight_counts_up_and_down() -> None:
    f = InFlight()
    f.add("a/m")
    f.add("a/m")
    f.done("a/m")
    assert f.get("a/m") == 1 and f.get("b/m") == 0
    f.done("a/m")
    f.done("a/m")  # never below zero
    assert f.get("a/m") == 0
