"""A running generation: its deltas (think text and tool calls split out), cancel, and
``collect()`` into one :class:`Completion`."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace

from app.core.inference.reasoning import HarmonySplitter, ReasoningSplitter
from app.core.inference.scoring import LedStream
from app.core.inference.tools import ParseEvent, ToolCallParser
from app.core.types import (
    Delta,
    GenerationStream,
    PromptToken,
    TokenLogprob,
    ToolCall,
    ToolCallDelta,
    ToolParseIssue,
    Usage,
)

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Completion:
    """A whole generation: its text, think text, tool calls, logprobs and final delta."""

    text: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt: tuple[PromptToken, ...] = ()  # the prompt's tokens scored (echo, prompt_logprobs)
    final: Delta = field(
        default_factory=lambda: Delta(finish_reason="error", error="no final delta")
    )

    def add(self, d: Delta) -> None:
        """Fold one delta in (tool-call fragments joined per index)."""
        if d.text:
            self.text += d.text
        if d.reasoning:
            self.reasoning += d.reasoning
        self.logprobs.extend(d.logprobs)
        if d.prompt:
            self.prompt = d.prompt
        for tc in d.tool_calls:
            while len(self.tool_calls) <= tc.index:
                self.tool_calls.append(ToolCall("", "", ""))
            c = self.tool_calls[tc.index]
            self.tool_calls[tc.index] = ToolCall(
                tc.id if tc.id is not None else c.id,
                tc.name if tc.name is not None else c.name,
                c.arguments + tc.arguments,
            )
        if d.finish_reason is not None:
            self.final = d
            issue = d.tool_parse
            if issue is not None and issue.index is not None and issue.index < len(self.tool_calls):
                # streamed as a call before it broke; whole, it is only the text it was
                del self.tool_calls[issue.index]


class Generation:
    """A running generation: prompt size known, deltas to iterate, cancellable."""

    def __init__(
        self,
        model_id: str,
        prompt_tokens: int,
        stream: GenerationStream,
        reasoning: ReasoningSplitter | HarmonySplitter | None = None,
        tools: ToolCallParser | None = None,
    ) -> None:
        self.model_id = model_id
        self.prompt_tokens = prompt_tokens
        self._stream = stream
        self._reasoning = reasoning
        self._tools = tools

    def lead(self, first: Delta) -> None:
        """Send ``first`` (the prompt scored, the echoed text) ahead of the generated deltas."""
        self._stream = LedStream(first, self._stream)

    def __aiter__(self) -> AsyncIterator[Delta]:
        if self._reasoning is None and self._tools is None:
            return self._stream.__aiter__()
        return self._split()

    async def _split(self) -> AsyncIterator[Delta]:
        """Moves ``<think>`` text to ``Delta.reasoning`` (counting its tokens) and tool-call
        blocks to ``Delta.tool_calls``. Text outside calls after the first call is dropped; once
        the parser's last allowed call is closed (or, for a forced call, a call repeats an
        earlier one), the runtime is stopped and the generation ends there with finish_reason
        "tool_calls". A call that broke (see :class:`ToolCallParser`) ends the calls the same
        way; its text is content on the final delta, whose ``tool_parse`` says why."""
        splitter, parser = self._reasoning, self._tools
        reasoning_tokens = completion_tokens = 0
        deltas = aiter(self._stream)  # one iterator: the tail is drained from it after a stop
        async for d in deltas:
            completion_tokens += d.token_count
            final = d.finish_reason is not None
            r, a = "", d.text
            if splitter is not None:
                r, a = splitter.feed(d.text)
                if final:
                    r2, a2 = splitter.flush()
                    r, a = r + r2, a + a2
                elif r or splitter.inside:
                    reasoning_tokens += d.token_count
            calls: tuple[ToolCallDelta, ...] = ()
            broken = ""
            if parser is not None:
                ev = _parse(parser, a, final)
                a, broken = ev.text, ev.broken
                calls = tuple(ToolCallDelta(c.index, c.id, c.name) for c in ev.started) + tuple(
                    ToolCallDelta(i, arguments=frag) for i, frag in ev.arguments if frag
                )
                if parser.exhausted and not final:
                    # the last allowed call is out: stop the runtime, and take the usage it
                    # counted (cached tokens, timings) from its final delta when it sends one
                    self._stream.cancel()
                    end = await _drain(deltas)
                    # the answer's tokens are those up to the call's close: the runtime may have
                    # made another before it saw the cancel (a race, not part of the answer)
                    counted = Usage(self.prompt_tokens, completion_tokens)
                    if end is not None and end.usage is not None:
                        counted = replace(end.usage, completion_tokens=completion_tokens)
                    d = replace(
                        d,
                        finish_reason="tool_calls" if _whole_calls(parser) else "stop",
                        usage=counted,
                        timings=end.timings if end is not None else None,
                    )
                    final = True
            if final:
                usage = d.usage
                if usage is not None:
                    usage = replace(usage, reasoning_tokens=reasoning_tokens)
                reason = d.finish_reason
                issue = None
                if parser is not None and _whole_calls(parser):
                    # a call cut by max_tokens stays "length": the answer is not whole
                    cut = parser.broken == "incomplete"
                    if reason == "stop" or parser.exhausted and reason == "length" and not cut:
                        reason = "tool_calls"
                if parser is not None and parser.broken is not None:
                    issue = ToolParseIssue(parser.broken, parser.broken_index)
                yield replace(
                    d,
                    text=a + broken,
                    reasoning=r,
                    usage=usage,
                    tool_calls=calls,
                    finish_reason=reason,
                    tool_parse=issue,
                )
                return
            if r or a or d.logprobs or calls or d.prompt:
                yield replace(d, text=a, reasoning=r, tool_calls=calls)

    def cancel(self) -> None:
        self._stream.cancel()

    async def collect(self) -> Completion:
        """Run to the end: the whole :class:`Completion`."""
        out = Completion(
            final=Delta(finish_reason="error", error="generation ended without a final delta")
        )
        try:
            async for d in self:
                out.add(d)
        finally:
            self.cancel()  # no-op when finished; frees the slot if we were cancelled
        return out


def _parse(parser: ToolCallParser, text: str, final: bool) -> ParseEvent:
    """Feed ``text`` (and flush at the end); text after the first call is not content."""
    ev = parser.feed(text)
    if final:
        tail = parser.flush()
        ev.text += tail.text
        ev.trailing += tail.trailing
        ev.started += tail.started
        ev.arguments += tail.arguments
        ev.broken += tail.broken
    if ev.trailing:
        log.debug("dropped %d characters of text after tool calls", len(ev.trailing))
    return ev


def _whole_calls(parser: ToolCallParser) -> bool:
    """Whether the answer has a call that was finished correctly."""
    return len(parser.calls) > (parser.broken_index is not None)


async def _drain(deltas: AsyncIterator[Delta]) -> Delta | None:
    """Read a stopped stream to its end: its final delta (usage, timings), or None."""
    async for d in deltas:
        if d.finish_reason is not None:
            return d
    return None


class Choices:
    """The generations of one request, in order (``n`` choices; prompts x ``n`` for raw
    completions). Those in ``started`` run already (their errors were raised before any
    output); the rest start one by one when :meth:`get` asks, through ``start``."""

    def __init__(
        self,
        started: list[Generation],
        count: int | None = None,
        start: Callable[[int], Awaitable[Generation]] | None = None,
    ) -> None:
        self._gens: list[Generation] = list(started)
        # the model that answered and the ids the gateway tried for it, in order
        self.model = started[0].model_id if started else ""
        self.route: list[str] = [self.model] if self.model else []
        self.count = len(started) if count is None else count
        self._start = start
        self.cache: str | None = None  # the response cache's result: hit|semantic|miss|bypass

    @property
    def first(self) -> Generation:
        return self._gens[0]

    @property
    def started(self) -> list[Generation]:
        return list(self._gens)

    async def get(self, i: int) -> Generation:
        """Choice ``i`` (started now if it was not yet; choices start in order)."""
        while len(self._gens) <= i:
            if self._start is None:
                raise IndexError(i)
            self._gens.append(await self._start(len(self._gens)))
        return self._gens[i]

    def cancel(self) -> None:
        for g in self._gens:
            g.cancel()
