"""The Hub out of reach: said in seconds and in words (never a raw errno), and the last
featured listing kept for when it cannot be reached."""

from __future__ import annotations

import socket
import time
from dataclasses import replace
from pathlib import Path

import pytest

from app.core.hub import HubClient, ListingCache
from app.core.hub.reach import network_reason
from app.core.library.fit import DeviceMemory
from app.errors import HubOffline, HubUnavailable
from tests.support.fakehub import FakeHub, gguf_bytes

MACHINE = DeviceMemory(64 << 30, 48 << 30)
DEADLINE_S = 15.0  # generous: huggingface_hub's own retries alone took ~23 s here


def closed_port() -> int:
    with socket.socket() as s:  # bound, never listening, then closed: nothing accepts there
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


OFFLINE = [
    ("closed loopback port", lambda: f"http://127.0.0.1:{closed_port()}", "Can't reach the Hub"),
    ("unresolvable host", lambda: "http://hearth-offline.invalid", "You're offline"),
]


@pytest.mark.parametrize(("case", "endpoint", "said"), OFFLINE, ids=[c[0] for c in OFFLINE])
async def test_search_and_repo_say_offline_quickly_and_in_words(
    case: str, endpoint: object, said: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", endpoint())  # type: ignore[operator]
    hub = HubClient(memory_probe=lambda: MACHINE)  # the endpoint as the app finds it
    for call in (lambda: hub.search("tiny"), lambda: hub.repo("acme/tiny-GGUF")):
        t0 = time.monotonic()
        with pytest.raises(HubOffline) as info:
            await call()
        assert time.monotonic() - t0 < DEADLINE_S
        assert said in info.value.message and "Errno" not in info.value.message
        assert isinstance(info.value, HubUnavailable)  # the same 502 hub_unavailable on the wire


async def test_featured_listing_is_kept_and_shown_when_the_hub_is_unreachable(
    fake_hub: FakeHub, tmp_path: Path
) -> None:
    fake_hub.add_repo(
        "acme/tiny-GGUF",
        {"tiny-Q4_K_M.gguf": gguf_bytes(tmp_path / "b")},
        tags=["gguf", "license:mit"],
        downloads=99,
        likes=3,
    )
    cache = tmp_path / "cache" / "hub-listings.json"
    online = HubClient(
        endpoint=fake_hub.endpoint, memory_probe=lambda: MACHINE, listing_cache=cache
    )
    live = await online.featured()
    assert [r.id for r in live.results] == ["acme/tiny-GGUF"] and live.cached_at is None
    assert cache.is_file()
    size = await online.repo_size_range("acme/tiny-GGUF")  # read after the listing: kept too
    assert size is not None

    offline = HubClient(
        endpoint=f"http://127.0.0.1:{closed_port()}",
        memory_probe=lambda: MACHINE,
        listing_cache=cache,
    )
    kept = await offline.featured()
    assert kept.cached_at is not None and kept.unreachable is not None
    assert "Can't reach the Hub" in kept.unreachable
    (summary,) = kept.results
    assert (summary.id, summary.downloads, summary.license, summary.format) == (
        "acme/tiny-GGUF",
        99,
        "mit",
        "gguf",
    )
    assert summary == replace(live.results[0], size_range=size)  # every field survives the file
    with pytest.raises(HubOffline):  # another sort was never listed: nothing to show
        await offline.featured(sort="likes")
    # a second process reads the same file
    assert ListingCache(cache).load("gguf:downloads:30") is not None


def test_network_reasons_are_words() -> None:
    assert network_reason(socket.gaierror(-2, "Name or service not known")) == (
        "its name does not resolve"
    )
    assert network_reason(ConnectionRefusedError(111, "refused")) == (
        "nothing accepts connections there"
    )
    wrapped = RuntimeError("wrapped")
    wrapped.__cause__ = TimeoutError()
    assert network_reason(wrapped) == "it did not answer in time"
