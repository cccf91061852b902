"""``vision`` in settings.json: defaults, validation, and the file round trip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.errors import ConfigError
from app.settings import SettingsStore, VisionSettings, settings_from_dict

# A fresh HEARTH_HOME in tmp_path: nothing here may touch the real per-user folders.
pytestmark = pytest.mark.usefixtures("hearth_home")


def test_defaults_fetch_for_local_clients_only_and_bound_images() -> None:
    v = settings_from_dict({}).vision
    assert v == VisionSettings()
    assert (v.fetch_urls, v.max_pixels, v.max_image_bytes) == (
        "local-clients", 4096 * 4096, 20 * 1024 * 1024,
    )  # fmt: skip


@pytest.mark.parametrize(
    "raw",
    [
        {"fetch_urls": "some"},
        {"fetch_urls": True},
        {"max_pixels": 0},
        {"max_pixels": -5},
        {"max_image_bytes": "big"},
        {"fetch_timeout_s": 0},
    ],
)
def test_bad_values_are_config_errors(raw: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match="vision"):
        settings_from_dict({"vision": raw})


def test_the_file_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"vision": {"fetch_urls": "off", "max_pixels": 1000}}))
    got = SettingsStore(path).load().vision
    assert got == VisionSettings(fetch_urls="off", max_pixels=1000)
    assert (
        settings_from_dict(json.loads(json.dumps(SettingsStore(path).load().to_dict()))).vision
        == got
    )


def test_max_request_pixels_defaults_to_four_full_size_images_and_reaches_the_limits() -> None:
    v = settings_from_dict({}).vision
    assert v.max_request_pixels == 4 * v.max_pixels
    got = settings_from_dict({"vision": {"max_request_pixels": 5000, "max_pixels": 100}}).vision
    assert (got.limits().max_request_pixels, got.limits().max_pixels) == (5000, 100)
    with pytest.raises(ConfigError, match="max_request_pixels"):
        settings_from_dict({"vision": {"max_request_pixels": 0}})
