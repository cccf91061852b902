"""The walkthrough's cheap steps, offscreen, so the script cannot rot: the welcome on an empty
data folder, the Settings page scrolled by wheel events over its value widgets (nothing
changes), and one page grabbed at each size in one theme."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before any Qt import

from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtGui import QImage
from pytestqt.qtbot import QtBot

from tests.gui.walkthrough.harness import HearthApp, StepFailed
from tests.gui.walkthrough.pages import every_page, sizes
from tests.gui.walkthrough.steps import Walk, settings_wheel, welcome


@pytest.fixture
def walk(
    qtbot: QtBot, hearth_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Walk]:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    # a loopback port nobody listens on: the welcome says it is offline, at once
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    w = Walk(tmp_path / "shots", HearthApp())
    try:
        yield w
    finally:
        w.app.quit()


def test_the_cheap_steps_pass_and_save_their_screenshots(walk: Walk) -> None:
    welcome(walk, suggestions=False)
    settings_wheel(walk)
    every_page(walk, ["light"], names=["Settings"])
    shots = {p.name for p in walk.out.glob("*.png")}
    assert {"a-welcome.png", "g1-settings-before-wheel.png", "g2-settings-after-wheel.png"} <= shots
    for _label, size in sizes():
        name = f"i-light-{size.width()}x{size.height()}-09-settings.png"
        assert name in shots
        assert QImage(str(walk.out / name)).size() == size


def test_a_step_whose_check_fails_says_so(walk: Walk) -> None:
    walk.window.show_page("Chat")
    with pytest.raises(StepFailed, match="opens on the Library"):
        welcome(walk, suggestions=False)
