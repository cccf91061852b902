"""Reranking's pure parts: the request's bounds, and scores ordered into an answer (a
cross-encoder's scores, or the cosine of an embedder's vectors)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from app.core.requests import MAX_RERANK_DOCUMENTS, Ranked, Reranking, RerankRequest
from app.core.types import LoadedModel
from app.errors import ContextLengthExceeded, InvalidRequest

PAIR_FRAMING = 4  # at most BOS, EOS, SEP, EOS around a query and a document


def check(req: RerankRequest) -> None:
    """Refuse what no model can rank: an empty query, no documents, too many, an empty one."""
    if not req.query:
        raise InvalidRequest("'query' must be a non-empty string", param="query")
    if not req.documents:
        raise InvalidRequest("'documents' must hold at least one document", param="documents")
    if len(req.documents) > MAX_RERANK_DOCUMENTS:
        raise InvalidRequest(
            f"at most {MAX_RERANK_DOCUMENTS} documents per request "
            f"(this one has {len(req.documents)})",
            param="documents",
        )
    for i, d in enumerate(req.documents):
        if not d:
            raise InvalidRequest("a document is empty", param=f"documents[{i}]")
    if req.top_n is not None and req.top_n < 1:
        raise InvalidRequest("'top_n' must be at least 1", param="top_n")


def check_model(lm: LoadedModel, model_id: str) -> None:
    """A model that reranks: a cross-encoder or an embedder (remote ones: providers/serve)."""
    if "rerank" not in lm.capabilities:
        raise InvalidRequest(
            f"'{model_id}' is a chat/completion model; it cannot rerank (use a reranker / "
            f"cross-encoder GGUF, or an embedding model)",
            param="model",
        )


def ordered(scores: Sequence[float], top_n: int | None, prompt_tokens: int) -> Reranking:
    """The documents best first (ties keep the request's order), ``top_n`` of them."""
    ranked = sorted(
        (Ranked(i, float(s)) for i, s in enumerate(scores)), key=lambda r: (-r.score, r.index)
    )
    return Reranking(ranked[:top_n] if top_n is not None else ranked, prompt_tokens)


def by_cosine(
    query: Sequence[float], documents: Sequence[Sequence[float]], top_n: int | None, tokens: int
) -> Reranking:
    """Rank by the cosine of each document's vector with the query's (the embed path gives
    L2-normalized vectors; they are normalized again here so any vector ranks the same)."""
    qn = _norm(query)
    scores = [
        sum(a * b for a, b in zip(query, d, strict=True)) / (qn * _norm(d) or 1.0)
        for d in documents
    ]
    return ordered(scores, top_n, tokens)


async def cross_encode(
    lm: LoadedModel, req: RerankRequest, tokenize: Callable[[str, str], Awaitable[list[int]]]
) -> Reranking:
    """Score each (query, document) pair with a cross-encoder (rank pooling). ``tokenize``:
    text and its param name to tokens without special tokens (the runtime frames the pair)."""
    query = await tokenize(req.query, "query")
    docs = []
    for i, d in enumerate(req.documents):
        toks = await tokenize(d, f"documents[{i}]")
        if len(query) + len(toks) + PAIR_FRAMING > lm.context_length:
            raise ContextLengthExceeded(
                f"the query and document {i} take {len(query) + len(toks)} tokens; this model "
                f"takes at most {lm.context_length - PAIR_FRAMING} a pair",
                param=f"documents[{i}]",
            )
        docs.append(toks)
    scores, tokens = await lm.rank(query, docs)
    return ordered(scores, req.top_n, tokens)


def _norm(v: Sequence[float]) -> float:
    return float(sum(x * x for x in v) ** 0.5)
