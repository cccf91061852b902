"""Settings validation and storage, API key hashing, and HEARTH_HOME (SECURITY.md items 4, 23)."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import app.settings as settings_module
from app.errors import ConfigError
from app.paths import AppPaths
from app.settings import (
    DEFAULT_BODY_LIMIT,
    DEFAULT_PORT,
    LoadDefaults,
    ServerSettings,
    Settings,
    SettingsStore,
    generate_key,
    hash_key,
    key_matches,
    settings_from_dict,
)

# A fresh HEARTH_HOME in tmp_path: nothing here may touch the real per-user folders.
pytestmark = pytest.mark.usefixtures("hearth_home")


@pytest.fixture
def store(tmp_path: Path) -> SettingsStore:
    return SettingsStore(tmp_path / "config" / "settings.json")


def test_defaults_are_safe() -> None:
    s = Settings()
    assert s.server.host == "127.0.0.1"  # loopback only on a fresh install
    assert s.server.port == DEFAULT_PORT
    assert s.server.api_key_hashes == ()
    assert s.server.max_body_bytes == DEFAULT_BODY_LIMIT == 32 * 1024 * 1024
    assert s.server.start_at_launch is False
    assert s.server.jit_loading is True
    assert s.server.queue_size > 0
    # slow clients are closed (SECURITY.md 6); whole requests never count toward the caps
    assert 0 < s.server.header_timeout_s <= 60 and 0 < s.server.body_timeout_s <= 60
    assert s.server.body_min_rate > 0
    assert 1 <= s.server.max_incomplete_per_client <= s.server.max_incomplete_connections
    assert s.load == LoadDefaults()
    assert settings_from_dict({}) == s
    # several requests batched over one shared cache, which reuses whole prefixes
    assert s.load.parallel == 8 and s.prompt_cache.mode == "reuse"


def test_prompt_cache_mode_reaches_every_load(tmp_path: Path) -> None:
    """``prompt_cache.mode`` in settings.json is the default of every load's prompt_cache."""
    from app.compose import build_service

    paths = AppPaths.default(tmp_path).ensure()
    s = Settings()
    store = SettingsStore(paths.settings_file)
    store.save(
        dataclasses.replace(s, prompt_cache=dataclasses.replace(s.prompt_cache, mode="exact"))
    )
    assert settings_from_dict(store.load().to_dict()).prompt_cache.mode == "exact"
    service = build_service(paths, store.load())
    assert service.models.effective_options("any").prompt_cache == "exact"


def test_missing_file_loads_defaults(store: SettingsStore) -> None:
    assert store.load() == Settings()
    assert not store.path.exists()  # loading never writes


def test_round_trip(store: SettingsStore) -> None:
    s = Settings(
        server=ServerSettings(
            host="0.0.0.0",
            port=9000,
            api_key_hashes=(hash_key("k1"), hash_key("k2")),
            allowed_hosts=("my-box.lan",),
            allowed_origins=("http://localhost:3000",),
            max_body_bytes=1024,
            jit_loading=False,
            queue_size=3,
            request_timeout_s=12.5,
            start_at_launch=True,
        ),
        load=LoadDefaults(context_length=8192, threads=6, batch_size=256),
        models_dir="/srv/models",
        tray_hint_shown=True,
    )
    store.save(s)
    loaded = store.load()
    assert loaded == s
    assert isinstance(loaded.server.api_key_hashes, tuple)
    assert isinstance(loaded.server.request_timeout_s, float)
    # a second store on the same file (another process) sees the same thing
    assert SettingsStore(store.path).load() == s


def test_update(store: SettingsStore) -> None:
    store.save(Settings(models_dir="/a"))
    s = store.update(tray_hint_shown=True)
    assert s.tray_hint_shown is True and s.models_dir == "/a"
    assert store.load() == s


def test_file_is_private_and_written_atomically(store: SettingsStore) -> None:
    store.save(Settings())
    assert store.path.stat().st_mode & 0o777 == 0o600
    store.update(models_dir="/x")
    assert store.path.stat().st_mode & 0o777 == 0o600
    leftovers = {p.name for p in store.path.parent.iterdir()} - {
        "settings.json",
        "settings.json.lock",
    }
    assert leftovers == set()
    assert json.loads(store.path.read_text())["models_dir"] == "/x"


def test_stored_file_never_contains_the_plain_key(store: SettingsStore) -> None:
    key = generate_key()
    store.save(Settings(server=ServerSettings(api_key_hashes=(hash_key(key),))))
    text = store.path.read_text()
    assert key not in text
    assert key.removeprefix("hearth-") not in text
    assert hash_key(key) in text
    assert key_matches(key, store.load().server.api_key_hashes)


def test_hash_key_and_key_matches() -> None:
    a, b = generate_key(), generate_key()
    assert a != b and a.startswith("hearth-") and len(a) > 30
    h = hash_key(a)
    assert len(h) == 64 and h != a
    assert hash_key(a) == h  # stable: stored hashes keep matching across restarts
    assert key_matches(a, [h])
    assert key_matches(a, (hash_key(b), h))  # any of several keys
    assert not key_matches(b, [h])
    assert not key_matches("", [h])
    assert not key_matches(a + " ", [h])
    assert not key_matches(a, [])
    assert not key_matches(h, [h])  # the hash itself is not a key


BAD_VALUES: list[tuple[str, dict[str, Any]]] = [
    ("port 70000", {"server": {"port": 70000}}),
    ("port 65536", {"server": {"port": 65536}}),
    ("negative port", {"server": {"port": -1}}),
    ("port as string", {"server": {"port": "8080"}}),
    ("port as float", {"server": {"port": 8080.0}}),
    ("port as bool", {"server": {"port": True}}),
    ("negative queue", {"server": {"queue_size": -5}}),
    ("negative body limit", {"server": {"max_body_bytes": -1}}),
    ("negative context", {"load": {"context_length": -1}}),
    ("negative threads", {"load": {"threads": -2}}),
    ("zero timeout", {"server": {"request_timeout_s": 0}}),
    ("negative timeout", {"server": {"request_timeout_s": -1.5}}),
    ("timeout as string", {"server": {"request_timeout_s": "10"}}),
    ("host as number", {"server": {"host": 127}}),
    ("jit as string", {"server": {"jit_loading": "yes"}}),
    ("jit as int", {"server": {"jit_loading": 1}}),
    ("hashes as string", {"server": {"api_key_hashes": "abc"}}),
    ("hashes with a number", {"server": {"api_key_hashes": ["abc", 1]}}),
    ("origins as object", {"server": {"allowed_origins": {"a": 1}}}),
    ("server as list", {"server": [1, 2]}),
    ("server as string", {"server": "x"}),
    ("load as null", {"load": None}),
    ("models_dir as number", {"models_dir": 5}),
    ("tray hint as string", {"tray_hint_shown": "true"}),
    ("zero header timeout", {"server": {"header_timeout_s": 0}}),
    ("negative body timeout", {"server": {"body_timeout_s": -1}}),
    ("infinite header timeout", {"server": {"header_timeout_s": math.inf}}),
    ("body rate as float", {"server": {"body_min_rate": 1.5}}),
    ("negative body rate", {"server": {"body_min_rate": -1}}),
    ("no incomplete connections", {"server": {"max_incomplete_connections": 0}}),
    ("no incomplete per client", {"server": {"max_incomplete_per_client": 0}}),
    ("per-client cap as string", {"server": {"max_incomplete_per_client": "5"}}),
    ("unknown prompt cache mode", {"prompt_cache": {"mode": "always"}}),
    ("prompt cache mode as bool", {"prompt_cache": {"mode": True}}),
    ("prompt cache as list", {"prompt_cache": ["reuse"]}),
]


@pytest.mark.parametrize("raw", [r for _, r in BAD_VALUES], ids=[n for n, _ in BAD_VALUES])
def test_settings_from_dict_rejects(raw: dict[str, Any]) -> None:
    with pytest.raises(ConfigError) as ei:
        settings_from_dict(raw)
    assert ei.value.code == "config_error"


@pytest.mark.parametrize("raw", [r for _, r in BAD_VALUES], ids=[n for n, _ in BAD_VALUES])
def test_invalid_file_falls_back_to_defaults_and_logs(
    store: SettingsStore, raw: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    store.path.parent.mkdir(parents=True)
    store.path.write_text(json.dumps(raw))
    with caplog.at_level(logging.ERROR, logger="app.settings"):
        assert store.load() == Settings()
    assert any("settings" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    "content", [b"", b"{", b"\x00\xff\xfe garbage", b"[1, 2]", b"null", b'"text"', b"{}{}"]
)
def test_corrupt_file_falls_back_to_defaults(store: SettingsStore, content: bytes) -> None:
    store.path.parent.mkdir(parents=True)
    store.path.write_bytes(content)
    assert store.load() == Settings()


def test_valid_edge_values_are_kept() -> None:
    s = settings_from_dict(
        {"server": {"port": 1, "request_timeout_s": 5, "queue_size": 0}, "load": {"threads": 0}}
    )
    assert s.server.port == 1
    assert settings_from_dict({"server": {"port": 0}}).server.port == 0  # 0 = any free port
    assert s.server.request_timeout_s == 5.0 and isinstance(s.server.request_timeout_s, float)
    assert settings_from_dict({"server": {"port": 65535}}).server.port == 65535


def test_slow_client_settings_round_trip() -> None:
    raw = {
        "header_timeout_s": 2,
        "body_timeout_s": 0.5,
        "body_min_rate": 0,  # 0 = the whole body within body_timeout_s
        "max_incomplete_connections": 1,
        "max_incomplete_per_client": 1,
    }
    s = settings_from_dict({"server": raw}).server
    assert s.header_timeout_s == 2.0 and isinstance(s.header_timeout_s, float)
    assert (s.body_timeout_s, s.body_min_rate) == (0.5, 0)
    assert (s.max_incomplete_connections, s.max_incomplete_per_client) == (1, 1)
    assert settings_from_dict(Settings(server=s).to_dict()).server == s


def test_unknown_keys_are_ignored_and_partial_sections_keep_defaults() -> None:
    s = settings_from_dict({"server": {"port": 9999, "future_option": 1}, "other": {"x": 1}})
    assert s.server.port == 9999
    assert dataclasses.replace(s.server, port=DEFAULT_PORT) == ServerSettings()
    assert s.load == LoadDefaults()


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_non_finite_timeout_is_rejected(value: float) -> None:
    with pytest.raises(ConfigError):
        settings_from_dict({"server": {"request_timeout_s": value}})


# -- paths -----------------------------------------------------------------------------------------


def _all_paths(p: AppPaths) -> list[Path]:
    return [
        p.config,
        p.data,
        p.models,
        p.logs,
        p.cache,
        p.settings_file,
        p.library_file,
        p.server_file,
        p.probe_file,
    ]


def test_hearth_home_relocates_every_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "portable"
    monkeypatch.setenv("HEARTH_HOME", str(home))
    paths = AppPaths.default()
    for p in _all_paths(paths):
        assert p.is_relative_to(home), p
    assert len({paths.config, paths.data, paths.models, paths.logs, paths.cache}) == 5
    assert paths.settings_file.name == "settings.json"
    assert paths.library_file.name == "library.json"
    paths.ensure()
    for d in (paths.config, paths.data, paths.models, paths.logs, paths.cache):
        assert d.is_dir()


def test_relative_hearth_home_is_made_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HEARTH_HOME", "rel-home")
    paths = AppPaths.default()
    assert all(
        p.is_absolute() and p.is_relative_to(tmp_path / "rel-home") for p in _all_paths(paths)
    )


def test_explicit_home_wins_over_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HEARTH_HOME", str(tmp_path / "env"))
    paths = AppPaths.default(tmp_path / "arg")
    assert all(p.is_relative_to(tmp_path / "arg") for p in _all_paths(paths))


def test_without_hearth_home_paths_are_per_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HEARTH_HOME", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg-data"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    paths = AppPaths.default()
    assert paths.data.is_relative_to(tmp_path / "xdg-data")
    assert paths.config.is_relative_to(tmp_path / "xdg-config")
    assert paths.models.is_relative_to(paths.data)
    assert "Hearth" in str(paths.data)


def test_parallel_default_is_bounded() -> None:
    assert settings_from_dict({}).load.parallel == 8
    assert settings_from_dict({"load": {"parallel": 2}}).load.parallel == 2
    for bad in (0, 17):
        with pytest.raises(ConfigError):
            settings_from_dict({"load": {"parallel": bad}})


# -- cached, not re-read per request ------------------------------------------------------
REPO = Path(__file__).resolve().parents[1]


def _in_another_process(path: Path, code: str) -> None:
    """Run ``code`` with ``store`` = a SettingsStore of ``path`` in a second Python process."""
    prelude = (
        "import sys, pathlib\nfrom app.settings import LoadDefaults, SettingsStore\n"
        "store = SettingsStore(pathlib.Path(sys.argv[1]))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", prelude + code, str(path)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr


class _CountReads:
    def __init__(self, path: Path) -> None:
        self.path, self.calls = path, 0
        self._real = settings_module.read_json

    def __call__(self, path: Path, default: Any) -> Any:
        if path == self.path:
            self.calls += 1
        return self._real(path, default)


def test_load_answers_from_memory_and_a_save_is_seen_by_every_store_at_once(
    store: SettingsStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.save(Settings(models_dir="/a"))
    reads = _CountReads(store.path)
    monkeypatch.setattr(settings_module, "read_json", reads)
    other = SettingsStore(store.path)  # e.g. the GUI's store beside build_service's
    for _ in range(200):
        assert store.load().models_dir == "/a" and other.load().models_dir == "/a"
    assert reads.calls == 0
    other.save(Settings(models_dir="/b"))
    assert store.load().models_dir == "/b"  # no wait: same process, same memory
    assert reads.calls == 0


def test_a_change_written_by_another_process_is_seen(
    store: SettingsStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.save(Settings())
    assert store.load().load.jit_ttl_s == 900
    reads = _CountReads(store.path)
    monkeypatch.setattr(settings_module, "read_json", reads)
    _in_another_process(
        store.path, "store.update(load=LoadDefaults(jit_ttl_s=60, memory_budget_bytes=123))"
    )
    deadline = time.monotonic() + 30  # generous: the check runs once a second
    while store.load().load.jit_ttl_s != 60:
        assert time.monotonic() < deadline, "the other process's change was never seen"
        time.sleep(0.05)
    assert store.load().load.memory_budget_bytes == 123
    assert reads.calls == 1  # read once when it changed, not on every load


def test_update_starts_from_the_file_not_from_memory(store: SettingsStore) -> None:
    """A change another process made a moment ago survives this process's update."""
    store.save(Settings())
    store.load()  # cached, and checked just now
    _in_another_process(store.path, "store.update(models_dir='/theirs')")
    s = store.update(tray_hint_shown=True)
    assert (s.models_dir, s.tray_hint_shown) == ("/theirs", True)
    assert json.loads(store.path.read_text())["models_dir"] == "/theirs"


def test_a_corrupt_file_written_later_falls_back_to_defaults(
    store: SettingsStore, caplog: pytest.LogCaptureFixture
) -> None:
    store.save(Settings(models_dir="/a"))
    store.load()
    _in_another_process(store.path, "store.path.write_text('{broken')")
    deadline = time.monotonic() + 30
    with caplog.at_level(logging.ERROR, logger="app.settings"):
        while store.load() != Settings():
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert "invalid" in caplog.text


def test_tls_files_round_trip_and_default_to_plain_http(store: SettingsStore) -> None:
    assert (ServerSettings().tls_cert, ServerSettings().tls_key) == ("", "")
    s = Settings(server=ServerSettings(tls_cert="/etc/hearth/cert.pem", tls_key="/k/key.pem"))
    store.save(s)
    assert SettingsStore(store.path).load() == s
    on_disk = json.loads(store.path.read_text())["server"]
    assert (on_disk["tls_cert"], on_disk["tls_key"]) == ("/etc/hearth/cert.pem", "/k/key.pem")
    for bad in ({"tls_cert": 5}, {"tls_key": ["a"]}):
        with pytest.raises(ConfigError):
            settings_from_dict({"server": bad})


def test_stored_responses_bounds_have_defaults_and_are_checked() -> None:
    s = settings_from_dict({})
    assert (s.responses.max_age_days, s.responses.max_bytes) == (30.0, 256 * 1024 * 1024)
    s = settings_from_dict({"responses": {"max_age_days": 2, "max_bytes": 4096}})
    assert (s.responses.max_age_days, s.responses.max_bytes) == (2.0, 4096)
    for bad in ({"max_bytes": 0}, {"max_age_days": 0}, {"max_bytes": "big"}):
        with pytest.raises(ConfigError, match="responses"):
            settings_from_dict({"responses": bad})


def test_shared_state_settings_round_trip_and_are_checked(store: SettingsStore) -> None:
    from app.settings import StateSettings

    assert Settings().state == StateSettings("", "open")  # off: every piece in process
    s = dataclasses.replace(
        Settings(), state=StateSettings("rediss://:pw@cache.lan:6380/2", "closed")
    )
    store.save(s)
    assert SettingsStore(store.path).load() == s
    for bad, why in (
        ({"url": "http://cache.lan"}, "state.url"),
        ({"url": "redis://h/x"}, "state.url"),
        ({"limits_on_failure": "maybe"}, "limits_on_failure"),
        ({"url": 5}, "state.url"),
    ):
        with pytest.raises(ConfigError, match=why):
            settings_from_dict({"state": bad})
