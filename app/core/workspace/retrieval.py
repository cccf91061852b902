"""Attached files into a chat's prompt: whole when they fit, else the chunks most
like the question, found with a local embedding model.

The budget rule: the files go in whole when the conversation with them, as the model's
template renders it, plus a reserve for the answer fits the model's context (the loaded
context, or the one it would load with). The reserve is ``max_tokens`` when the chat sets one
(at most half the context), else a quarter of the context (at most :data:`DEFAULT_RESERVE_CAP`). Tokens are counted with
the model's tokenizer when it is loaded, else estimated (one per 3 characters, see
:func:`~app.core.workspace.chunking.estimate_tokens`). Otherwise each file is chunked, the chunks and
the question are embedded, and the top :data:`TOP_K` chunks by cosine that fit what the
conversation leaves go into the last user message, each labelled with its file and
chunk (or page).
Tested by tests/core/workspace/test_attachments.py and tests/runtimes/llama/test_retrieval_real.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from app.core.inference import prompt as prompting
from app.core.inference.rerank import by_cosine
from app.core.requests import ChatRequest, EmbeddingRequest
from app.core.service import Hearth
from app.core.types import ChatMessage
from app.core.workspace import chunking
from app.core.workspace.attachments import Attachment
from app.core.workspace.chunking import Chunk, chunk_attachment, estimate_tokens
from app.core.workspace.vector_cache import VectorCache, cache_key
from app.errors import ContextLengthExceeded, ModelNotFound, NoEmbeddingModel

log = logging.getLogger(__name__)

TOP_K = 6  # chunks per question at most
DEFAULT_RESERVE_CAP = 1024  # the answer's reserve when the chat sets no max_tokens
DEFAULT_REMOTE_CONTEXT = 8192  # a remote model whose engine does not say its context
EMBED_BATCH = 16  # chunks per embedding request (and per progress report)
MESSAGE_OVERHEAD = 8  # the template's tokens around one message, in the estimate
NO_EMBEDDER_FIX = (
    "Download an embedding model such as all-MiniLM-L6-v2 on the Discover page, or attach a "
    "smaller file."
)
WHOLE_HEADER = "Attached files:"
EXCERPTS_HEADER = "Excerpts from the attached files (the parts most relevant to this message):"


@dataclass(frozen=True, slots=True)
class UsedChunk:
    """A chunk that went into the prompt, and its cosine with the question."""

    chunk: Chunk
    score: float

    def as_extra(self) -> dict[str, Any]:
        c = self.chunk
        return {"file": c.file, "chunk": c.index, "page": c.page, "score": round(self.score, 4)}


@dataclass(frozen=True, slots=True)
class Prepared:
    """The messages to send, and what the files put in them."""

    messages: tuple[ChatMessage, ...]
    attachments: tuple[Attachment, ...] = ()
    whole: bool = True
    used: tuple[UsedChunk, ...] = ()
    embedding_model: str | None = None

    def extras(self) -> dict[str, Any]:
        """The user message's ``extras``: ``attachments`` and ``chunks_used``."""
        return {
            "attachments": [
                {"name": a.name, "kind": a.kind, "chars": a.chars, "whole": self.whole}
                for a in self.attachments
            ],
            "chunks_used": [u.as_extra() for u in self.used],
        }

    def notice(self) -> str:
        """What the message says of its files: ``Used: report.pdf p.3, notes.txt chunk 12``."""
        if not self.attachments:
            return ""
        if self.whole:
            return "Used in whole: " + ", ".join(a.name for a in self.attachments)
        labels = list(dict.fromkeys(u.chunk.label for u in self.used))  # pages: once each
        return "Used: " + ", ".join(labels)


def last_user_text(messages: Sequence[ChatMessage]) -> str:
    return next((m.content for m in reversed(messages) if m.role == "user"), "")


def with_files(messages: Sequence[ChatMessage], block: str) -> tuple[ChatMessage, ...]:
    """``messages`` with ``block`` put before the last user message's text."""
    out = list(messages)
    for i in reversed(range(len(out))):
        if out[i].role == "user":
            out[i] = replace(out[i], content=f"{block}\n\n{out[i].content}")
            break
    return tuple(out)


def whole_block(attachments: Sequence[Attachment]) -> str:
    parts = [WHOLE_HEADER] + [f"=== {a.name} ===\n{a.text().strip()}" for a in attachments]
    return "\n\n".join(parts)


def excerpt_block(chunks: Sequence[Chunk]) -> str:
    parts = [EXCERPTS_HEADER] + [f"=== {c.label} ===\n{c.text.strip()}" for c in chunks]
    return "\n\n".join(parts)


def answer_reserve(context: int, max_tokens: int | None) -> int:
    """The tokens kept free for the answer (see the module)."""
    if max_tokens:
        return min(max_tokens, context // 2)
    return min(DEFAULT_RESERVE_CAP, context // 4)


class Retriever:
    """Prepares a chat's messages with its attached files. Runs on the service loop.

    Args:
        service: the core façade (token counts, the library, the embed path).
        embedding_setting: ``chat.embedding_model`` as of now ("" = the library's first
            embedding model).
        cache: where chunk vectors are kept (a fresh in-memory one by default).
    """

    def __init__(
        self,
        service: Hearth,
        *,
        embedding_setting: Callable[[], str] = lambda: "",
        cache: VectorCache | None = None,
    ) -> None:
        self.service = service
        self.embedding_setting = embedding_setting
        self.cache = cache or VectorCache()
        self.embedded_chunks = 0  # chunks embedded (not found in the cache): the tests watch it

    # -- the model's side: its context and its tokens ------------------------------------------
    def context_of(self, model_id: str) -> int:
        """The model's context: loaded, else the one it would load with (a remote model's as
        its engine says, else :data:`DEFAULT_REMOTE_CONTEXT`)."""
        info = next((i for i in self.service.models.loaded() if i.model_id == model_id), None)
        if info is not None:
            return info.context_length
        listing = self.service.routing.remote_listing(model_id)
        if listing is not None:
            return listing.model.context_length or DEFAULT_REMOTE_CONTEXT
        return int(self.service.models.estimate(model_id)["context_length"])

    def _counters(
        self, model_id: str
    ) -> tuple[Callable[[Sequence[ChatMessage]], Awaitable[int]], Callable[[str], Awaitable[int]]]:
        """(tokens of a conversation as the template renders it, tokens of a text): the
        model's tokenizer when it is loaded here, else the estimate."""
        service = self.service
        if any(i.model_id == model_id for i in service.models.loaded()):

            async def conversation(messages: Sequence[ChatMessage]) -> int:
                return await service.count_tokens(ChatRequest(model_id, tuple(messages)))

            async def text(t: str) -> int:
                async with service.using(model_id) as lm:
                    toks = await prompting.tokenize(
                        lm, t, "file", parse_special=False, add_special=False
                    )
                return len(toks)

            return conversation, text

        async def estimate_conversation(messages: Sequence[ChatMessage]) -> int:
            return sum(estimate_tokens(m.content) + MESSAGE_OVERHEAD for m in messages)

        async def estimate_text(t: str) -> int:
            return estimate_tokens(t)

        return estimate_conversation, estimate_text

    # -- the embedding model -------------------------------------------------------------------
    def embedding_model(self) -> str | None:
        """``chat.embedding_model``, else the library's first embedding model (None: none)."""
        setting = self.embedding_setting().strip()
        if setting:
            return setting
        for s in self.service.models.all():
            rt = self.service.runtimes.get(s.model.format)
            if "embeddings" in s.model.capabilities and rt is not None and rt.available():
                return s.model.id
        return None

    def _identity(self, model_id: str) -> Any:
        try:
            m = self.service.models.get(model_id)
        except ModelNotFound:
            return model_id  # a remote or alias id: its name is all there is
        return [m.id, m.path, m.size_bytes, m.mtime]

    async def embed_texts(
        self, model_id: str, texts: Sequence[str], progress: Callable[[int], None] | None = None
    ) -> list[list[float]]:
        """One vector per text. A local model is loaded first (so chatting works with on-demand
        loading off) and each text cut to its context (a chunk over it is embedded by its
        first tokens). ``progress`` gets the count done after each batch."""
        inputs: list[str | tuple[int, ...]] = list(texts)
        try:
            self.service.models.get(model_id)
            local = True
        except ModelNotFound:
            local = False
        if local:
            if not any(i.model_id == model_id for i in self.service.models.loaded()):
                await self.service.models.load(model_id)
            async with self.service.using(model_id) as lm:
                limit = lm.context_length
                inputs = []
                for t in texts:
                    cut = t[: limit * max(1, lm.max_token_bytes)]  # what the tokenizer may take
                    toks = await prompting.tokenize(lm, cut, "file", parse_special=False)
                    inputs.append(tuple(toks[:limit]))
        out: list[list[float]] = []
        for i in range(0, len(inputs), EMBED_BATCH):
            emb = await self.service.embed(
                EmbeddingRequest(model_id, tuple(inputs[i : i + EMBED_BATCH]))
            )
            out.extend(emb.vectors)
            if progress is not None:
                progress(len(out))
        return out

    async def chunk_vectors(
        self,
        model_id: str,
        a: Attachment,
        chunks: Sequence[Chunk],
        progress: Callable[[str], None] | None = None,
    ) -> list[list[float]]:
        """The chunks' vectors: from the cache (memory, then disk), else embedded and kept
        (``progress`` hears how far the embedding is, for a status line)."""
        key = cache_key(
            self._identity(model_id),
            a.digest,
            chunking.VERSION,
            chunking.TARGET_TOKENS,
            chunking.OVERLAP_TOKENS,
        )
        hit = await asyncio.to_thread(self.cache.get, key)
        if hit is not None and len(hit) == len(chunks):
            return hit

        def said(done: int) -> None:
            if progress is not None:
                progress(f"Reading {a.name} with {model_id}: {done}/{len(chunks)} parts")

        said(0)
        vectors = await self.embed_texts(model_id, [c.text for c in chunks], said)
        self.embedded_chunks += len(chunks)
        await asyncio.to_thread(self.cache.put, key, vectors)
        return vectors

    # -- the plan ------------------------------------------------------------------------------
    async def prepare(
        self,
        model_id: str,
        messages: Sequence[ChatMessage],
        attachments: Sequence[Attachment],
        *,
        max_tokens: int | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> Prepared:
        """The messages to send with ``attachments`` (see the module for the rule).

        Raises:
            NoEmbeddingModel: the files do not fit and no embedding model is there;
            ContextLengthExceeded: the conversation leaves no room for any chunk.
        """
        files = tuple(attachments)
        if not files:
            return Prepared(tuple(messages))
        context = self.context_of(model_id)
        free = context - answer_reserve(context, max_tokens)
        count_conversation, count_text = self._counters(model_id)
        whole = with_files(messages, whole_block(files))
        try:
            n_whole = await count_conversation(whole)
        except ContextLengthExceeded:
            n_whole = None  # too long to tokenize within the context at all
        if n_whole is not None and n_whole <= free:
            return Prepared(whole, files, whole=True)

        base = await count_conversation(with_files(messages, excerpt_block([])))
        embedder = self.embedding_model()
        names = ", ".join(a.name for a in files)
        if embedder is None:
            raise NoEmbeddingModel(
                f"{names} {'does' if len(files) == 1 else 'do'} not fit the model's context "
                f"({context} tokens, {max(0, free - base)} of them free for files) and no "
                f"embedding model is installed to pick the relevant parts. {NO_EMBEDDER_FIX}",
                param="file",
            )
        chunks: list[Chunk] = []
        vectors: list[list[float]] = []
        for a in files:
            cs = chunk_attachment(a)
            chunks += cs
            vectors += await self.chunk_vectors(embedder, a, cs, progress)
        question = last_user_text(messages).strip() or names
        (qvec,) = await self.embed_texts(embedder, [question])
        ranked = by_cosine(qvec, vectors, None, 0).results

        budget = free - base
        chosen: list[UsedChunk] = []
        spent = 0
        for r in ranked[: TOP_K * 4]:  # further down, a chunk is hardly about the question
            if len(chosen) >= TOP_K:
                break
            c = chunks[r.index]
            cost = await count_text(f"=== {c.label} ===\n{c.text.strip()}\n\n")
            if spent + cost <= budget:
                chosen.append(UsedChunk(c, r.score))
                spent += cost
        order = {a.name: i for i, a in enumerate(files)}
        while chosen:
            used = tuple(sorted(chosen, key=lambda u: (order[u.chunk.file], u.chunk.index)))
            final = with_files(messages, excerpt_block([u.chunk for u in used]))
            if await count_conversation(final) <= free:  # the exact count, template and all
                log.info("attachments: %d chunks of %s (%s)", len(used), names, embedder)
                return Prepared(final, files, whole=False, used=used, embedding_model=embedder)
            chosen.pop()  # the lowest scoring one (chosen is best first)
        raise ContextLengthExceeded(
            f"the conversation leaves no room in the model's context ({context} tokens) for any "
            f"part of {names}; start a new chat, or load the model with a larger context",
            param="file",
        )


def vector_cache_folder(cache_root: Path) -> Path:
    """Where chunk vectors are kept under the app's cache folder."""
    return cache_root / "attachment-vectors"
