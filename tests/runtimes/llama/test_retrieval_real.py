"""Files answered from the right chunk, on real models: the shared MiniLM embedder
picks the chunk of a long text file and the page of a PDF that hold a fact, the prompt holds
it, and SmolLM2 answers from it. Both files are too big to go in whole at the context used."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.core.library.index import ModelLibrary
from app.core.requests import ChatRequest
from app.core.service import Hearth, assemble
from app.core.types import ChatMessage, LoadOptions, SamplingParams
from app.core.util.loop import LoopThread
from app.core.workspace.attachments import Attachment, read_attachment
from app.core.workspace.chunking import chunk_attachment
from app.core.workspace.retrieval import Prepared, Retriever
from app.core.workspace.vector_cache import VectorCache
from app.runtimes.llama.runtime import LlamaCppRuntime
from tests.support import probes
from tests.support.pdf_files import write_pdf

pytestmark = pytest.mark.model

CONTEXT = 768  # SmolLM2's context here: neither file fits it whole
MAX_TOKENS = 16
FILLER = ("calm.", "ok.", "quiet.", "fine.", "same.")  # short lines: few chunks to embed
FACT_LINE = 1337
FACT = "The vault password is tangerine."
PDF_PAGES = {
    1: "Budget. The finance team reviewed quarterly spending on office supplies and travel. "
    "Invoices must be approved by a manager before payment. ",
    2: "Computers. Laptops get security updates every month. Passwords for email accounts "
    "must be changed each year and never shared. ",
    3: "Events. The annual company picnic will be held at Willow Creek Park in June, with "
    "games, food and music for every family. ",
    4: "Parking. Staff cars park in the north lot. Visitors use the marked spaces by the main "
    "entrance and register at the front desk. ",
}


@dataclass
class Rig:
    loop: LoopThread
    service: Hearth
    chat: str
    embedder: str
    cache_dir: Path

    def call(self, coro, timeout: float = 300):  # type: ignore[no-untyped-def]
        return self.loop.call(coro, timeout)


@pytest.fixture(scope="module")
def rig(
    tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path, embedding_gguf: Path
) -> Iterator[Rig]:
    tmp = tmp_path_factory.mktemp("retrieval")
    lib = ModelLibrary(tmp / "library.json", tmp / "models")
    rt = LlamaCppRuntime(probe_file=probes.shared())
    service = assemble(lib, {"gguf": rt}, load_defaults=lambda: LoadOptions(context_length=2048))
    chat, _ = service.models.import_path(smollm2_path)
    embedder, _ = service.models.import_path(embedding_gguf)
    loop = LoopThread("test-retrieval").start()
    r = Rig(loop, service, chat.id, embedder.id, tmp / "vectors")
    r.call(service.models.load(chat.id, {"context_length": CONTEXT}))
    try:
        yield r
    finally:
        try:
            loop.call(service.close(), 60)
        finally:
            loop.stop()


@pytest.fixture(scope="module")
def long_text(tmp_path_factory: pytest.TempPathFactory) -> Attachment:
    lines = [f"{FILLER[i % len(FILLER)]}" for i in range(2000)]
    lines[FACT_LINE] = FACT
    p = tmp_path_factory.mktemp("files") / "logbook.txt"
    p.write_text("\n".join(lines) + "\n")
    return read_attachment(p)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Attachment:
    # each page's topic sentence, repeated into a full page of wrapped lines
    pages = []
    for n in sorted(PDF_PAGES):
        words = (PDF_PAGES[n] * 8).split()
        pages.append([" ".join(words[i : i + 14]) for i in range(0, len(words), 14)])
    return read_attachment(write_pdf(tmp_path_factory.mktemp("pdf") / "handbook.pdf", pages))


def ask(rig: Rig, question: str, files: list[Attachment], retriever: Retriever) -> Prepared:
    msgs = [ChatMessage("system", "Answer from the files."), ChatMessage("user", question)]
    return rig.call(retriever.prepare(rig.chat, msgs, files, max_tokens=MAX_TOKENS))


def answer(rig: Rig, p: Prepared) -> tuple[str, str]:
    async def run() -> tuple[str, str]:
        req = ChatRequest(
            rig.chat, p.messages, sampling=SamplingParams(temperature=0.0), max_tokens=MAX_TOKENS
        )
        gen = (await rig.service.chat(req)).first
        text, reason = "", ""
        async for d in gen:
            text += d.text
            reason = d.finish_reason or reason
        return text, reason

    return rig.call(run())


def test_the_long_text_file_is_answered_from_the_chunk_with_the_fact(
    rig: Rig, long_text: Attachment
) -> None:
    r = Retriever(rig.service, cache=VectorCache(rig.cache_dir))
    p = ask(rig, "What is the vault password?", [long_text], r)
    assert not p.whole and p.embedding_model == rig.embedder  # the library's embedder, found
    best = max(p.used, key=lambda u: u.score)
    assert FACT in best.chunk.text, f"the best chunk is {best.chunk.label}"
    assert best.chunk.page is None and best.chunk.label.startswith("logbook.txt chunk ")
    assert FACT in p.messages[-1].content  # the prompt holds it, labelled
    assert f"=== {best.chunk.label} ===" in p.messages[-1].content
    assert p.messages[-1].content.endswith("What is the vault password?")
    n_chunks = r.embedded_chunks
    assert n_chunks == len(chunk_attachment(long_text)) > 5  # every chunk embedded, once
    assert p.notice().startswith("Used: ") and best.chunk.label in p.notice()
    assert {"file": "logbook.txt", "chunk": best.chunk.index, "page": None} | {
        "score": round(best.score, 4)
    } in p.extras()["chunks_used"]
    assert p.extras()["attachments"][0] == {
        "name": "logbook.txt",
        "kind": "text",
        "chars": long_text.chars,
        "whole": False,
    }
    n = rig.call(rig.service.count_tokens(ChatRequest(rig.chat, p.messages)))
    assert n + MAX_TOKENS <= CONTEXT  # what went in fits, answer reserve and all

    text, reason = answer(rig, p)
    assert reason in ("stop", "length") and text.strip()
    assert "tangerine" in text.lower()  # greedy, the fact in the prompt: it held on our CPUs

    # asked again: the file's vectors come from memory; a new retriever reads them from disk
    again = ask(rig, "What is the vault password?", [long_text], r)
    assert r.embedded_chunks == n_chunks and again.used == p.used
    fresh = Retriever(rig.service, cache=VectorCache(rig.cache_dir))
    labels = [u.chunk.label for u in p.used]
    from_disk = ask(rig, "What is the vault password?", [long_text], fresh)
    assert [u.chunk.label for u in from_disk.used] == labels  # float32 on disk: same order
    assert fresh.embedded_chunks == 0 and fresh.cache.disk_reads == 1


def test_the_pdf_is_answered_from_the_page_with_the_fact(rig: Rig, report: Attachment) -> None:
    assert [pg.number for pg in report.pages] == [1, 2, 3, 4]
    r = Retriever(rig.service, embedding_setting=lambda: rig.embedder)  # chat.embedding_model
    p = ask(rig, "Where will the annual company picnic be held?", [report], r)
    assert not p.whole
    best = max(p.used, key=lambda u: u.score)
    assert best.chunk.page == 3 and best.chunk.label == "handbook.pdf p.3"
    assert "Willow Creek Park" in p.messages[-1].content
    assert "=== handbook.pdf p.3 ===" in p.messages[-1].content
    assert "handbook.pdf p.3" in p.notice()
    assert len(p.used) < len(report.pages)  # retrieved, not everything

    text, reason = answer(rig, p)
    assert reason in ("stop", "length") and text.strip()
    assert "willow creek" in text.lower()
