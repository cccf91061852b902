"""What ``auto`` routing looks at in each kind of request.
Tested by tests/core/gateway/test_gateway.py and tests/server/gateway/test_gateway.py."""

from __future__ import annotations

from app.core.gateway.auto import RequestFacts
from app.core.requests import ChatRequest, CompletionRequest, EmbeddingRequest


def chat_facts(req: ChatRequest) -> RequestFacts:
    """What ``auto`` routing looks at in a chat request."""
    needs = []
    if req.tools and req.tool_choice.mode != "none":
        needs.append("tools")
    if req.constraint is not None and req.constraint.kind == "json_schema":
        needs.append("json_schema")
    if any(m.images or m.image_sources for m in req.messages):
        needs.append("vision")
    text = "\n".join(m.content for m in req.messages)
    last_user = next((m.content for m in reversed(req.messages) if m.role == "user"), "")
    return RequestFacts(tuple(needs), text, last_user)


def completion_facts(req: CompletionRequest) -> RequestFacts:
    needs = ("json_schema",) if req.constraint and req.constraint.kind == "json_schema" else ()
    if req.infill is not None:  # fill-in-the-middle: a model with FIM tokens
        needs = (*needs, "fim")
    text = "\n".join(p for p in req.prompts if isinstance(p, str))
    ids = sum(len(p) for p in req.prompts if not isinstance(p, str))
    return RequestFacts(needs, text, text, ids)


def embed_facts(req: EmbeddingRequest) -> RequestFacts:
    text = "\n".join(i for i in req.inputs if isinstance(i, str))
    ids = sum(len(i) for i in req.inputs if not isinstance(i, str))
    return RequestFacts(("embeddings",), text, text, ids)
