"""Models other apps downloaded (HF cache, LM Studio, Ollama): indexed in place with their origin,
never copied, never deleted without the user's confirmation. Fake stores with real small GGUFs."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.core.library.index import ModelLibrary
from app.core.library.stores import ForeignLocations, scan
from tests.support.fakehub import gguf_bytes, mlx_files


@dataclass
class Stores:
    root: Path
    locations: ForeignLocations
    hf_gguf: Path  # the snapshot path (a symlink into blobs/)
    hf_blob: Path
    lms_gguf: Path
    ollama_blob: Path
    ollama_manifests: Path


def _hf_file(repo: Path, rev: str, rel: str, data: bytes) -> Path:
    sha = hashlib.sha256(data).hexdigest()
    blob = repo / "blobs" / sha
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(data)
    link = repo / "snapshots" / rev / rel
    link.parent.mkdir(parents=True, exist_ok=True)
    depth = len(Path(rel).parts) + 1
    link.symlink_to(Path(*([".."] * depth)) / "blobs" / sha)  # relative, like huggingface_hub
    return link


def _ollama_manifest(root: Path, name: str, digest: str, host: str = "registry.ollama.ai") -> Path:
    m = root / "manifests" / host / name
    m.parent.mkdir(parents=True, exist_ok=True)
    m.write_text(
        json.dumps(
            {
                "schemaVersion": 2,
                "layers": [
                    {
                        "mediaType": "application/vnd.ollama.image.template",
                        "digest": "sha256:" + "1" * 64,
                    },
                    {
                        "mediaType": "application/vnd.ollama.image.model",
                        "digest": digest,
                        "size": 1,
                    },
                ],
            }
        )
    )
    return m


@pytest.fixture
def stores(tmp_path: Path) -> Stores:
    b = tmp_path / "build"
    outside = tmp_path / "outside-secret.gguf"
    outside.write_bytes(gguf_bytes(b, name="secret"))

    # -- Hugging Face cache
    hf = tmp_path / "hf-hub"
    rev = "a" * 40
    repo = hf / "models--bartowski--Tiny-GGUF"
    hf_gguf = _hf_file(repo, rev, "Tiny-Q4_K_M.gguf", gguf_bytes(b, name="hf"))
    _hf_file(repo, rev, "mmproj-Tiny-f16.gguf", gguf_bytes(b, name="proj"))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(rev)
    big = hf / "models--acme--Big-GGUF"
    _hf_file(big, rev, "big-Q8_0-00001-of-00002.gguf", gguf_bytes(b, name="big", file_type=7))
    _hf_file(big, rev, "big-Q8_0-00002-of-00002.gguf", b"\0" * 100)
    mlx = hf / "models--mlx-community--Tiny-4bit"
    for name, data in mlx_files().items():
        _hf_file(mlx, rev, name, data)
    plain = hf / "models--google--bert-base"  # a transformers checkpoint, not an MLX model
    for name, data in mlx_files(config={"model_type": "bert"}).items():
        _hf_file(plain, rev, name, data)
    evil = hf / "models--evil--Escape-GGUF" / "snapshots" / rev
    evil.mkdir(parents=True)
    (evil / "escape.gguf").symlink_to(outside)  # points out of the cache: skipped

    # -- LM Studio
    lms_root = tmp_path / "lmstudio" / "models"
    lms_gguf = lms_root / "lmstudio-community" / "Tiny-GGUF" / "Tiny-Q8_0.gguf"
    lms_gguf.parent.mkdir(parents=True)
    lms_gguf.write_bytes(gguf_bytes(b, name="lms", file_type=7))
    lms_mlx = lms_root / "mlx-community" / "Other-4bit"
    lms_mlx.mkdir(parents=True)
    for name, data in mlx_files().items():
        (lms_mlx / name).write_bytes(data)
    (lms_root / "lmstudio-community" / "Tiny-GGUF" / "notes.txt").write_text("not a model")

    # -- Ollama
    ol = tmp_path / "ollama" / "models"
    data = gguf_bytes(b, name="ollama")
    hexd = hashlib.sha256(data).hexdigest()
    (ol / "blobs").mkdir(parents=True)
    blob = ol / "blobs" / f"sha256-{hexd}"
    blob.write_bytes(data)
    _ollama_manifest(ol, "library/tiny/latest", f"sha256:{hexd}")
    _ollama_manifest(ol, "library/tiny/1b", f"sha256:{hexd}")  # a second tag, same blob
    _ollama_manifest(ol, "bartowski/Foo-GGUF/Q4_K_M", f"sha256:{hexd}", host="hf.co")
    _ollama_manifest(ol, "library/evil/latest", "sha256:../../../outside-secret.gguf")
    _ollama_manifest(ol, "library/gone/latest", "sha256:" + "f" * 64)  # blob missing
    (ol / "manifests" / "registry.ollama.ai" / "library" / "broken").mkdir(parents=True)
    (ol / "manifests" / "registry.ollama.ai" / "library" / "broken" / "latest").write_text("{nope")

    return Stores(
        tmp_path,
        ForeignLocations(hf_cache=(hf,), lm_studio=(lms_root,), ollama=(ol,)),
        hf_gguf,
        hf_gguf.resolve(),
        lms_gguf,
        blob,
        ol / "manifests",
    )


@pytest.fixture
def lib(tmp_path: Path) -> ModelLibrary:
    return ModelLibrary(tmp_path / "data" / "library.json", tmp_path / "hearth-models")


def test_scan_finds_each_store_in_place(stores: Stores) -> None:
    found = {(f.origin, f.name, f.format) for f in scan(stores.locations)}
    assert found == {
        ("huggingface-cache", "Tiny-Q4_K_M.gguf", "gguf"),
        ("huggingface-cache", "big-Q8_0-00001-of-00002.gguf", "gguf"),  # first shard only
        ("huggingface-cache", "Tiny-4bit", "mlx"),
        ("lm-studio", "Tiny-Q8_0.gguf", "gguf"),
        ("lm-studio", "Other-4bit", "mlx"),
        ("ollama", "tiny:latest", "gguf"),
        ("ollama", "tiny:1b", "gguf"),
        ("ollama", "hf.co/bartowski/Foo-GGUF:Q4_K_M", "gguf"),
    }


def test_missing_stores_are_empty(tmp_path: Path) -> None:
    nowhere = ForeignLocations((tmp_path / "a",), (tmp_path / "b",), (tmp_path / "c",))
    assert scan(nowhere) == []
    assert ForeignLocations.default().hf_cache  # the real defaults resolve without error


def test_library_indexes_them_with_origin_and_without_copying(
    stores: Stores, lib: ModelLibrary
) -> None:
    added = lib.index_foreign(stores.locations)
    by_id = {m.id: m for m in lib.list()}
    assert {m.id for m in added} == set(by_id)
    assert set(by_id) == {
        "tiny-q4_k_m",
        "big-q8_0",
        "tiny-4bit",
        "tiny-q8_0",
        "other-4bit",
        "tiny:latest",
        "tiny:1b",
        "hf.co/bartowski/foo-gguf:q4_k_m",
    }
    hf = by_id["tiny-q4_k_m"]
    assert hf.origin == "huggingface-cache" and not hf.owned
    assert hf.path == str(stores.hf_gguf)  # the snapshot path, as found
    assert hf.extra["repo_id"] == "bartowski/Tiny-GGUF"
    assert by_id["tiny:latest"].origin == "ollama" and by_id["tiny:latest"].format == "gguf"
    assert by_id["tiny:latest"].path == str(stores.ollama_blob)
    assert by_id["tiny-q8_0"].origin == "lm-studio" and by_id["tiny-q8_0"].quantization == "Q8_0"
    assert by_id["tiny-4bit"].format == "mlx" and by_id["other-4bit"].origin == "lm-studio"
    assert by_id["big-q8_0"].size_bytes == sum(
        p.stat().st_size for p in stores.hf_gguf.parents[3].glob("models--acme--Big-GGUF/blobs/*")
    )
    assert not lib.models_dir.exists() or list(lib.models_dir.iterdir()) == []  # nothing copied
    assert lib.index_foreign(stores.locations) == []  # a rescan adds nothing new
    assert all(m.summary()["origin"] for m in lib.list())


def test_removing_never_deletes_another_apps_file_without_confirmation(
    stores: Stores, lib: ModelLibrary
) -> None:
    lib.index_foreign(stores.locations)
    for mid in ("tiny-q4_k_m", "tiny-q8_0", "tiny:latest"):
        _, deleted = lib.remove(mid)
        assert not deleted
    assert stores.hf_gguf.is_symlink() and stores.hf_blob.is_file()
    assert stores.lms_gguf.is_file() and stores.ollama_blob.is_file()
    assert (stores.ollama_manifests / "registry.ollama.ai/library/tiny/latest").is_file()
    # the user removed them from Hearth: a rescan does not bring them back
    lib.index_foreign(stores.locations)
    ids = {m.id for m in lib.list()}
    assert not ids & {"tiny-q4_k_m", "tiny-q8_0", "tiny:latest"}


def test_confirmed_delete_removes_their_files(stores: Stores, lib: ModelLibrary) -> None:
    lib.index_foreign(stores.locations)
    _, deleted = lib.remove("tiny-q4_k_m", delete_file=True)
    assert deleted and not stores.hf_gguf.is_symlink() and not stores.hf_blob.exists()
    _, deleted = lib.remove("tiny-q8_0", delete_file=True)
    assert deleted and not stores.lms_gguf.exists()
    # Ollama: the manifest goes; the blob stays while another tag uses it
    _, deleted = lib.remove("tiny:latest", delete_file=True)
    assert (
        deleted
        and not (stores.ollama_manifests / "registry.ollama.ai/library/tiny/latest").exists()
    )
    assert stores.ollama_blob.exists()
    lib.remove("tiny:1b", delete_file=True)
    assert stores.ollama_blob.exists()  # hf.co/... still uses it
    lib.remove("hf.co/bartowski/foo-gguf:q4_k_m", delete_file=True)
    assert not stores.ollama_blob.exists()


def test_files_deleted_by_their_app_drop_out_on_rescan(stores: Stores, lib: ModelLibrary) -> None:
    lib.index_foreign(stores.locations)
    stores.lms_gguf.unlink()
    (stores.ollama_manifests / "registry.ollama.ai/library/tiny/1b").unlink()  # `ollama rm`
    lib.index_foreign(stores.locations)
    ids = {m.id for m in lib.list()}
    assert "tiny-q8_0" not in ids and "tiny:1b" not in ids and "tiny:latest" in ids


def test_hearth_own_models_are_untouched_by_a_scan(
    stores: Stores, lib: ModelLibrary, tmp_path: Path
) -> None:
    own = lib.models_dir / "mine-Q4_K_M.gguf"
    own.parent.mkdir(parents=True)
    own.write_bytes(gguf_bytes(tmp_path / "b2", name="mine"))
    assert [m.id for m in lib.list()] == ["mine-q4_k_m"]
    lib.index_foreign(stores.locations)
    mine = lib.get("mine-q4_k_m")
    assert mine.owned and mine.origin == "downloaded"
    _, deleted = lib.remove("mine-q4_k_m")
    assert deleted and not own.exists()


async def test_service_scan_publishes_library_changed(stores: Stores, lib: ModelLibrary) -> None:
    from app.core.events import EventHub, LibraryChanged
    from app.core.service import assemble
    from app.core.types import LoadOptions

    events = EventHub()
    seen: list[object] = []
    events.subscribe(seen.append)
    service = assemble(lib, {}, load_defaults=LoadOptions, events=events, foreign=stores.locations)
    added = await service.models.scan_foreign()
    assert len(added) == 8 and any(isinstance(e, LibraryChanged) for e in seen)
    model, deleted = await service.models.remove("tiny:1b")
    assert model.origin == "ollama" and not deleted and stores.ollama_blob.exists()
    await service.close()


def test_faster_whispers_own_downloads_in_the_hf_cache_are_speech_models(
    tmp_path: Path, lib: ModelLibrary
) -> None:
    hf = tmp_path / "hf" / "hub"
    files = {
        "config.json": b'{"lang_ids": [1, 2]}',
        "model.bin": b"\x01" * 2000,
        "vocabulary.txt": b"a\nb\n",
        "README.md": b"# faster-whisper-tiny\n",
    }
    tiny = hf / "models--Systran--faster-whisper-tiny"
    for name, data in files.items():
        _hf_file(tiny, "abc123", name, data)
    (tiny / "refs").mkdir()
    (tiny / "refs" / "main").write_text("abc123")
    # a snapshot whose weights point outside its repo's blobs is not taken
    evil = hf / "models--evil--faster-whisper-base"
    for name, data in files.items():
        if name != "model.bin":
            _hf_file(evil, "def456", name, data)
    outside = tmp_path / "elsewhere.bin"
    outside.write_bytes(b"\x01" * 10)
    (evil / "snapshots" / "def456" / "model.bin").symlink_to(outside)
    where = ForeignLocations(hf_cache=(hf,), lm_studio=(), ollama=())
    found = [(f.origin, f.name, f.format) for f in scan(where)]
    assert found == [("huggingface-cache", "faster-whisper-tiny", "whisper")]
    [m] = lib.index_foreign(where)
    assert m.format == "whisper" and m.origin == "huggingface-cache" and not m.owned
    assert m.capabilities == ("transcription", "translation")
    assert m.extra["repo_id"] == "Systran/faster-whisper-tiny"
