"""keys.json: hashes only, 0600, atomic, shared between processes; last use written in batches."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from app.core.gateway.keys import KeyStore, hash_secret
from app.core.util import access
from app.errors import InvalidRequest, ModelNotFound


def test_add_stores_only_the_hash_in_a_private_file(tmp_path: Path) -> None:
    path = tmp_path / "config" / "keys.json"
    store = KeyStore(path)
    key = store.add("alice", "s3cret-value", rpm=6, tpm=1000, models=["smol*"], admin=True)
    raw = path.read_text()
    assert "s3cret-value" not in raw
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    [entry] = json.loads(raw)["keys"]
    assert entry["hash"] == hash_secret("s3cret-value") == key.hash
    assert (entry["rpm"], entry["tpm"], entry["models"], entry["admin"]) == (
        6,
        1000,
        ["smol*"],
        True,
    )
    assert entry["created_at"] > 0 and entry["last_used_at"] is None
    assert store.match(hash_secret("s3cret-value")) == key
    assert store.match(hash_secret("other")) is None
    assert not list(path.parent.glob("*.tmp")) and not list(path.parent.glob("*.lock"))


def test_names_are_unique_checked_and_default_is_reserved(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "keys.json")
    store.add("a", "x")
    for bad in ("a", "default", "", "has space", "../x", "x" * 65):
        with pytest.raises(InvalidRequest):
            store.add(bad, "y")
    with pytest.raises(InvalidRequest):
        store.add("b", "y", rpm=-1)
    assert list(store.all()) == ["a"]
    assert store.remove("a") and not store.remove("a")
    assert store.all() == {}


def test_another_writer_is_seen_at_the_next_lookup(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    reader = KeyStore(path)
    assert reader.all() == {}
    # a second process writes the file: simulate with a raw write (another inode, no shared cache)
    KeyStore(path).add("b", "secret-b")
    data = path.read_text()
    tmp = tmp_path / "other.json"
    tmp.write_text(data.replace('"b"', '"c"'))
    os.replace(tmp, path)
    assert list(reader.all()) == ["c"]  # a stat per lookup: no interval to wait out


def test_a_corrupt_file_accepts_no_named_key(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    KeyStore(path).add("a", "secret-a")
    path.write_text("{not json")
    store = KeyStore(path)
    assert store.all()  # something is there: the server still requires a key...
    assert store.match(hash_secret("secret-a")) is None  # ...and accepts none


def test_last_use_is_batched_and_survives_a_concurrent_add(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    store = KeyStore(path)
    store.add("a", "secret-a")
    before = path.stat().st_mtime_ns, path.stat().st_ino
    for t in (100.0, 200.0, 150.0):
        store.note_use("a", t)
    assert (path.stat().st_mtime_ns, path.stat().st_ino) == before  # nothing written per use
    store.add("b", "secret-b")  # a write between the uses and the flush keeps both
    store.note_use("gone", 1.0)  # removed meanwhile: ignored
    assert store.flush_uses() == 1
    keys = KeyStore(path).all()
    assert keys["a"].last_used_at == 150.0  # the latest noted for the key
    assert keys["b"].last_used_at is None
    assert store.flush_uses() == 0


def test_model_scope_patterns() -> None:
    assert access.in_scope("anything", None)
    scope = ("smol*", "org/exact")
    assert access.in_scope("smollm2-135m", scope) and access.in_scope("org/exact", scope)
    assert not access.in_scope("Smollm2", scope) and not access.in_scope("org/exact2", scope)
    with pytest.raises(ModelNotFound) as e:
        access.check("other", scope)
    assert e.value.message == "The model 'other' does not exist"
    assert access.in_scope("other", ())
    assert access.visible(["smollm2", "other"], str, scope) == ["smollm2"]
