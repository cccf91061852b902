"""How the scheduler decides, as the settings say it: the memory budget, the keep-alive
default, auto-fit's context cap, and where measured footprints are remembered between runs.
Tested by tests/core/engine/test_scheduler_policy.py and tests/core/engine/test_autofit.py."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from app.core.engine.autofit import DEFAULT_MAX_AUTO_CONTEXT
from app.core.library import fit
from app.core.util.fsutil import atomic_write_json

log = logging.getLogger(__name__)


def _forever() -> float | None:
    return None


def _default_cap() -> int:
    return DEFAULT_MAX_AUTO_CONTEXT


@dataclass(frozen=True)
class SchedulerPolicy:
    """The scheduler's knobs, read when they apply (the settings file may change meanwhile).

    Attributes:
        budget_bytes: the memory models may use (None: the machine's default budget).
        default_ttl: seconds an idle model stays loaded when nothing else says (None: forever).
        auto_context_cap: the largest context auto-fit picks.
        sweep_interval: how often idle models are checked against their TTL.
        clock: monotonic seconds (a seam: tests move time).
        calibration_file: measured footprints, read at start and written when one grows.
    """

    budget_bytes: Callable[[], int] | None = None
    default_ttl: Callable[[], float | None] = _forever
    auto_context_cap: Callable[[], int] = _default_cap
    sweep_interval: float = 0.5
    clock: Callable[[], float] = time.monotonic
    calibration_file: Path | None = None

    def read_calibration(self) -> dict[str, int]:
        return fit.read_calibration(self.calibration_file) if self.calibration_file else {}

    def save_calibration(self, values: dict[str, int]) -> None:
        if self.calibration_file is None or not values:
            return
        try:
            atomic_write_json(self.calibration_file, values)
        except OSError:
            log.exception("could not save memory calibration")
