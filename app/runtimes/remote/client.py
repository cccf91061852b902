"""One provider's engine over HTTP (aiohttp's client): probing, and the internal requests sent
as OpenAI requests. Errors before any output are raised as ProviderUnavailable/ProviderTimeout
(retryable) or ProviderError (the engine's own answer, translated); a stream that fails later
ends with an error delta. The API key goes in the Authorization header only and is redacted
from every message built from an engine's answer."""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiohttp

from app.core.gateway import telemetry
from app.core.gateway.providers.base import Answer, Probe
from app.core.gateway.providers.store import ProviderConfig
from app.core.requests import (
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    RerankRequest,
    TranscriptionRequest,
)
from app.core.types import TranscriptSegment
from app.errors import NotSupported, ProviderError, ProviderTimeout, ProviderUnavailable
from app.runtimes.remote import codec, kinds, speech
from app.runtimes.remote import stream as answers
from app.runtimes.remote.stream import RemoteStream, _EmptyStream, read_body

log = logging.getLogger(__name__)

Headers = dict[str, str] | None  # a request's trace context (``traceparent``), sent upstream

T = TypeVar("T")
MAX_ERROR_BODY = 64 * 1024  # what is read of an error answer
MAX_PROBE_BODY = 4 * 1024 * 1024  # a model list, /props, /api/show...
PROBE_TIMEOUT_S = 10.0
KEEPALIVE_S = 2.0


class RemoteEngine:
    """The client of one provider (lives on the service loop; one session, reused)."""

    def __init__(self, cfg: ProviderConfig, api_key: str | None, *, kind: str | None = None):
        self.cfg = cfg
        self.kind = kind or cfg.kind
        self._key = api_key or None
        self._session: aiohttp.ClientSession | None = None
        self._json_object_schema = False  # the engine's dialect for a schema response format
        self._open = 0  # streams running on this client
        self._idle = asyncio.Event()
        self._idle.set()
        self.base = cfg.url.rstrip("/")
        self.root = kinds.root_of(self.base)

    # -- plumbing -------------------------------------------------------------------------------
    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                # an idle connection is dropped before servers drop theirs (uvicorn after 5 s),
                # so a request never goes out on a connection the engine already closed
                connector=aiohttp.TCPConnector(keepalive_timeout=KEEPALIVE_S),
                timeout=aiohttp.ClientTimeout(
                    total=None, sock_connect=self.cfg.connect_timeout, connect=None
                ),
                headers={"Authorization": f"Bearer {self._key}"} if self._key else None,
                read_bufsize=2**16,  # header sizes keep aiohttp's bounds (8 KiB a line)
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def close_when_idle(self, limit_s: float = 3600.0) -> None:
        """Close once the streams still running on this client have ended (a provider changed
        or removed under them finishes what it was answering), or after ``limit_s``."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._idle.wait(), limit_s)
        await self.close()

    def stream_opened(self) -> None:
        self._open += 1
        self._idle.clear()

    def stream_closed(self) -> None:
        self._open = max(0, self._open - 1)
        if not self._open:
            self._idle.set()

    @property
    def _follow(self) -> bool:
        return self.cfg.follow_redirects

    def redact(self, text: str) -> str:
        """``text`` with the API key (should an engine echo it) replaced."""
        return text.replace(self._key, "***") if self._key else text

    def _unavailable(self, e: BaseException) -> ProviderUnavailable:
        what = self.redact(str(e) or type(e).__name__)
        return ProviderUnavailable(
            f"provider '{self.cfg.name}' is unreachable: {what}", provider=self.cfg.name
        )

    def parse(self, raw: bytes) -> Any:
        """A body as JSON (else its text), the key redacted first: before any clipping, so no
        part of it can survive one."""
        text = self.redact(raw.decode(errors="replace"))
        try:
            return codec.decode(text)
        except ValueError:  # not JSON (or too deep to be read as JSON): the caller says so
            return text

    async def _error(self, resp: aiohttp.ClientResponse) -> ProviderError:
        if 300 <= resp.status < 400:  # not followed (see ProviderConfig.follow_redirects)
            where = self.redact(resp.headers.get("Location", "")[:500]) or "nowhere"
            return ProviderError(
                f"provider '{self.cfg.name}' answered a redirect ({resp.status} to {where}); "
                "redirects are not followed unless the provider allows them (--follow-redirects)",
                provider=self.cfg.name,
                status=502,
            )
        raw, _ = await read_body(resp, MAX_ERROR_BODY)
        msg = kinds.error_message(resp.status, self.parse(raw))
        return ProviderError(
            f"provider '{self.cfg.name}' answered {resp.status}: {msg}",
            provider=self.cfg.name,
            status=resp.status,
            upstream_retry_after=retry_after(resp.headers.get("Retry-After")),
        )

    def _url(self, path: str) -> str:
        """``models``-style names are under the base URL, "/..." paths under the root."""
        return f"{self.root}{path}" if path.startswith("/") else f"{self.base}/{path}"

    async def _json(
        self, method: str, path: str, body: Any, timeout: float, headers: Headers = None
    ) -> Any:
        """One whole request (``headers``: the request's trace, continued upstream); the JSON
        answer or a translated error."""

        async def once() -> Any:
            async with self._http().request(
                method, self._url(path), json=body, headers=headers, allow_redirects=self._follow
            ) as resp:
                if resp.status != 200:
                    raise await self._error(resp)
                raw, whole = await read_body(resp, answers.MAX_BODY)
            if not whole:
                raise self._bad_answer(path, f"a body under {answers.MAX_BODY // 2**20} MiB")
            out = self.parse(raw)
            if isinstance(out, str):
                raise self._bad_answer(path, "JSON")
            return out

        async def go() -> Any:
            try:
                return await once()
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
                # a pooled connection the engine had closed (uvicorn closes one after a
                # failed stream): the request never reached it; once more, on a new one
                return await once()

        return await self._guard(go(), timeout)

    async def _guard(self, aw: Awaitable[T], timeout: float) -> T:
        try:
            async with asyncio.timeout(timeout):  # on this task: no task per request
                return await aw
        except aiohttp.ConnectionTimeoutError as e:  # before TimeoutError: it is one too
            raise ProviderTimeout(
                f"provider '{self.cfg.name}' could not be connected to within "
                f"{self.cfg.connect_timeout:g} s (its connect timeout)",
                provider=self.cfg.name,
            ) from e
        except TimeoutError as e:
            raise ProviderTimeout(
                f"provider '{self.cfg.name}' did not answer within {timeout:g} s",
                provider=self.cfg.name,
            ) from e
        except (aiohttp.ClientError, OSError, ValueError) as e:
            raise self._unavailable(e) from e

    # -- probing --------------------------------------------------------------------------------
    async def _get(
        self, path: str, method: str = "GET", body: Any = None, timeout: float | None = None
    ) -> Answer:
        limit = (
            timeout if timeout is not None else min(PROBE_TIMEOUT_S, self.cfg.connect_timeout + 5)
        )
        try:
            async with asyncio.timeout(limit):
                async with self._http().request(
                    method, self._url(path), json=body, allow_redirects=self._follow
                ) as resp:
                    raw, _ = await read_body(resp, MAX_PROBE_BODY)
        except (TimeoutError, aiohttp.ClientError, OSError) as e:
            return Answer(0, self.redact(str(e) or type(e).__name__))
        out = self.parse(raw)
        return Answer(resp.status, out[:2000] if isinstance(out, str) else out)

    async def probe(self, *, detect: bool = False) -> Probe:
        """Health and model list (and the kind, when ``detect``): never raises."""
        t0 = time.monotonic()
        paths = kinds.DETECT_PATHS if detect else kinds.probe_paths(self.kind)
        got = await asyncio.gather(*(self._get(p) for p in paths))
        answers = dict(zip(paths, got, strict=True))
        latency = (time.monotonic() - t0) * 1000
        kind = kinds.detect(answers) if detect else self.kind
        more = kinds.followups(kind, answers)
        if more:
            extra = await asyncio.gather(*(self._get(p, m, b) for _, m, p, b in more))
            answers.update({k: a for (k, _, _, _), a in zip(more, extra, strict=True)})
        state, models, error = kinds.interpret(kind, answers)
        return Probe(
            state,
            models,
            round(latency, 1),
            self.redact(error) if error else None,
            kind,
            answers,
        )

    async def check(self, path: str, timeout: float) -> Answer:
        """One health check: GET ``path`` (under the URL's host) within ``timeout``; never
        raises (status 0: no answer, the body says why)."""
        return await self._get(path, timeout=timeout)

    # -- generation -----------------------------------------------------------------------------
    async def chat(self, remote_id: str, req: ChatRequest) -> RemoteStream:
        body = codec.chat_body(self.kind, remote_id, req)
        if req.context.user:  # the end user, as the client named it (engines' own routers)
            body["user"] = req.context.user
        return await self._stream_schema("chat/completions", body, chat=True, headers=_trace(req))

    async def _stream_schema(
        self, path: str, body: dict[str, Any], *, chat: bool, headers: Headers = None
    ) -> RemoteStream:
        """Stream ``body``; an engine that refuses OpenAI's ``json_schema`` response format
        (llama-cpp-python's server takes only ``json_object`` with a ``schema``) gets its own
        dialect, once, and from then on."""
        fmt = body.get("response_format")
        schema_fmt = isinstance(fmt, dict) and fmt.get("type") == "json_schema"
        if schema_fmt and self._json_object_schema:
            body = {**body, "response_format": codec.json_object_dialect(fmt)}
            return await self._stream(path, body, chat=chat, headers=headers)
        try:
            return await self._stream(path, body, chat=chat, headers=headers)
        except ProviderError as e:
            if not (schema_fmt and e.upstream_status in (400, 422, 500)):
                raise
            if "response_format" not in e.message and "json_schema" not in e.message:
                raise
            log.info("provider %s takes json_object+schema, not json_schema", self.cfg.name)
            self._json_object_schema = True
            body = {**body, "response_format": codec.json_object_dialect(fmt)}
            return await self._stream(path, body, chat=chat, headers=headers)

    async def complete(
        self, remote_id: str, req: CompletionRequest, prompt: str | tuple[int, ...]
    ) -> RemoteStream:
        body = codec.completion_body(self.kind, remote_id, req, prompt)
        return await self._stream_schema("completions", body, chat=False, headers=_trace(req))

    async def _stream(
        self, path: str, body: dict[str, Any], *, chat: bool, headers: Headers = None
    ) -> RemoteStream:
        """POST a streaming request; return once its first token (or its end) came, so every
        failure up to there is raised (and a fallback chain may try the next target)."""
        cap = body.get("max_tokens")
        stream = RemoteStream(self, chat, max_tokens=cap if isinstance(cap, int) else None)

        async def start() -> None:
            url = self._url(path)
            opts: dict[str, Any] = {"headers": headers, "allow_redirects": self._follow}
            try:
                resp = await self._http().post(url, json=body, **opts)
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
                # a pooled connection the engine had closed: never reached it; a new one
                resp = await self._http().post(url, json=body, **opts)
            if resp.status != 200:
                try:
                    raise await self._error(resp)
                finally:
                    resp.release()
            stream.attach(resp)
            await stream.first()

        try:
            await self._guard(start(), self.cfg.first_token_timeout)
        except _EmptyStream:
            stream.cancel()
            return await self._whole(path, body, chat=chat, headers=headers)
        except BaseException:
            stream.cancel()
            raise
        return stream

    async def _whole(
        self, path: str, body: dict[str, Any], *, chat: bool, headers: Headers = None
    ) -> RemoteStream:
        """The request once more, not streamed: an engine that ends a stream with no event at
        all (llama_cpp.server does for a prompt over its context) says why this way (its 400
        answers at once), or answers whole, replayed as one delta."""
        plain = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        out = await self._json(
            "POST", path, {**plain, "stream": False}, self.cfg.first_token_timeout, headers
        )
        return RemoteStream.replay(self, chat, out)

    # -- whole requests -------------------------------------------------------------------------
    async def embed(self, remote_id: str, req: EmbeddingRequest) -> tuple[list[list[float]], int]:
        body: dict[str, Any] = {
            "model": remote_id,
            "input": [i if isinstance(i, str) else list(i) for i in req.inputs],
        }
        if req.dimensions is not None:
            body["dimensions"] = req.dimensions
        out = await self._json(
            "POST", "embeddings", body, self.cfg.first_token_timeout, _trace(req)
        )
        data = out.get("data") if isinstance(out, dict) else None
        if not isinstance(data, list) or len(data) != len(req.inputs):
            raise self._bad_answer("embeddings", "a vector per input")
        rows = sorted(data, key=lambda d: d.get("index", 0) if isinstance(d, dict) else 0)
        vectors = [r.get("embedding") for r in rows if isinstance(r, dict)]
        if len(vectors) != len(req.inputs) or not all(isinstance(v, list) for v in vectors):
            raise self._bad_answer("embeddings", "a vector per input")
        return vectors, codec.prompt_tokens(out)  # type: ignore[return-value]

    async def rerank(
        self, remote_id: str, req: RerankRequest
    ) -> tuple[list[tuple[int, float]], int]:
        body: dict[str, Any] = {
            "model": remote_id,
            "query": req.query,
            "documents": list(req.documents),
        }
        if req.top_n is not None:
            body["top_n"] = req.top_n
        try:
            out = await self._json(
                "POST", "rerank", body, self.cfg.first_token_timeout, _trace(req)
            )
        except ProviderError as e:
            if e.upstream_status in (404, 405, 501):
                raise NotSupported(
                    f"provider '{self.cfg.name}' has no rerank endpoint", param="model"
                ) from e
            raise
        results = out.get("results") if isinstance(out, dict) else None
        if not isinstance(results, list):
            raise self._bad_answer("rerank", "results")
        ranked = [
            (int(r["index"]), codec.score(r))
            for r in results
            if isinstance(r, dict) and isinstance(r.get("index"), int)
        ]
        ranked.sort(key=lambda p: -p[1])
        return ranked, codec.prompt_tokens(out)

    async def transcribe(
        self, remote_id: str, req: TranscriptionRequest
    ) -> tuple[str, float, list[TranscriptSegment]]:
        """The engine's /audio/transcriptions (or translations) with the same audio, asked for
        verbose_json: (language, duration, segments)."""
        path = "audio/translations" if req.job.task == "translate" else "audio/transcriptions"

        async def once() -> Any:
            form = aiohttp.FormData()
            for name, value in speech.form_fields(remote_id, req):
                form.add_field(name, value)
            audio = req.job.audio
            form.add_field("file", audio.data, filename=audio.filename or "audio")
            async with self._http().post(
                self._url(path), data=form, headers=_trace(req), allow_redirects=self._follow
            ) as resp:
                if resp.status in (404, 405, 501):
                    raise NotSupported(
                        f"provider '{self.cfg.name}' has no speech-to-text endpoint",
                        param="model",
                    )
                if resp.status != 200:
                    raise await self._error(resp)
                raw, whole = await read_body(resp, answers.MAX_BODY)
            if not whole:
                raise self._bad_answer(path, f"a body under {answers.MAX_BODY // 2**20} MiB")
            return self.parse(raw)

        # a long recording takes a while: the whole answer within the stream's idle bound
        out = await self._guard(once(), max(self.cfg.first_token_timeout, 600.0))
        read = speech.read_verbose(out)
        if read is None:
            raise self._bad_answer(path, "a verbose_json transcription")
        return read

    async def count_tokens(self, remote_id: str, req: ChatRequest) -> int:
        msgs = [codec.message(m) for m in req.messages]
        t, h = self.cfg.first_token_timeout, _trace(req)
        if self.kind in ("vllm", "sglang"):
            out = await self._json(
                "POST", "/tokenize", {"model": remote_id, "messages": msgs}, t, h
            )
            if isinstance(out, dict) and isinstance(out.get("count"), int):
                return int(out["count"])
            raise self._bad_answer("tokenize", "count")
        if self.kind == "llama.cpp":
            applied = await self._json("POST", "/apply-template", {"messages": msgs}, t, h)
            prompt = applied.get("prompt") if isinstance(applied, dict) else None
            if not isinstance(prompt, str):
                raise self._bad_answer("apply-template", "prompt")
            toks = await self._json(
                "POST", "/tokenize", {"content": prompt, "parse_special": True}, t, h
            )
            if isinstance(toks, dict) and isinstance(toks.get("tokens"), list):
                return len(toks["tokens"])
            raise self._bad_answer("tokenize", "tokens")
        if self.kind == "hearth":  # another Hearth counts through its template and tools
            body = codec.anthropic_count_body(remote_id, req)
            out = await self._json("POST", "/v1/messages/count_tokens", body, t, h)
            if isinstance(out, dict) and isinstance(out.get("input_tokens"), int):
                return int(out["input_tokens"])
            raise self._bad_answer("count_tokens", "input_tokens")
        raise NotSupported(
            f"provider '{self.cfg.name}' ({self.kind}) has no endpoint to count tokens",
            param="model",
        )

    def _bad_answer(self, what: str, wanted: str) -> ProviderError:
        return ProviderError(
            f"provider '{self.cfg.name}' sent a {what} answer without {wanted}",
            provider=self.cfg.name,
            status=502,
        )


MakeClient = Callable[[ProviderConfig, str | None], RemoteEngine]


def retry_after(value: str | None) -> float | None:
    """A ``Retry-After`` header's seconds (delay-seconds or an HTTP date), or None."""
    if not value:
        return None
    try:
        return max(0.0, float(value.strip()))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value.strip())
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _trace(
    req: ChatRequest | CompletionRequest | EmbeddingRequest | RerankRequest | TranscriptionRequest,
) -> Headers:
    """The headers that continue ``req``'s trace upstream, and its affinity (``x-session-id``,
    ``x-user-id``) so a router behind the engine keeps it too (None when there are none)."""
    headers = telemetry.trace_headers(req.context.trace)
    ctx = req.context
    if not (ctx.session_header or ctx.user):
        return headers
    out = dict(headers or {})
    if ctx.session_header:
        out["x-session-id"] = ctx.session_header
    if ctx.user:
        out["x-user-id"] = ctx.user
    return out
