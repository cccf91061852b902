"""The request pipeline reads who a request runs for from the request itself: its context's
model patterns decide what the gateway may resolve, its charger is paid before any work, and the
engine writes the wait for the model back onto it. Two requests in one task never see each
other's context (nothing lives in a context variable)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.core.gateway import AliasStore
from app.core.library.index import ModelLibrary
from app.core.requests import ChatRequest, EmbeddingRequest, RequestContext
from app.core.service import Hearth, assemble
from app.core.types import ChatMessage, LoadOptions, SamplingParams
from app.errors import ModelNotFound, RateLimited
from tests.support.fakes import FakeRuntime
from tests.support.gguf_files import CHATML, write_model

HI = (ChatMessage("user", "hi"),)


def rig(tmp_path: Path, runtime: FakeRuntime) -> tuple[Hearth, str]:
    lib = ModelLibrary(tmp_path / "lib.json", tmp_path / "models")
    lib.import_path(write_model(tmp_path / "src" / "m.gguf", chat_template=CHATML))
    (model,) = lib.list()
    aliases = AliasStore(tmp_path / "aliases.json")
    hearth = assemble(lib, {"gguf": runtime}, load_defaults=LoadOptions, aliases=aliases)
    hearth.routing.set_alias("friendly", [model.id])
    return hearth, model.id


async def text(hearth: Hearth, req: ChatRequest) -> str:
    choices = await hearth.chat(req)
    return "".join([d.text async for d in choices.first])


async def test_the_scope_travels_on_the_request_and_only_there(tmp_path: Path) -> None:
    hearth, model = rig(tmp_path, FakeRuntime(delay=0.0))
    try:
        scoped = RequestContext(models=("other-*",))
        for name in ("friendly", model):  # an alias whose target is out of scope, and the id
            with pytest.raises(ModelNotFound):
                await hearth.chat(ChatRequest(name, HI, SamplingParams(0.0), context=scoped))
        assert hearth.models.loaded() == []  # nothing was loaded for the refused requests
        # the next request in the same task carries no scope: it is answered
        assert await text(hearth, ChatRequest("friendly", HI, SamplingParams(0.0)))
        assert hearth.routing.aliases(("other-*",)) == {}
        assert hearth.routing.aliases() == {"friendly": (model,)}
    finally:
        await hearth.close()


async def test_the_charge_is_paid_before_any_work(tmp_path: Path) -> None:
    runtime = FakeRuntime(delay=0.0)
    hearth, model = rig(tmp_path, runtime)
    charged: list[object] = []

    def refuse(cost: object) -> None:
        charged.append(cost)
        raise RateLimited("no tokens left")

    try:
        with pytest.raises(RateLimited):
            await hearth.chat(ChatRequest(model, HI, context=RequestContext(charge=refuse)))
        with pytest.raises(RateLimited):
            await hearth.embed(
                EmbeddingRequest(model, ("x",), context=RequestContext(charge=refuse))
            )
        assert len(charged) == 2 and runtime.calls == 0  # refused before a load was started
    finally:
        await hearth.close()


async def test_the_engine_writes_the_wait_for_the_model_onto_the_context(tmp_path: Path) -> None:
    hearth, model = rig(tmp_path, FakeRuntime(delay=0.0))
    try:
        first, second = RequestContext(), RequestContext()
        assert await text(hearth, ChatRequest("friendly", HI, context=first))  # a JIT load
        assert first.load_ms is not None and first.load_started_ns is not None
        assert second.load_ms is None  # another request's context is untouched
        assert await text(hearth, ChatRequest(model, HI, context=second))
        assert second.load_ms is not None
    finally:
        await hearth.close()
