"""A chat request's preparation (template render and tokenization) before it is queued: off the
event loop in one hand-over, and reported in the request's ``timings.prepare_ms``."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any, cast

import pytest

from app.core.library.index import ModelLibrary
from app.core.service import Hearth, assemble
from app.core.types import ChatMessage, LoadOptions, Runtime
from app.errors import ContextLengthExceeded
from tests.support.fakes import FakeModel, FakeRuntime
from tests.support.gguf_files import write_model
from tests.support.service_calls import chat


@pytest.fixture
def service(tmp_path: Path) -> Hearth:
    lib = ModelLibrary(tmp_path / "library.json", tmp_path / "models")
    rt = cast(Runtime, FakeRuntime(delay=0.0))
    return assemble(lib, {"gguf": rt}, load_defaults=lambda: LoadOptions(context_length=256))


async def test_render_and_tokenize_share_one_thread_off_the_loop(
    service: Hearth, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, _ = service.models.import_path(write_model(tmp_path / "Tiny-Q8_0.gguf"))
    await service.models.load(model.id)
    loop_thread = threading.get_ident()
    handed: list[str] = []
    tokenized_on: list[int] = []
    real_to_thread, real_tokenize = asyncio.to_thread, FakeModel.tokenize

    async def to_thread(fn: Any, /, *args: Any, **kw: Any) -> Any:
        handed.append(getattr(fn, "__name__", repr(fn)))
        return await real_to_thread(fn, *args, **kw)

    def tokenize(self: FakeModel, text: str, **kw: Any) -> list[int]:
        tokenized_on.append(threading.get_ident())
        return real_tokenize(self, text, **kw)

    monkeypatch.setattr(asyncio, "to_thread", to_thread)
    monkeypatch.setattr(FakeModel, "tokenize", tokenize)
    gen = await chat(service, model.id, [ChatMessage("user", "Hi")], max_tokens=3)
    final = [d async for d in gen][-1]
    # before the request was queued: one hand-over, where the template rendered and the
    # prompt was tokenized (the loop never tokenizes a prompt)
    assert handed[:1] == ["render"] and "tokenize" not in handed, handed
    assert tokenized_on and loop_thread not in tokenized_on
    assert final.timings is not None and final.timings.prepare_ms > 0

    # a rendered prompt too long for the context is refused there, before any tokenizing
    tokenized_on.clear()
    with pytest.raises(ContextLengthExceeded):
        await chat(service, model.id, [ChatMessage("user", "x" * 100_000)], max_tokens=3)
    assert not tokenized_on
