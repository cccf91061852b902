"""A remote engine's streamed answer: its SSE lines read into deltas, bounded (line size,
answer size, idle time) and cut at the request's ``max_tokens``; :class:`RemoteStream` is what
:class:`~app.runtimes.remote.client.RemoteEngine` hands back for a streaming request.
Tested by tests/runtimes/remote/test_hostile.py and tests/server/gateway/test_remote_bounds.py."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any, Protocol

import aiohttp

from app.core.gateway.providers.store import ProviderConfig
from app.core.types import Delta
from app.errors import ProviderError
from app.runtimes.remote import codec, kinds

log = logging.getLogger(__name__)

MAX_LINE = 16 * 1024 * 1024  # one SSE line (a long tool call's arguments in one chunk)
MAX_BODY = 64 * 1024 * 1024  # a whole answer, streamed or not (2,048 embeddings of 4,096 floats)


class StreamOwner(Protocol):
    """What a stream needs of the engine that opened it."""

    cfg: ProviderConfig

    def redact(self, text: str) -> str: ...

    def stream_opened(self) -> None: ...

    def stream_closed(self) -> None: ...


class RemoteStream:
    """A remote generation's deltas (a GenerationStream). Idle longer than the provider's
    idle timeout, a dropped connection, an error event, a malformed line or an answer over
    MAX_BODY end it with an error delta; an engine that writes past the request's
    ``max_tokens`` is cut there (finish reason ``length``). Either way the connection closes."""

    def __init__(self, engine: StreamOwner, chat: bool, *, max_tokens: int | None = None) -> None:
        self._engine = engine
        self._max_tokens = max_tokens
        self._read = 0  # bytes of the answer so far
        self._reader = codec.ChunkReader(chat=chat)
        self._resp: aiohttp.ClientResponse | None = None
        self._pending: list[Delta] = []
        self._buf = bytearray()
        self._done = False
        self._ended: Delta | None = None  # the final delta, once known
        self._cancelled = False
        self.prompt_tokens = 0

    @classmethod
    def replay(cls, engine: StreamOwner, chat: bool, whole: Any) -> RemoteStream:
        """A stream of a whole (not streamed) answer: its content as one delta, then the end."""
        s = cls(engine, chat)
        choices = whole.get("choices") if isinstance(whole, dict) else None
        c = (
            choices[0]
            if isinstance(choices, list) and choices and isinstance(choices[0], dict)
            else {}
        )
        if chat:
            msg = c.get("message") if isinstance(c.get("message"), dict) else {}
            chunk = {"choices": [{"delta": msg, "logprobs": c.get("logprobs")}]}
        else:
            chunk = {"choices": [{"text": c.get("text")}]}
        s._take(chunk)
        s._reader.feed({"choices": [{"finish_reason": c.get("finish_reason") or "stop"}],
                        "usage": whole.get("usage") if isinstance(whole, dict) else None})  # fmt: skip
        s._ended = s._reader.final(0)
        return s

    def attach(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp
        self._engine.stream_opened()

    async def first(self) -> None:
        """Read until the first token (or the end): what :meth:`RemoteEngine._stream` waits."""
        while not self._reader.started and self._ended is None:
            try:
                ev = await self._event(None)
            except aiohttp.ClientPayloadError:  # the body was cut before its end
                ev = None
            except _BadStream as e:
                raise ProviderError(
                    f"provider '{self._engine.cfg.name}' sent {e}",
                    provider=self._engine.cfg.name,
                    status=502,
                ) from e
            if ev is None:  # nothing at all came: ask again without streaming, to hear why
                raise _EmptyStream(
                    f"provider '{self._engine.cfg.name}' ended the stream before its first token",
                    provider=self._engine.cfg.name,
                    status=502,
                )
            self._take(ev, first=True)

    def _take(self, ev: Any, *, first: bool = False) -> None:
        err = kinds.stream_error(ev)
        if err is not None:
            msg = f"provider '{self._engine.cfg.name}': {self._engine.redact(err)}"
            if first and not self._pending:
                status = codec.status_in(ev)
                raise ProviderError(msg, provider=self._engine.cfg.name, status=status)
            self._ended = Delta(finish_reason="error", error=msg, error_code="provider_error")
            return
        try:
            d = self._reader.feed(ev)
        except (TypeError, ValueError, KeyError, AttributeError) as e:  # a malformed chunk
            if first and not self._pending:
                raise ProviderError(
                    f"provider '{self._engine.cfg.name}' sent a malformed chunk: {e}",
                    provider=self._engine.cfg.name,
                    status=502,
                ) from e
            self._ended = self._fail(f"a malformed chunk ({e})")
            return
        if d is None:
            return
        if self._max_tokens is not None and self._reader.pieces > self._max_tokens:
            # an engine ignoring max_tokens: what it asked for is the answer (the rest unread)
            self._reader.pieces -= 1
            self._reader.finish = "length"
            self._ended = self._reader.final(self.prompt_tokens)
            return
        self._pending.append(d)

    def _buffered_line(self) -> bytes | None:
        """The next line if the body read so far holds one whole (no wait, no timer)."""
        cut = self._buf.find(b"\n")
        if cut < 0:
            return None
        line = bytes(self._buf[: cut + 1])
        del self._buf[: cut + 1]
        return line

    async def _line(self) -> bytes:
        """The next line of the body (b"" at its end, or once cancelled), at most MAX_LINE."""
        while True:
            line = self._buffered_line()
            if line is not None:
                return line
            if len(self._buf) > MAX_LINE:
                raise _LineTooLong(f"a stream line over {MAX_LINE // 2**20} MiB")
            if self._resp is None:
                return b""
            chunk = await self._resp.content.readany()
            if not chunk:
                line, self._buf = bytes(self._buf), bytearray()
                return line
            self._read += len(chunk)
            if self._read > MAX_BODY:
                raise _BadStream(f"an answer over {MAX_BODY // 2**20} MiB (the answer bound)")
            self._buf += chunk

    async def _event(self, timeout: float | None) -> Any:
        """The next ``data:`` object; None at ``[DONE]`` or the end of the body."""
        while True:
            # an engine's chunk often holds several lines: only a wait for the network is timed
            line = self._buffered_line()
            if line is None and timeout:
                async with asyncio.timeout(timeout):  # a timer, not a task per line
                    line = await self._line()
            elif line is None:
                line = await self._line()
            if not line:
                return None
            text = line.decode(errors="replace").strip()
            if not text.startswith("data:"):
                continue
            data = self._engine.redact(text[5:].strip())
            if data == "[DONE]":
                self._done = True
                return None
            try:
                return codec.decode(data)
            except ValueError as e:  # one event lost would corrupt the answer: it ends here
                raise _BadStream(f"a malformed data line ({e})") from e

    def __aiter__(self) -> AsyncIterator[Delta]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Delta]:
        idle = self._engine.cfg.idle_timeout
        try:
            while True:
                while self._pending:
                    yield self._pending.pop(0)
                if self._ended is not None:
                    yield self._ended
                    return
                if self._cancelled:
                    yield Delta(finish_reason="cancelled")
                    return
                try:
                    ev = await self._event(idle)
                except TimeoutError:
                    if self._reader.finish is not None:  # done, the engine just kept it open
                        self._ended = self._reader.final(self.prompt_tokens)
                        continue
                    self._ended = self._fail(f"no data for {idle:g} s (the idle timeout)")
                    continue
                except _BadStream as e:
                    self._ended = self._fail(str(e))
                    continue
                except (aiohttp.ClientError, OSError) as e:
                    if self._cancelled:
                        continue
                    self._ended = self._fail(f"the connection failed: {e or type(e).__name__}")
                    continue
                if ev is None:
                    # [DONE] without a finish reason is a cut answer (llama_cpp.server sends
                    # one when another request interrupts it): an error, not a short answer
                    if self._reader.finish is not None:
                        self._ended = self._reader.final(self.prompt_tokens)
                    else:
                        self._ended = self._fail("the stream ended before the answer did")
                    continue
                self._take(ev)
        finally:
            self.cancel()

    def _fail(self, why: str) -> Delta:
        msg = f"provider '{self._engine.cfg.name}': {self._engine.redact(why)}"
        log.warning("%s", msg)
        return Delta(finish_reason="error", error=msg, error_code="provider_error")

    def cancel(self) -> None:
        """Stop: the connection is closed (the engine stops generating when it notices)."""
        if self._ended is None and not self._done:
            self._cancelled = True
        if self._resp is not None:
            with contextlib.suppress(Exception):
                self._resp.close()
            self._resp = None
            self._engine.stream_closed()


async def read_body(resp: aiohttp.ClientResponse, cap: int) -> tuple[bytes, bool]:
    """The body, to its end or ``cap`` bytes: (bytes, whether that was all of it)."""
    buf = bytearray()
    while len(buf) < cap:
        chunk = await resp.content.read(min(2**20, cap - len(buf)))
        if not chunk:
            return bytes(buf), True
        buf += chunk
    return bytes(buf), await resp.content.read(1) == b""


class _BadStream(Exception):
    """A stream no engine in good health sends: a malformed or too deep line, an answer over
    MAX_BODY (a hostile or broken engine)."""


class _LineTooLong(_BadStream):
    """A stream line over MAX_LINE."""


class _EmptyStream(ProviderError):
    """A stream that ended before any event (see RemoteEngine._whole)."""
