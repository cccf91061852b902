"""POST /v1/rerank (and /rerank), the shape llama.cpp's server, Jina and Cohere share:
``{model, query, documents: [str | {text}], top_n, return_documents}`` -> ``{results: [{index,
relevance_score, document?}], usage}``, best first. Parse and render only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.core.requests import MAX_RERANK_DOCUMENTS, Reranking, RerankRequest
from app.errors import InvalidRequest
from app.server.protocols.common import Body, parse_ttl
from app.server.protocols.openai.parse import model_field


@dataclass(frozen=True, slots=True)
class ParsedRerank:
    request: RerankRequest
    return_documents: bool


def parse_documents(raw: Any) -> tuple[str, ...]:
    """Strings, or objects with a ``text`` string; at most 200 (checked before any is read)."""
    if not isinstance(raw, list) or not raw:
        raise InvalidRequest("'documents' must be a non-empty array", param="documents")
    if len(raw) > MAX_RERANK_DOCUMENTS:
        raise InvalidRequest(
            f"at most {MAX_RERANK_DOCUMENTS} documents per request (this one has {len(raw)})",
            param="documents",
        )
    out = []
    for i, d in enumerate(raw):
        text = d.get("text") if isinstance(d, dict) else d
        if not isinstance(text, str):
            raise InvalidRequest(
                "a document must be a string or an object with a 'text' string",
                param=f"documents[{i}]",
            )
        out.append(text)
    return tuple(out)


def parse_request(data: dict[str, Any]) -> ParsedRerank:
    b = Body(data)
    model = model_field(b)
    query = b.text("query", required=True) or ""
    req = RerankRequest(
        model=model,
        query=query,
        documents=parse_documents(b.data.get("documents")),
        top_n=b.integer("top_n", None, lo=1, hi=1 << 20),
        ttl=parse_ttl(b),
    )
    return ParsedRerank(req, b.flag("return_documents"))


def rerank_response(parsed: ParsedRerank, result: Reranking) -> dict[str, Any]:
    docs = parsed.request.documents
    results: list[dict[str, Any]] = []
    for r in result.results:
        item: dict[str, Any] = {"index": r.index, "relevance_score": r.score}
        if parsed.return_documents:
            item["document"] = {"text": docs[r.index]}
        results.append(item)
    n = result.prompt_tokens
    return {
        "object": "list",
        "model": parsed.request.model,
        "results": results,
        "usage": {"prompt_tokens": n, "total_tokens": n},
    }
