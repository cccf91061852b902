"""Every page at the default size, the minimum size and 1600x1000, in each theme asked for;
the theme is switched the way a user does it (Settings › Window › Theme, Apply)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from PySide6.QtCore import QSize

from tests.gui.walkthrough.harness import check, settle, wait_until
from tests.gui.walkthrough.steps import Walk

log = logging.getLogger("walkthrough")

LARGE = QSize(1600, 1000)


def sizes() -> list[tuple[str, QSize]]:
    from app.gui.window_state import DEFAULT_SIZE, MINIMUM_SIZE

    return [("default", DEFAULT_SIZE), ("minimum", MINIMUM_SIZE), ("large", LARGE)]


def set_theme(walk: Walk, theme: str) -> None:
    from app.gui.theme import is_dark

    w = walk.window
    w.show_page("Settings")
    page = w.settings_page
    wait_until(lambda: page.isEnabled(), "the Settings page to read the file")
    combo = page.theme_combo
    combo.setCurrentIndex(combo.findData(theme))
    if page.unsaved:
        check(page.apply(), f"Apply refused the {theme} theme")
        wait_until(lambda: not page.unsaved, f"the {theme} theme to be saved")
    wait_until(lambda: is_dark() == (theme == "dark"), f"the window to turn {theme}")


def resize(walk: Walk, size: QSize) -> None:
    w = walk.window
    w.resize(size)
    wait_until(lambda: w.size() == size, f"the window to become {size.width()}x{size.height()}")


def every_page(walk: Walk, themes: Sequence[str], names: Sequence[str] | None = None) -> None:
    """Grab ``names`` (every page by default) at each size in each theme, as
    ``i-THEME-WxH-NN-page.png``; the window's size must be the one asked for."""
    from app.gui.main_window import PAGES

    w = walk.window
    for theme in themes:
        set_theme(walk, theme)
        for _label, size in sizes():
            resize(walk, size)
            for name in names or PAGES:
                w.show_page(name)
                check(w.current_page == name, f"the window shows {w.current_page}, not {name}")
                settle(0.25)
                slug = name.lower().replace(" ", "-")
                n = PAGES.index(name) + 1
                walk.shot(f"i-{theme}-{size.width()}x{size.height()}-{n:02d}-{slug}")
    from app.gui.window_state import DEFAULT_SIZE

    resize(walk, DEFAULT_SIZE)
