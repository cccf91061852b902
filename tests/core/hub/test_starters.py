"""Starter models: the curated repos looked up on a (fake) Hub, each with its file's
size and a fit verdict against this machine's budget; offline is one clear error."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from app.core.hub import HubClient
from app.core.hub.starters import MAX_SUGGESTIONS, STARTERS, budget_memory, suggest
from app.core.library.fit import DeviceMemory
from app.errors import HubUnavailable
from tests.support.fakehub import FakeHub, add_starters

BIG_MACHINE = DeviceMemory(ram_total=64 << 30, ram_available=32 << 30)
MIB = 1 << 20


def client(endpoint: str) -> HubClient:
    return HubClient(endpoint=endpoint, memory_probe=lambda: BIG_MACHINE)


async def test_suggestions_carry_the_starter_file_its_size_and_a_verdict(
    fake_hub: FakeHub, tmp_path: Path
) -> None:
    files = add_starters(fake_hub, tmp_path)
    shown, too_large = await suggest(client(fake_hub.endpoint), 0)
    assert too_large == 0
    assert [s.info.id for s in shown] == [s.repo_id for s in STARTERS[:MAX_SUGGESTIONS]]
    for s in shown:
        assert s.option.quantization == "Q4_K_M"
        assert s.option.first_file.path == files[s.info.id]
        served = fake_hub.repos[s.info.id].files[files[s.info.id]].data
        assert s.option.size_bytes == len(served)
        assert s.option.fit == "fits-ram" and s.fits
        assert s.option.estimate is not None and s.option.estimate.total > len(served)


async def test_the_budget_decides_what_fits(fake_hub: FakeHub, tmp_path: Path) -> None:
    big = STARTERS[0].repo_id
    add_starters(fake_hub, tmp_path, large=(big,))
    hub = client(fake_hub.endpoint)
    shown, _ = await suggest(hub, 0)
    small_total = shown[1].option.estimate.total  # type: ignore[union-attr]
    big_total = shown[0].option.estimate.total  # type: ignore[union-attr]
    assert big_total > small_total + 10 * MIB
    budget = (small_total + big_total) // 2  # plenty of free RAM, but a budget in between
    shown, too_large = await suggest(hub, budget)
    assert too_large == 1
    assert big not in [s.info.id for s in shown]
    assert len(shown) == MAX_SUGGESTIONS and all(s.fits for s in shown)


def test_budget_memory_caps_ram_and_gpus() -> None:
    m = DeviceMemory(ram_total=100, ram_available=80, gpus=(("gpu0", 50),))
    assert budget_memory(m, 30) == DeviceMemory(100, 30, (("gpu0", 30),))
    assert budget_memory(m, 0) == m  # 0: no budget known


async def test_a_gone_repo_is_skipped(fake_hub: FakeHub, tmp_path: Path) -> None:
    add_starters(fake_hub, tmp_path)
    del fake_hub.repos[STARTERS[1].repo_id]
    shown, _ = await suggest(client(fake_hub.endpoint), 0)
    ids = [s.info.id for s in shown]
    assert STARTERS[1].repo_id not in ids and len(ids) == MAX_SUGGESTIONS


async def test_offline_is_one_hub_unavailable_error_and_quick() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    with pytest.raises(HubUnavailable):
        await suggest(client(f"http://127.0.0.1:{port}"), 0)
    assert time.monotonic() - t0 < 30  # refused connections: no long retry loop
