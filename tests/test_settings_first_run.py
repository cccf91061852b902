"""The first run's settings: start_at_login persists and is validated like the
others; "keep running in the tray" is ui.close_action (one setting), and an older file's
keep_in_tray still means what it meant."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.errors import ConfigError
from app.settings import Settings, SettingsStore, settings_from_dict

# A fresh HEARTH_HOME in tmp_path: nothing here may touch the real per-user folders.
pytestmark = pytest.mark.usefixtures("hearth_home")


def test_defaults_keep_hearth_serving_and_do_not_start_at_login() -> None:
    s = Settings()
    assert s.start_at_login is False and s.ui.close_action == "ask"


def test_they_round_trip_through_the_file(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    store = SettingsStore(path)
    store.update(start_at_login=True)
    store.update_ui(close_action="quit")
    raw = json.loads(path.read_text())
    assert raw["start_at_login"] is True and raw["ui"]["close_action"] == "quit"
    assert "keep_in_tray" not in raw  # one setting, not two
    fresh = settings_from_dict(raw)
    assert fresh.start_at_login is True and fresh.ui.close_action == "quit"


def test_an_older_files_keep_in_tray_off_reads_as_quit() -> None:
    assert settings_from_dict({"keep_in_tray": False}).ui.close_action == "quit"
    assert settings_from_dict({"keep_in_tray": True}).ui.close_action == "ask"
    # a choice made in the newer setting wins
    both = {"keep_in_tray": False, "ui": {"close_action": "background"}}
    assert settings_from_dict(both).ui.close_action == "background"


def test_a_non_boolean_is_refused() -> None:
    with pytest.raises(ConfigError, match="settings.start_at_login must be true or false"):
        settings_from_dict({"start_at_login": "yes"})
