"""The providers file and its keys file: validation, prefix clashes, keys kept
apart (0600), changes seen by another reader."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from app.core.gateway.providers import manage
from app.core.gateway.providers.store import ProviderConfig, ProviderStore
from app.errors import InvalidRequest


def _store(tmp_path: Path) -> ProviderStore:
    return ProviderStore(tmp_path / "config" / "providers.json", tmp_path / "config" / "keys.json")


def _free(_prefix: str) -> None:
    return None


@pytest.mark.parametrize(
    ("cfg", "why"),
    [
        (ProviderConfig("Lan", "http://h:1/v1"), "not a valid provider name"),
        (ProviderConfig("auto", "http://h:1/v1"), "not a valid provider name"),
        (ProviderConfig("a b", "http://h:1/v1"), "not a valid provider name"),
        (ProviderConfig("lan", "ftp://h/v1"), "not an http"),
        (ProviderConfig("lan", "http://h:1/v1", kind="triton"), "unknown kind"),
        (ProviderConfig("lan", "http://h:1/v1", prefix="lan"), "not a valid prefix"),
        (ProviderConfig("lan", "http://h:1/v1", prefix="a/b/"), "not a valid prefix"),
        (ProviderConfig("lan", "http://h:1/v1", prefix="auto/"), "reserved"),
        (ProviderConfig("lan", "http://h:1/v1", idle_timeout=0), "idle timeout"),
    ],
)
def test_invalid_configs_are_refused_and_nothing_is_written(
    tmp_path: Path, cfg: ProviderConfig, why: str
) -> None:
    store = _store(tmp_path)
    with pytest.raises(InvalidRequest, match=why):
        store.add(cfg, None, _free)
    assert not store.path.exists()


def test_keys_live_apart_in_a_0600_file_and_another_reader_sees_changes(tmp_path: Path) -> None:
    store = _store(tmp_path)
    cfg = store.add(ProviderConfig("lan", "http://10.0.0.5:8000/v1/", kind="vllm"), "sk-x", _free)
    assert cfg.prefix == "lan/" and cfg.url == "http://10.0.0.5:8000/v1"
    assert "sk-x" not in store.path.read_text()
    assert stat.S_IMODE(store.keys_path.stat().st_mode) == 0o600
    assert json.loads(store.keys_path.read_text()) == {"keys": {"lan": "sk-x"}}
    other = _store(tmp_path)  # another process's reader: same files
    assert other.get("lan") == cfg and other.key("lan") == "sk-x"
    # replacing without a key drops the key; removing drops both
    store.add(ProviderConfig("lan", "http://10.0.0.5:8000/v1", kind="vllm"), None, _free)
    assert store.key("lan") is None
    store.add(ProviderConfig("office", "http://o:11434/v1", kind="ollama"), "k2", _free)
    assert store.remove("office") and not store.remove("office")
    assert store.key("office") is None and list(store.all()) == ["lan"]


def test_prefixes_may_not_clash(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.add(ProviderConfig("lan", "http://h:1/v1"), None, _free)
    with pytest.raises(InvalidRequest, match="provider 'lan'"):
        store.add(ProviderConfig("lan2", "http://h:2/v1", prefix="lan/"), None, _free)

    def taken(p: str) -> str | None:
        return manage.prefix_clash(p, ["qwen/qwen3-8b.gguf", "smollm2"], ["gpu", "fast"])

    with pytest.raises(InvalidRequest, match="library model 'qwen/qwen3-8b.gguf'"):
        store.add(ProviderConfig("qwen", "http://h:3/v1"), None, taken)
    with pytest.raises(InvalidRequest, match="alias 'gpu'"):
        store.add(ProviderConfig("gpu", "http://h:3/v1"), None, taken)
    assert list(store.all()) == ["lan"]


def test_a_hand_edited_bad_entry_is_skipped_not_fatal(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.path.parent.mkdir(parents=True)
    store.path.write_text(
        json.dumps(
            {
                "providers": [
                    {"name": "BAD NAME", "url": "http://h/v1"},
                    {"name": "ok", "url": "http://h:1/v1", "idle_timeout": "30"},
                    "nonsense",
                ]
            }
        )
    )
    assert list(store.all()) == ["ok"] and store.all()["ok"].idle_timeout == 30.0
