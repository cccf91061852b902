"""GUI fixtures: a real Hearth (library, llama.cpp and MLX runtimes, presets, a memory budget and
keep-alive read from the settings file, aliases, remote providers, server controller) under
tmp_path, driven through the real main window on Qt's offscreen platform."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before any Qt import

from collections.abc import Iterator
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from app.compose import group_store, provider_pool
from app.core.engine.presets import PresetStore
from app.core.events import EventHub, ProvidersChanged
from app.core.gateway import AliasStore
from app.core.hub import HubClient
from app.core.hub.downloads import DownloadManager
from app.core.hub.downloads.manager import DownloadPolicy
from app.core.library.fit import DeviceMemory, default_budget
from app.core.library.index import ModelLibrary
from app.core.service import assemble
from app.core.types import LoadOptions, Runtime
from app.core.util.loop import LoopThread
from app.gui.bridge import Bridge
from app.gui.context import GuiContext
from app.gui.main_window import MainWindow
from app.paths import AppPaths
from app.runtimes.llama.runtime import LlamaCppRuntime
from app.runtimes.mlx.runtime import MlxRuntime
from app.runtimes.speech.runtime import SpeechRuntime
from app.server.runner import ServerController
from app.settings import SettingsStore, TokenStore
from tests.support import probes
from tests.support.fakehub import FakeHub, gguf_bytes, mlx_files


@pytest.fixture(scope="session")
def probe_file() -> Path:
    # llama.cpp's one-time capability probe is per machine; share it across tests
    return probes.shared()


@pytest.fixture
def gui_runtimes(probe_file: Path) -> dict[str, Runtime]:
    """The runtimes the test's Hearth has (override it for a machine without MLX)."""
    return {
        "gguf": LlamaCppRuntime(probe_file=probe_file),
        "mlx": MlxRuntime(),
        "whisper": SpeechRuntime(),
    }


@pytest.fixture
def gui_ctx(hearth_home: Path, gui_runtimes: dict[str, Runtime]) -> Iterator[GuiContext]:
    paths = AppPaths.default().ensure()
    assert paths.data.is_relative_to(hearth_home)
    store = SettingsStore(paths.settings_file)
    library = ModelLibrary(paths.library_file, paths.models)

    def jit_ttl() -> float | None:
        d = store.load().load
        return None if d.jit_keep_forever else float(d.jit_ttl_s)

    # wired like app.compose.build_service, so the Settings page's budget and TTL take effect
    events = EventHub()
    service = assemble(
        library,
        gui_runtimes,
        events=events,
        load_defaults=lambda: LoadOptions(context_length=2048),
        presets=PresetStore(paths.config / "presets.json"),
        budget_bytes=lambda: store.load().load.memory_budget_bytes or default_budget(),
        default_ttl=jit_ttl,
        aliases=AliasStore(paths.aliases_file),
        providers=provider_pool(paths, lambda: events.publish(ProvidersChanged())),
        groups=group_store(paths),
    )
    loop = LoopThread("test-service").start()
    server = ServerController(service, store, paths)
    ctx = GuiContext(service=service, loop=loop, settings_store=store, paths=paths, server=server)
    try:
        yield ctx
    finally:
        try:
            loop.call(server.stop("test"), timeout=30)
            loop.call(service.close(), timeout=60)
        finally:
            loop.stop()


@pytest.fixture
def bridge(qtbot: QtBot, gui_ctx: GuiContext) -> Iterator[Bridge]:
    b = Bridge(gui_ctx.loop, gui_ctx.service.events)
    yield b
    b.close()


def _wait_for_runtime_report(w: MainWindow, qtbot: QtBot) -> None:
    """The Settings page's Runtime report, when a test showed it, is done (it imports mlx)."""
    box = w.settings_page.runtime_box
    if box is not None:
        qtbot.waitUntil(lambda: not box.checking, timeout=60_000)


@pytest.fixture
def window(qtbot: QtBot, gui_ctx: GuiContext, bridge: Bridge) -> Iterator[MainWindow]:
    w = MainWindow(gui_ctx, bridge)
    qtbot.addWidget(w)
    w.show()
    qtbot.waitExposed(w)
    # the pages fill themselves from the loop thread; wait until they have
    qtbot.waitUntil(lambda: w.settings_page.settings is not None, timeout=10_000)
    # and until the threads that import mlx (Discover's format check at start, the Runtime
    # report once Settings is shown) are done: one still importing when the test's loop closes
    # can crash the process
    qtbot.waitUntil(
        lambda: w.discover_page.formats_known or w.discover_page.manager is None, timeout=60_000
    )
    yield w
    _wait_for_runtime_report(w, qtbot)


@pytest.fixture
def imported(window: MainWindow, qtbot: QtBot, smollm2_path: Path) -> str:
    """SmolLM2 imported through the Library page; returns its id."""
    window.library_page.import_files([str(smollm2_path)])
    qtbot.waitUntil(lambda: window.library_page.table_model.rowCount() == 1, timeout=10_000)
    return window.library_page.table_model.ids()[0]


# -- the Hugging Face Hub (a local fake, tests/support/fakehub.py) -----------------------------------------
HUB_REPO = "acme/tiny-GGUF"
HUB_FILE = "tiny-Q4_K_M.gguf"
GATED_REPO = "acme/gated-GGUF"
MLX_REPO = "mlx-community/tiny-4bit"
HUB_ELEMS = 150_000  # ~600 KB: big enough to pause in the middle


@pytest.fixture
def hub(fake_hub: FakeHub, tmp_path: Path) -> FakeHub:
    """The fake Hub with a two-quantization GGUF repo, a gated one and an MLX one."""
    build = tmp_path / "hub-build"
    fake_hub.add_repo(
        HUB_REPO,
        {
            HUB_FILE: gguf_bytes(build, elems=HUB_ELEMS),
            "tiny-Q8_0.gguf": gguf_bytes(build, file_type=7, elems=HUB_ELEMS),
            "README.md": b"---\nlicense: mit\n---\n# Tiny\n\nA tiny test model card.\n",
        },
        tags=["gguf", "license:mit"],
        downloads=1234,
        likes=56,
        card="# Tiny\n\nA tiny test model card.\n",
    )
    fake_hub.add_repo(
        GATED_REPO,
        {"gated-Q4_K_M.gguf": gguf_bytes(build, elems=1000)},
        tags=["gguf"],
        gated="manual",
        downloads=10,
        likes=100,
        last_modified="2026-01-01T00:00:00.000Z",
    )
    fake_hub.add_repo(
        MLX_REPO,
        {**mlx_files(), "README.md": b"# Tiny MLX\n"},
        tags=["mlx", "license:apache-2.0"],
        library_name="mlx",
        downloads=7,
        likes=2,
        config={"model_type": "llama", "quantization": {"bits": 4, "group_size": 64}},
        card="# Tiny MLX\n\nA tiny MLX test model.\n",
    )
    return fake_hub


@pytest.fixture
def hub_ctx(gui_ctx: GuiContext, hub: FakeHub) -> GuiContext:
    """``gui_ctx`` with a DownloadManager on the fake Hub, wired like ``app.compose.build_service``
    (the token read from the token file on each request)."""
    tokens = TokenStore(gui_ctx.paths.hf_token_file)
    client = HubClient(
        endpoint=hub.endpoint,
        token=tokens.load,
        memory_probe=lambda: DeviceMemory(ram_total=64 << 30, ram_available=32 << 30),
    )
    gui_ctx.service.hub = DownloadManager(
        gui_ctx.service.models._library,
        client,
        gui_ctx.service.events,
        policy=DownloadPolicy(
            stall_timeout=3600.0,  # tests hold transfers with fake-Hub gates, not stalls
            backoff_base=0.05,
            lock_poll=0.05,
            progress_interval=0.05,
        ),
    )
    return gui_ctx


@pytest.fixture
def hub_window(qtbot: QtBot, hub_ctx: GuiContext, bridge: Bridge) -> Iterator[MainWindow]:
    w = MainWindow(hub_ctx, bridge)
    qtbot.addWidget(w)
    w.show()
    qtbot.waitExposed(w)
    qtbot.waitUntil(lambda: w.settings_page.settings is not None, timeout=10_000)
    # and until the threads that import mlx (Discover's format check at start, the Runtime
    # report once Settings is shown) are done: one still importing when the test's loop closes
    # can crash the process
    qtbot.waitUntil(
        lambda: w.discover_page.formats_known or w.discover_page.manager is None, timeout=60_000
    )
    yield w
    _wait_for_runtime_report(w, qtbot)
