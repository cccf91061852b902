"""The first run's two settings (issue #13): start_at_login and keep_in_tray persist, default
sensibly and are validated like the others."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.errors import ConfigError
from app.settings import Settings, SettingsStore, settings_from_dict


def test_defaults_keep_hearth_in_the_tray_and_do_not_start_at_login() -> None:
    s = Settings()
    assert s.start_at_login is False and s.keep_in_tray is True


def test_they_round_trip_through_the_file(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    store = SettingsStore(path)
    store.update(start_at_login=True, keep_in_tray=False)
    raw = json.loads(path.read_text())
    assert raw["start_at_login"] is True and raw["keep_in_tray"] is False
    fresh = settings_from_dict(raw)
    assert fresh.start_at_login is True and fresh.keep_in_tray is False


@pytest.mark.parametrize("key", ["start_at_login", "keep_in_tray"])
def test_a_non_boolean_is_refused(key: str) -> None:
    with pytest.raises(ConfigError, match=f"settings.{key} must be true or false"):
        settings_from_dict({key: "yes"})
