"""Whisper (CTranslate2) repos on the fake Hub: a search for them lists them as format
"whisper", a repo's view offers its folder as one option ("ct2") with size and fit, and a
CTranslate2 repo that is not speech recognition is not taken for Whisper."""

from __future__ import annotations

import json

import pytest

from app.core.hub import HubClient
from app.core.hub.catalog import RepoInfo, assess
from app.core.hub.downloads import PullPlan
from app.core.library.fit import DeviceMemory
from app.core.library.formats import RepoFile
from app.core.library.formats.whisper_folder import WORKING_MIN
from app.errors import RepoRefused
from tests.support.fakehub import FakeFile, FakeHub

GiB = 1 << 30
BIG_MACHINE = DeviceMemory(64 * GiB, 48 * GiB)
SMALL_MACHINE = DeviceMemory(512 << 20, 8 << 20)
SPEECH_TAGS = ["ctranslate2", "audio", "automatic-speech-recognition", "en", "license:mit"]
WEIGHTS = 300_000


def whisper_files() -> dict[str, bytes | FakeFile]:
    """The files of a faster-whisper-* repo (model.bin's bytes are no real model here)."""
    cfg = {"alignment_heads": [[1, 0]], "lang_ids": [50259, 50260], "suppress_ids": [1]}
    return {
        "config.json": json.dumps(cfg).encode(),
        "model.bin": b"\x01" * WEIGHTS,
        "tokenizer.json": b'{"version": "1.0"}',
        "vocabulary.txt": b"a\nb\n",
        "preprocessor_config.json": b'{"feature_size": 80}',
        "README.md": b"# faster-whisper\n",
        ".gitattributes": b"*.bin filter=lfs\n",
        "logo.png": b"\x89PNG....",
    }


@pytest.fixture
def repos(fake_hub: FakeHub) -> FakeHub:
    fake_hub.add_repo(
        "Systran/faster-whisper-tiny",
        whisper_files(),
        tags=SPEECH_TAGS,
        library_name="ctranslate2",
        downloads=900,
    )
    # CTranslate2 converts LLMs into the same layout: not a speech model
    fake_hub.add_repo(
        "acme/whisperish-llm-ct2",
        {
            "config.json": b'{"bos_token": "<s>"}',
            "model.bin": b"\x01" * 1000,
            "vocabulary.json": b"[]",
        },
        tags=["ctranslate2", "text-generation"],
        library_name="ctranslate2",
        downloads=5,
    )
    return fake_hub


def client(hub: FakeHub, memory: DeviceMemory = BIG_MACHINE) -> HubClient:
    return HubClient(endpoint=hub.endpoint, memory_probe=lambda: memory)


async def test_a_search_for_whisper_lists_the_speech_repos(repos: FakeHub) -> None:
    c = client(repos)
    found = await c.search("whisper", format="whisper")
    assert [m.id for m in found] == ["Systran/faster-whisper-tiny"]
    assert found[0].format == "whisper" and found[0].as_dict()["format"] == "whisper"
    # any format: the CTranslate2 LLM is listed, but not as Whisper
    every = {m.id: m.format for m in await c.search("whisper", format=None)}
    assert every == {"Systran/faster-whisper-tiny": "whisper", "acme/whisperish-llm-ct2": None}


async def test_the_repo_offers_its_folder_with_size_and_fit(repos: FakeHub) -> None:
    info = await client(repos).repo("Systran/faster-whisper-tiny")
    assert info.format == "whisper" and info.refused is None
    [opt] = info.options
    names = sorted(f.path for f in opt.files)
    assert opt.name == "ct2" and opt.format == "whisper"
    # the folder faster-whisper reads; the README, image and .gitattributes stay behind
    assert names == [
        "config.json",
        "model.bin",
        "preprocessor_config.json",
        "tokenizer.json",
        "vocabulary.txt",
    ]
    files = repos.repos["Systran/faster-whisper-tiny"].files
    assert opt.size_bytes == sum(len(files[n].data) for n in names)
    assert opt.fit in ("fits-gpu", "fits-ram")
    assert opt.estimate is not None and opt.estimate.total == WEIGHTS + WORKING_MIN
    d = info.as_dict()
    assert d["format"] == "whisper" and d["options"][0]["memory_bytes"] == WEIGHTS + WORKING_MIN
    small = await client(repos, SMALL_MACHINE).repo("Systran/faster-whisper-tiny")
    assert small.options[0].fit == "too-large"


async def test_a_ct2_repo_that_is_no_speech_model_is_refused(repos: FakeHub) -> None:
    info = await client(repos).repo("acme/whisperish-llm-ct2")
    assert info.format is None and info.options == () and info.refused


def test_weights_outside_lfs_cannot_be_verified() -> None:
    files = [
        RepoFile("config.json", 10, None, "a" * 40),
        RepoFile("model.bin", 1000, None, "b" * 40),  # no sha256: not in LFS
        RepoFile("tokenizer.json", 10, None, "c" * 40),
    ]
    fmt, options, refused, _ = assess(files, tags=SPEECH_TAGS, library_name="ctranslate2")
    assert fmt == "whisper" and refused is None
    info = RepoInfo(
        id="a/b",
        revision="r",
        author="a",
        format=fmt,
        gated=False,
        private=False,
        license=None,
        downloads=0,
        likes=0,
        last_modified=None,
        created_at=None,
        tags=(),
        library_name=None,
        files=tuple(files),
        options=tuple(options),
        refused=None,
        url="",
    )
    with pytest.raises(RepoRefused, match="not in LFS"):
        PullPlan.of(info, options[0])
