"""One answer on the Chat page, on the loop thread: load the model if needed, put the attached
files in, stream the text and reasoning out, and return the final delta.
Tested by tests/gui/views/chat/test_images.py and tests/gui/views/chat/test_session.py."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from app.core.inference.generation import Generation
from app.core.requests import ChatRequest
from app.core.service import Hearth
from app.core.types import ChatMessage, Constraint, Delta, SamplingParams
from app.gui.views.chat.attachments import Prepare


class AnswerTurn:
    """One answer in flight. Lives on the loop thread: ``cancel`` is scheduled there, so it and
    the streaming coroutine never race."""

    def __init__(self) -> None:
        self.cancelled = False
        self.generation: Generation | None = None

    def cancel(self) -> None:
        self.cancelled = True
        if self.generation is not None:
            self.generation.cancel()


async def stream_answer(
    service: Hearth,
    turn: AnswerTurn,
    emit: Callable[[str], None],
    model_id: str,
    messages: Sequence[ChatMessage],
    sampling: SamplingParams,
    max_tokens: int | None,
    emit_reasoning: Callable[[str], None] | None = None,
    on_cpu_busy: Callable[[], None] | None = None,
    prepare: Prepare | None = None,
    *,
    stop: tuple[str, ...] = (),
    constraint: Constraint | None = None,
) -> Delta:
    """Load the model if needed and stream the answer's text to ``emit`` (and the model's
    reasoning, ``<think>`` or harmony analysis, to ``emit_reasoning``); return the final delta
    (finish reason, usage, timings). ``on_cpu_busy`` is called once, at the first delta decoded
    with fewer threads because other programs keep the CPU busy. ``prepare`` puts the attached
    files into the messages once the model is loaded (its context and tokenizer known).
    ``stop`` and ``constraint`` (a JSON schema) go on the request as they are."""
    if not service.routing.is_routable(model_id):  # a remote model (PREFIX/id) is not loaded here
        await service.models.load(model_id)  # explicit: chatting works with on-demand loading off
    if prepare is not None:  # attachments: app/gui/views/chat/attachments.py
        messages = await prepare(messages)
    if turn.cancelled:
        return Delta(finish_reason="cancelled")
    req = ChatRequest(
        model_id,
        tuple(messages),
        sampling=sampling,
        max_tokens=max_tokens,
        stop=stop,
        constraint=constraint,
    )
    gen = (await service.chat(req)).first
    turn.generation = gen
    if turn.cancelled:
        gen.cancel()
    final: Delta | None = None
    busy_said = False
    try:
        async for d in gen:
            if d.cpu_busy and not busy_said and on_cpu_busy is not None:
                busy_said = True
                on_cpu_busy()
            if d.reasoning and emit_reasoning is not None:
                emit_reasoning(d.reasoning)
            if d.text:
                emit(d.text)
            if d.finish_reason is not None:
                final = d
    finally:
        gen.cancel()  # a no-op after a normal end; frees the slot if we left early
    if final is None:
        if turn.cancelled:
            return Delta(finish_reason="cancelled")
        return Delta(finish_reason="error", error="the answer ended without a final delta")
    return final
