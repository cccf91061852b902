"""A sampled token reaches the client before the engine decodes it (the step that computes the
next one): a first token used to wait in the worker's outbox for the second one's decode, which
added a whole decode step to every request's time to first token. The decode steps are held by a
gate the test opens one at a time, so the test does not depend on the machine's speed."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from app.core.library.index import ModelLibrary
from app.core.service import assemble
from app.core.types import ChatMessage, LoadOptions, SamplingParams
from app.runtimes.llama.runtime import LlamaCppRuntime
from tests.support import probes
from tests.support.service_calls import chat

pytestmark = pytest.mark.model

TOKENS = 6


async def test_each_token_is_sent_before_the_next_decode(
    tmp_path: Path, smollm2_path: Path
) -> None:
    lib = ModelLibrary(tmp_path / "library.json", tmp_path / "models")
    rt = LlamaCppRuntime(probe_file=probes.shared())
    h = assemble(lib, {"gguf": rt}, load_defaults=lambda: LoadOptions(context_length=1024))
    model, _ = h.models.import_path(smollm2_path)
    permits = threading.Semaphore(0)  # one decode step per permit
    try:
        lm = await h.models.load(model.id)
        engine = lm.engine  # type: ignore[attr-defined]
        decode_step = engine._decode_step

        def gated(*args: Any) -> int:
            assert permits.acquire(timeout=120), "the test never let this decode run"
            return decode_step(*args)

        engine._decode_step = gated
        gen = await chat(
            h,
            model.id,
            [ChatMessage("user", "Count from one to twenty in words.")],
            sampling=SamplingParams(temperature=0),
            max_tokens=TOKENS,
            logprobs=1,  # every token is a delta, even one whose text is held back
        )
        it = gen.__aiter__()
        got = 0
        while got < TOKENS:
            # the decode that would compute the next token has not run: this one was sent first
            d = await asyncio.wait_for(it.__anext__(), timeout=60)
            got += d.token_count
            if d.finish_reason:
                break
            permits.release()
        assert got >= 2, "the answer ended before a second token"
    finally:
        permits.release(100)
        await h.close()
