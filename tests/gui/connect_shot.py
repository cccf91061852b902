"""The Connect page's screenshot: ``xvfb-run -a python -m tests.gui.connect_shot OUT.png [TOOL]``.

The real window on a temporary HEARTH_HOME: SmolLM2 imported and loaded with a 2,048-token
context, the server running on the settings' port (another free one when that is taken), and
Continue chosen (or TOOL), so the page shows its settings and the context warning with its
button.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from tests.gui.screenshots import settle, smollm2_shot, wait_until  # noqa: E402


def _free(port: int) -> int:
    """``port`` when nothing listens on it, else a free one."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(out: Path, tool: str = "continue") -> int:
    logging.basicConfig(level=logging.INFO)
    os.environ["HEARTH_HOME"] = tempfile.mkdtemp(prefix="hearth-connect-")

    made = smollm2_shot((1180, 740))
    if made is None:
        return 1
    shot, mid = made
    w = shot.window
    try:
        sp = w.server_page
        wait_until(lambda: w.settings_page.settings is not None)
        sp.port_spin.setValue(_free(sp.port_spin.value()))
        sp.start_server()
        wait_until(lambda: sp.running, 120)
        w.show_page("Connect")
        page = w.connect_page
        page.select_tool(tool)
        wait_until(
            lambda: (
                not page.pending
                and page.state is not None
                and page.state.running
                and page.state.loaded
            )
        )
        settle(0.5)
        out.parent.mkdir(parents=True, exist_ok=True)
        w.grab().save(str(out))
        print(out)
    finally:
        shot.close()
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    sys.exit(main(Path(args[0] if args else "connect.png"), *args[1:2]))
