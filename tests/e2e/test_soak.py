"""The soak's short version (SECURITY.md 24): a fixed seeded workload of mixed streams,
cancels, embeddings, tokenize, chats through a provider and an alias, load/unload/reload and
model swaps across all four protocols on a real `hearth serve`. The server never dies, every
request answers or is ended by an unload racing it, and with every model unloaded again it
holds no more memory, file descriptors or threads than at the start. tests/bench/soak.py runs
the same for hours.

The workload is a count of actions, not a time: a slow or busy machine runs the same requests,
only for longer (the deadline is a liveness bound)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.soak import run_soak

pytestmark = pytest.mark.model

# ~1 minute on a quiet 2-core machine; tests/bench/soak.py runs for hours
ACTIONS = int(os.environ.get("HEARTH_SOAK_ACTIONS", "30"))  # per client


@pytest.mark.timeout(1200)  # a liveness bound: a busy machine runs the same workload slower
def test_mixed_traffic_and_model_churn_leave_no_leak(
    tmp_path: Path, smollm2_path: Path, embedding_gguf: Path
) -> None:
    report = run_soak(
        tmp_path, smollm2_path, embedding_gguf, actions=ACTIONS, deadline=900, clients=3
    )
    assert not report.died, report.failures[-1:]
    assert not report.failures, report.failures[:5]
    assert not report.unfinished, report.by_action
    # the seeded mix: every kind of action ran (the counts do not depend on the machine)
    for action in ("chat_stream", "chat_cancel", "embed", "tokenize", "anthropic", "ollama",
                   "provider", "alias"):  # fmt: skip
        assert report.by_action.get(action, 0) > 0, report.by_action
    assert report.by_action.get("unload", 0) + report.by_action.get("reload", 0) > 0
    growth = report.growth()
    # nothing loaded at both ends: what is left over is a leak (allocator slack aside)
    assert growth["rss_mib"] < 96, (growth, report.baseline, report.final)
    assert growth["fds"] <= 8, (growth, report.baseline, report.final)
    assert growth["threads"] <= 4, (growth, report.baseline, report.final)
