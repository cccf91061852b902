"""The tokenizer routes, llama.cpp's and vLLM's shapes side by side: POST /tokenize, POST
/detokenize, GET and POST /tokenizer_info. Local models only (a remote model is a 400); a
request naming no model gets the service's implied one (``default_model``, the only loaded
model, the only chat model). Wire shapes: app/server/protocols/openai/tokenizer.py.
Tested by tests/server/clients/test_tokenizer_routes.py and tests/server/clients/test_openai.py.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from aiohttp import web

from app.core.service import Hearth
from app.server.edge.body import large_json_response, read_json_body
from app.server.protocols import OPENAI
from app.server.protocols.openai import tokenizer as wire
from app.server.routes import ProtocolRoutes
from app.server.state import REQUEST_LOG, SERVICE, context_of

routes = ProtocolRoutes(OPENAI)


@routes.post("/tokenize")
async def tokenize(request: web.Request) -> web.Response:
    service: Hearth = request.app[SERVICE]
    ask = wire.parse_tokenize(await read_json_body(request))
    ctx = context_of(request)
    request[REQUEST_LOG]["model"] = ask.model
    tokens: list[int] = []
    if ask.chat is not None:
        # the prompt chat completions would submit, through the same template path
        tokens = await service.prompt_tokens(replace(ask.chat, context=ctx))
    async with service.using(ask.model, ctx) as lm:
        if ask.chat is None:
            tokens = await asyncio.to_thread(
                lm.tokenize, ask.text, add_special=ask.add_special, parse_special=ask.parse_special
            )
        pieces = None
        if ask.with_pieces or ask.return_token_strs:
            wire.check_pieces(
                len(tokens), "with_pieces" if ask.with_pieces else "return_token_strs"
            )
            pieces = await asyncio.to_thread(lm.token_pieces, tokens)
        return web.json_response(wire.tokenize_response(ask, tokens, pieces, lm.context_length))


@routes.post("/detokenize")
async def detokenize(request: web.Request) -> web.Response:
    service: Hearth = request.app[SERVICE]
    model, tokens = wire.parse_detokenize(await read_json_body(request))
    async with service.using(model, context_of(request)) as lm:
        wire.check_ids(lm, tokens)
        text = await asyncio.to_thread(lm.detokenize, tokens)
    return web.json_response(wire.detokenize_response(text))


@routes.get("/tokenizer_info")
@routes.post("/tokenizer_info")
async def tokenizer_info(request: web.Request) -> web.Response:
    service: Hearth = request.app[SERVICE]
    body = (
        await read_json_body(request)
        if request.method == "POST" and request.can_read_body
        else None
    )
    model, want_vocab = wire.parse_info_query(dict(request.query), body)
    async with service.using(model, context_of(request)) as lm:
        vocab = None
        if want_vocab:
            n = int(lm.special_tokens.get("n_vocab") or 0)
            wire.check_pieces(n, "vocab")
            vocab = await asyncio.to_thread(lm.token_pieces, list(range(n)))
        body_out = wire.tokenizer_info(lm, lm.model_id, vocab)
    return await large_json_response(body_out)
