"""The soak's short version (SECURITY.md 24): 45 s of mixed streams, cancels, embeddings,
tokenize, load/unload/reload and model swaps across all four protocols on a real `hearth
serve`. The server never dies, every request answers or is ended by an unload racing it, and
with every model unloaded again it holds no more memory, file descriptors or threads than at
the start. tests/bench/soak.py runs the same for hours."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.soak import run_soak

pytestmark = pytest.mark.model

# 45 s keeps the suite (and CI) under its time limit; tests/bench/soak.py runs for hours
SECONDS = float(os.environ.get("HEARTH_SOAK_SECONDS", "45"))


def test_mixed_traffic_and_model_churn_leave_no_leak(
    tmp_path: Path, smollm2_path: Path, embedding_gguf: Path
) -> None:
    report = run_soak(tmp_path, smollm2_path, embedding_gguf, seconds=SECONDS, clients=3)
    assert not report.died, report.failures[-1:]
    assert not report.failures, report.failures[:5]
    assert report.requests >= 100, report.by_action
    for action in ("chat_stream", "chat_cancel", "embed", "tokenize", "anthropic", "ollama"):
        assert report.by_action.get(action, 0) > 0, report.by_action
    assert report.by_action.get("unload", 0) + report.by_action.get("reload", 0) > 0
    growth = report.growth()
    # nothing loaded at both ends: what is left over is a leak (allocator slack aside)
    assert growth["rss_mib"] < 96, (growth, report.baseline, report.final)
    assert growth["fds"] <= 8, (growth, report.baseline, report.final)
    assert growth["threads"] <= 4, (growth, report.baseline, report.final)
