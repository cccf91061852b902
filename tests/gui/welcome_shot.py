"""The first-run welcome's screenshot: ``python -m tests.gui.welcome_shot OUT.png``.

The real window on an empty temporary HEARTH_HOME, its Hub the fake one (tests/support/fakehub.py)
serving the curated starter repos as small files, so it runs without internet (sizes are the
fake files' sizes); ``--offline`` points it at a closed port instead. Use ``xvfb-run -a`` for a real X server, else it renders offscreen.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


from tests.gui.screenshots import ShotApp, settle, wait_until  # noqa: E402


def main(out: Path, *, offline: bool = False) -> int:
    logging.basicConfig(level=logging.INFO)
    tmp = Path(tempfile.mkdtemp(prefix="hearth-welcome-"))
    os.environ["HEARTH_HOME"] = str(tmp / "home")
    os.environ["XDG_CONFIG_HOME"] = str(tmp / "xdg")  # the switches never touch ~/.config

    from tests.support.fakehub import FakeHub, add_starters

    hub = FakeHub().start()
    add_starters(hub, tmp / "hub")
    os.environ["HF_ENDPOINT"] = hub.endpoint
    if offline:  # a loopback port nobody listens on: the Hub cannot be reached
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["HF_ENDPOINT"] = f"http://127.0.0.1:{s.getsockname()[1]}"

    shot = ShotApp(size=(1180, 740))
    w = shot.window
    try:
        wait_until(lambda: w.welcome.loaded or w.welcome.retry_button.isVisible(), 120)
        settle(0.5)
        out.parent.mkdir(parents=True, exist_ok=True)
        w.grab().save(str(out))
        print(out)
    finally:
        shot.close()
        hub.stop()
    return 0


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--offline"]
    sys.exit(main(Path(args[0] if args else "welcome.png"), offline="--offline" in sys.argv))
