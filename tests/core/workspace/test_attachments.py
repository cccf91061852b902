"""Attachments, no model needed: files read into text (text, code, Markdown, PDF;
binary, encrypted and image-only refused), the chunker, the vector cache, and the budget rule
on a real service over the fake runtime (one token per character): a small file goes in
whole, a big one with no embedding model gives the message with the fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

import pytest

from app.core.library.index import ModelLibrary
from app.core.requests import ChatRequest
from app.core.service import Hearth, assemble
from app.core.types import ChatMessage, LoadOptions, Runtime
from app.core.workspace import attachments as att
from app.core.workspace.attachments import attachment_from_text, read_attachment
from app.core.workspace.chunking import CHARS_PER_TOKEN, TARGET_TOKENS, chunk_attachment, chunk_text
from app.core.workspace.retrieval import (
    NO_EMBEDDER_FIX,
    WHOLE_HEADER,
    Retriever,
    answer_reserve,
    with_files,
)
from app.core.workspace.vector_cache import VectorCache
from app.errors import NoEmbeddingModel, UnreadableAttachment
from tests.support.fakes import FakeRuntime
from tests.support.gguf_files import write_model
from tests.support.pdf_files import write_encrypted_pdf, write_pdf


# -- reading --------------------------------------------------------------------------------
def test_text_code_and_markdown_are_read_with_their_kind(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("one\r\ntwo\n", encoding="utf-8")
    (tmp_path / "main.py").write_text("print('hi')\n")
    (tmp_path / "README.md").write_bytes("\ufeff# Title\n\ncafé".encode())
    a = read_attachment(tmp_path / "notes.txt")
    assert (a.kind, a.text(), a.encoding) == ("text", "one\ntwo\n", "utf-8")
    assert read_attachment(tmp_path / "main.py").kind == "code"
    md = read_attachment(tmp_path / "README.md")
    assert md.kind == "markdown" and md.text() == "# Title\n\ncafé"  # the BOM dropped
    assert md.pages[0].number is None and len(md.digest) == 64


def test_a_legacy_encoding_falls_back_to_windows_1252(tmp_path: Path) -> None:
    (tmp_path / "old.txt").write_bytes("naïve café – ok".encode("cp1252"))
    a = read_attachment(tmp_path / "old.txt")
    assert a.encoding == "cp1252" and a.text() == "naïve café – ok"


def test_binary_files_are_refused_with_a_clear_message(tmp_path: Path) -> None:
    (tmp_path / "photo.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(200))
    with pytest.raises(UnreadableAttachment, match="photo.png is a binary file, not text"):
        read_attachment(tmp_path / "photo.png")
    (tmp_path / "ctl.txt").write_bytes(bytes(range(1, 32)) * 40)  # no NUL, all control bytes
    with pytest.raises(UnreadableAttachment, match="binary"):
        read_attachment(tmp_path / "ctl.txt")


def test_the_size_caps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    big = tmp_path / "big.txt"
    big.write_text("x" * 2000)
    monkeypatch.setattr(att, "MAX_FILE_BYTES", 1000)
    with pytest.raises(UnreadableAttachment, match="files of at most"):
        read_attachment(big)
    monkeypatch.setattr(att, "MAX_FILE_BYTES", 16 << 20)
    monkeypatch.setattr(att, "MAX_TEXT_CHARS", 1500)
    with pytest.raises(UnreadableAttachment, match="2,000 characters of text; at most 1,500"):
        read_attachment(big)
    with pytest.raises(UnreadableAttachment, match="is not a file"):
        read_attachment(tmp_path)


def test_a_pdf_is_read_per_page_with_page_numbers(tmp_path: Path) -> None:
    p = write_pdf(tmp_path / "report.pdf", [["First page (intro)"], [], ["Third page", "end"]])
    a = read_attachment(p)
    assert a.kind == "pdf"
    assert [(pg.number, pg.text) for pg in a.pages] == [
        (1, "First page (intro)"),
        (2, ""),
        (3, "Third page\nend"),
    ]
    assert "[page 3]\nThird page" in a.text() and "[page 2]" not in a.text()


def test_encrypted_damaged_and_image_only_pdfs_are_refused(tmp_path: Path) -> None:
    locked = write_encrypted_pdf(tmp_path / "locked.pdf", [["secret"]], "pw")
    with pytest.raises(UnreadableAttachment, match="encrypted \\(password-protected\\) PDF"):
        read_attachment(locked)
    # an empty user password is no protection: read
    open_ = write_encrypted_pdf(tmp_path / "open.pdf", [["readable"]], "")
    assert read_attachment(open_).pages[0].text == "readable"
    scan = write_pdf(tmp_path / "scan.pdf", [[], []])
    with pytest.raises(UnreadableAttachment, match="no text layer"):
        read_attachment(scan)
    (tmp_path / "broken.pdf").write_bytes(b"%PDF-1.4\nnot really")
    with pytest.raises(UnreadableAttachment, match="not a readable PDF"):
        read_attachment(tmp_path / "broken.pdf")


# -- chunking -------------------------------------------------------------------------------
def test_chunks_follow_paragraphs_overlap_and_keep_pages(tmp_path: Path) -> None:
    limit = TARGET_TOKENS * CHARS_PER_TOKEN
    lines = [f"Row {i}: nothing happened today." for i in range(600)]
    chunks = chunk_text("\n".join(lines))
    assert len(chunks) > 10 and all(len(c) <= limit for c in chunks)
    for a, b in zip(chunks, chunks[1:], strict=False):
        tail = a.split("\n")[-1]
        assert tail in b.split("\n") and not b.startswith(tail)  # it starts with a's last lines
    every = set("\n".join(chunks).split("\n"))
    assert every == set(lines)  # nothing lost
    # a heading starts a chunk and stays with its text
    md = "# A\n\n" + "alpha " * 150 + "\n\n## B\n\n" + "beta " * 150
    parts = chunk_text(md)
    assert parts[1].startswith("## B\n\nbeta")
    pdf = read_attachment(write_pdf(tmp_path / "r.pdf", [["p one"], ["p two"]]))
    got = [(c.index, c.page, c.text, c.label) for c in chunk_attachment(pdf)]
    assert got == [(1, 1, "p one", "r.pdf p.1"), (2, 2, "p two", "r.pdf p.2")]
    assert chunk_attachment(attachment_from_text("n.txt", "x"))[0].label == "n.txt chunk 1"


def test_vector_cache_keeps_vectors_in_memory_and_on_disk(tmp_path: Path) -> None:
    vectors = [[0.5, -1.0, 0.25], [1.0, 0.0, 2.0]]
    VectorCache(tmp_path).put("k", vectors)
    fresh = VectorCache(tmp_path)  # as after a restart
    assert fresh.get("k") == vectors and fresh.disk_reads == 1
    assert fresh.get("k") == vectors and fresh.disk_reads == 1  # then from memory
    (tmp_path / "k.vec").write_bytes(b"garbage")
    assert VectorCache(tmp_path).get("k") is None  # damaged: embedded again
    assert VectorCache().get("k") is None


# -- the budget rule on a real service (fake runtime: one token per character) ---------------
@pytest.fixture
def service(tmp_path: Path) -> Hearth:
    lib = ModelLibrary(tmp_path / "library.json", tmp_path / "models")
    rt = cast(Runtime, FakeRuntime(delay=0.0))
    return assemble(lib, {"gguf": rt}, load_defaults=lambda: LoadOptions(context_length=2048))


def test_answer_reserve() -> None:
    assert answer_reserve(4096, None) == 1024
    assert answer_reserve(2048, None) == 512
    assert answer_reserve(2048, 100) == 100
    assert answer_reserve(2048, 5000) == 1024  # an absurd max_tokens leaves half for the prompt


async def test_a_small_file_goes_in_whole_without_an_embedding_model(
    service: Hearth, tmp_path: Path
) -> None:
    model, _ = service.models.import_path(write_model(tmp_path / "Tiny-Q8_0.gguf"))
    await service.models.load(model.id)
    small = attachment_from_text("notes.txt", "The door code is 4711.")
    msgs = [ChatMessage("system", "Be brief."), ChatMessage("user", "What is the door code?")]
    r = Retriever(service)
    p = await r.prepare(model.id, msgs, [small], max_tokens=64)
    assert p.whole and p.used == () and r.embedded_chunks == 0
    assert p.messages[0] == msgs[0]
    assert p.messages[1].content == (
        f"{WHOLE_HEADER}\n\n=== notes.txt ===\nThe door code is 4711.\n\nWhat is the door code?"
    )
    assert p.notice() == "Used in whole: notes.txt"
    assert p.extras() == {
        "attachments": [{"name": "notes.txt", "kind": "text", "chars": 22, "whole": True}],
        "chunks_used": [],
    }
    # the rule counts the conversation the template renders: just over what is free -> not whole
    free = 2048 - 64
    n = await service.count_tokens(
        ChatRequest(model.id, with_files(msgs, f"{WHOLE_HEADER}\n\n=== big.txt ===\n"))
    )
    exact = attachment_from_text("big.txt", "y" * (free - n))
    assert (await r.prepare(model.id, msgs, [exact], max_tokens=64)).whole
    over = attachment_from_text("big.txt", "y" * (free - n + 1))
    with pytest.raises(NoEmbeddingModel):
        await r.prepare(model.id, msgs, [over], max_tokens=64)


async def test_a_big_file_and_no_embedding_model_gives_the_fix(
    service: Hearth, tmp_path: Path
) -> None:
    model, _ = service.models.import_path(write_model(tmp_path / "Tiny-Q8_0.gguf"))
    big = attachment_from_text("handbook.txt", "word " * 2000)
    msgs = [ChatMessage("user", "Summarize it.")]
    r = Retriever(service)
    # not loaded: the context it would load with, and the estimate (3 characters a token)
    with pytest.raises(NoEmbeddingModel) as e:
        await r.prepare(model.id, msgs, [big])
    assert service.models._scheduler.state(model.id) == "not-loaded"
    assert "handbook.txt does not fit the model's context (2048 tokens" in e.value.message
    assert e.value.message.endswith(NO_EMBEDDER_FIX)
    assert "all-MiniLM-L6-v2 on the Discover page, or attach a smaller file" in NO_EMBEDDER_FIX
    assert r.embedding_model() is None
    assert Retriever(service, embedding_setting=lambda: "my-embedder").embedding_model() == (
        "my-embedder"
    )


def test_the_chat_embedding_model_setting(tmp_path: Path) -> None:
    from app.errors import ConfigError
    from app.settings import SettingsStore, settings_from_dict

    assert settings_from_dict({}).chat.embedding_model == ""  # automatic
    s = settings_from_dict({"chat": {"embedding_model": "all-minilm-l6-v2-q8_0"}})
    assert s.chat.embedding_model == "all-minilm-l6-v2-q8_0"
    store = SettingsStore(tmp_path / "settings.json")
    store.save(s)
    assert SettingsStore(tmp_path / "settings.json").load().chat == s.chat
    written = json.loads((tmp_path / "settings.json").read_text())
    assert written["chat"]["embedding_model"] == "all-minilm-l6-v2-q8_0"
    for bad in ({"chat": {"embedding_model": 3}}, {"chat": []}):
        with pytest.raises(ConfigError):
            settings_from_dict(bad)
