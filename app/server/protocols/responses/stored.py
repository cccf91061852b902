"""Stored Responses on the wire (pure, no aiohttp): the entry a finished response leaves, the
``input_items`` list page, the deleted object, and the errors for an id the caller cannot see.

An id another key stored, one that expired or was deleted, and one that never existed all
answer the same (no existence leak): ``GET``/``DELETE`` 404 ``not_found``; a continuation 400
``previous_response_not_found`` with ``param`` ``previous_response_id``, as OpenAI answers it.
Tested by tests/server/protocols/responses/test_stored.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from app.core.gateway.response_store import ResponseStorage, StoredResponse
from app.errors import InvalidRequest, NotFound
from app.server.protocols.common import Body
from app.server.protocols.responses.parse import previous_response_id

MAX_LIMIT = 100  # input_items' page size: 1-100, default 20 (OpenAI's)
ORDERS = ("asc", "desc")


class PreviousResponseNotFound(InvalidRequest):
    code = "previous_response_not_found"


class ResponseNotFound(NotFound):
    type = "invalid_request_error"


def previous_not_found(response_id: str) -> PreviousResponseNotFound:
    return PreviousResponseNotFound(
        f"Previous response with id '{response_id}' not found.", param="previous_response_id"
    )


def not_found(response_id: str) -> ResponseNotFound:
    return ResponseNotFound(f"Response with id '{response_id}' not found.")


def find(store: ResponseStorage | None, partition: str, response_id: str) -> StoredResponse:
    """The response ``partition`` kept as ``response_id``.

    Raises:
        ResponseNotFound: none such for this caller (404).
    """
    found = store.get(partition, response_id) if store is not None else None
    if found is None:
        raise not_found(response_id)
    return found


def history(store: ResponseStorage | None, partition: str, body: dict[str, Any]) -> list[Any]:
    """The conversation a request continues (``previous_response_id``): the kept response's
    input and output items; ``[]`` when it continues none.

    Raises:
        PreviousResponseNotFound: the caller kept no such response (400).
    """
    prev_id = previous_response_id(body)
    if prev_id is None:
        return []
    prev = store.get(partition, prev_id) if store is not None else None
    if prev is None:
        raise previous_not_found(prev_id)
    return prev.conversation


def entry(
    response: dict[str, Any], history: Sequence[dict[str, Any]], items: Sequence[dict[str, Any]]
) -> StoredResponse:
    """What a finished response keeps: the conversation it continued, then its own input."""
    return StoredResponse(response["id"], response, [*history, *items])


def deleted(response_id: str) -> dict[str, Any]:
    return {"id": response_id, "object": "response", "deleted": True}


def reject_stream(query: dict[str, str]) -> None:
    """A stored response is read whole: ``stream=true`` (replaying its events) is refused."""
    if query.get("stream", "false").lower() not in ("false", "0", ""):
        raise InvalidRequest(
            "a stored response cannot be streamed again: leave 'stream' out", param="stream"
        )


def input_items_page(stored: StoredResponse, query: dict[str, str]) -> dict[str, Any]:
    """OpenAI's list of a response's input items: ``limit`` (1-100, default 20), ``order``
    (asc | desc, default desc), ``after`` / ``before`` (an item id the page starts after or
    ends before). ``include`` changes nothing: the items are kept whole."""
    b = Body(dict(query))
    raw_limit = query.get("limit")
    try:
        limit = int(raw_limit) if raw_limit is not None else 20
    except ValueError:
        raise InvalidRequest("'limit' must be an integer", param="limit") from None
    if not 1 <= limit <= MAX_LIMIT:
        raise InvalidRequest(f"'limit' must be 1-{MAX_LIMIT}", param="limit")
    order = b.text("order") or "desc"
    if order not in ORDERS:
        raise InvalidRequest("'order' must be asc or desc", param="order")
    items = list(stored.input) if order == "asc" else list(reversed(stored.input))
    ids = [str(i.get("id")) for i in items]
    for name in ("after", "before"):
        cursor = b.text(name)
        if cursor is None:
            continue
        if cursor not in ids:
            raise InvalidRequest(f"no input item with id '{cursor}'", param=name)
        at = ids.index(cursor)
        items, ids = (items[at + 1 :], ids[at + 1 :]) if name == "after" else (items[:at], ids[:at])
    page = items[:limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0].get("id") if page else None,
        "last_id": page[-1].get("id") if page else None,
        "has_more": len(items) > limit,
    }
