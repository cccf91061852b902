"""A local fake of the Hugging Face Hub: the HTTP endpoints huggingface_hub (2.x) and Hearth call.

- ``GET /api/models`` (search: ``search``, ``author``, ``filter``, ``sort``, ``limit``,
  ``expand``): with ``expand`` only ``_id``, ``id`` and the asked properties come back, and an
  unknown property is a 400, as on the real Hub. Like the real Hub's list answer, ``siblings``
  carry file names only and ``gguf`` / ``safetensors`` count parameters: a search never says
  how big a file is (that takes one ``model_info`` per repo with ``blobs=true``),
- ``GET /api/models/OWNER/NAME[/revision/REV]`` (``blobs=true`` adds sizes; siblings carry
  ``lfs {sha256, size, pointerSize}`` and ``blobId``), ``GET .../tree/REV``,
- ``GET|HEAD /OWNER/NAME/resolve/REV/PATH``: LFS files answer 302 to a "CDN" path on the same
  server with ``X-Linked-Etag``/``X-Linked-Size``/``X-Repo-Commit``/``ETag`` like the real Hub;
  small (git) files are served directly. Both honour ``Range`` (206 + ``Content-Range``). The
  CDN is this server under the name ``localhost``: a cross-host redirect, as on the real Hub.
- Gated repos: 401 without a token, 403 with a wrong one (``X-Error-Code: GatedRepo``);
  private repos: 401 ``RepoNotFound``.

Faults per file (``FakeHub.fault``): drop the connection at byte N, stall at byte N for S
seconds, flip a byte, ignore Range (200), answer 429 with ``Retry-After``. ``FakeHub.hold``
returns a ``Gate``: the response stops at byte N (0: after the headers; the file's size: after
the last byte, before the end of a chunked body) until the test opens it, so a test decides how
long a transfer lasts instead of guessing how fast the machine is. The server runs on a
loopback port in its own thread, so subprocesses (the CLI) can use it as ``HF_ENDPOINT``.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from aiohttp import web

TOKEN = "hf_fake_token_for_tests"
CHUNK = 16 * 1024
# what the real Hub accepts as ``expand`` on /api/models (huggingface_hub's ExpandModelProperty_T)
EXPAND_PROPERTIES = frozenset(
    "author baseModels cardData childrenModelCount config createdAt disabled downloads "
    "downloadsAllTime evalResults gated gguf inference inferenceProviderMapping lastModified "
    "library_name likes mask_token model-index pipeline_tag private resourceGroup safetensors "
    "sha siblings spaces tags transformersInfo trendingScore usedStorage widgetData".split()
)


# -- test files -----------------------------------------------------------------------------------
def gguf_bytes(
    tmp: Path,
    *,
    name: str = "Tiny",
    file_type: int | None = 15,  # Q4_K_M
    elems: int = 1024,
    tokens: int = 0,
    context_length: int = 2048,
    block_count: int = 2,
    embedding: int = 64,
    heads: int = 4,
) -> bytes:
    """A small valid GGUF (written by the ``gguf`` package): ``elems`` F32 weights (4 bytes
    each, for size), ``tokens`` vocabulary entries (for header size)."""
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / f"build-{name}-{file_type}-{elems}-{tokens}.gguf"
    w = gguf.GGUFWriter(path, "llama")
    w.add_name(name)
    w.add_context_length(context_length)
    w.add_block_count(block_count)
    w.add_embedding_length(embedding)
    w.add_head_count(heads)
    w.add_head_count_kv(heads)
    if file_type is not None:
        w.add_file_type(file_type)
    if tokens:
        w.add_token_list([f"token-{i}" for i in range(tokens)])
    w.add_tensor("weights", np.arange(elems, dtype=np.float32) % 7)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    data = path.read_bytes()
    path.unlink()
    return data


def mlx_files(*, config: dict[str, Any] | None = None, weights: int = 4096) -> dict[str, bytes]:
    """An MLX-style folder: config.json + model.safetensors + tokenizer files."""
    import json
    import struct

    cfg = config or {
        "model_type": "llama",
        "max_position_embeddings": 2048,
        "quantization": {"bits": 4, "group_size": 64},
    }
    header = json.dumps(
        {"w": {"dtype": "F32", "shape": [weights], "data_offsets": [0, weights * 4]}}
    )
    hb = header.encode()
    hb += b" " * (-len(hb) % 8)
    st = struct.pack("<Q", len(hb)) + hb + np.ones(weights, dtype=np.float32).tobytes()
    return {
        "config.json": json.dumps(cfg).encode(),
        "model.safetensors": st,
        "tokenizer.json": json.dumps({"version": "1.0", "model": {"type": "BPE"}}).encode(),
        "tokenizer_config.json": json.dumps({"chat_template": "{{ messages }}"}).encode(),
    }


# -- model --------------------------------------------------------------------------------------------
@dataclass
class FakeFile:
    data: bytes
    lfs: bool = True
    advertised_sha256: str | None = None  # what the API claims (default: the real one)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def git_sha1(self) -> str:
        return hashlib.sha1(b"blob %d\0" % len(self.data) + self.data).hexdigest()


@dataclass
class FakeRepo:
    id: str
    files: dict[str, FakeFile]
    sha: str
    gated: bool | str = False
    private: bool = False
    tags: list[str] = field(default_factory=list)
    library_name: str | None = None
    config: dict[str, Any] | None = None
    card: str = ""
    card_data: dict[str, Any] | None = None
    downloads: int = 0
    likes: int = 0
    last_modified: str = "2025-01-01T00:00:00.000Z"
    created_at: str = "2024-01-01T00:00:00.000Z"
    listed_only: list[str] = field(default_factory=list)  # names in siblings, never served
    api_id: str | None = None  # the id the API answers with (a lying or case-fixing Hub)
    gone: bool = False  # still in search answers, but its own page 404s (deleted meanwhile)


class Gate:
    """Holds responses of the fake Hub at a byte offset until the test opens it.

    ``reached`` is set once a response sits at the offset (its bytes before it are sent).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.reached = threading.Event()
        self.held = 0  # responses waiting at the gate now
        self._opened = threading.Event()
        self._loop = loop
        self._event = asyncio.Event()  # awaited on the hub's loop

    def open(self) -> None:
        self._opened.set()
        self._loop.call_soon_threadsafe(self._event.set)

    @property
    def is_open(self) -> bool:
        return self._opened.is_set()

    def wait(self, timeout: float = 60.0) -> None:
        """Block until a response reached the gate (AssertionError after ``timeout``)."""
        if not self.reached.wait(timeout):
            raise AssertionError(f"no response reached the gate within {timeout:g}s")

    async def wait_async(self, timeout: float = 60.0) -> None:
        """``wait`` for async tests: the event loop keeps running meanwhile."""
        await asyncio.to_thread(self.wait, timeout)

    async def _pass(self, stopping: asyncio.Event | None) -> None:
        self.held += 1
        self.reached.set()
        try:
            waits = [asyncio.ensure_future(self._event.wait())]
            if stopping is not None:
                waits.append(asyncio.ensure_future(stopping.wait()))
            _, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for t in pending:
                t.cancel()
        finally:
            self.held -= 1


@dataclass
class Fault:
    drop_at: int | None = None
    stall_at: int | None = None
    stall_s: float = 0.0
    flip: int | None = None
    ignore_range: bool = False
    status: int | None = None
    retry_after: float | None = None
    hold_at: int | None = None  # stop at this byte until ``gate`` opens
    gate: Gate | None = None
    chunked: bool = False  # no Content-Length: the body ends with the last chunk, not a count
    times: int = 1  # requests it applies to (-1: every request)


@dataclass
class Seen:
    method: str
    path: str
    range: str | None
    authorization: str | None
    status: int = 0


class FakeHub:
    """The fake Hub server. ``start()`` binds a loopback port; ``endpoint`` is its base URL."""

    def __init__(self, token: str = TOKEN) -> None:
        self.token = token
        self.repos: dict[str, FakeRepo] = {}
        self.faults: dict[tuple[str, str], list[Fault]] = {}
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="fakehub")
        self._runner: web.AppRunner | None = None
        self._stopping: asyncio.Event | None = None
        self.port = 0

    # -- set-up ----------------------------------------------------------------------------
    def add_repo(self, repo_id: str, files: dict[str, bytes | FakeFile], **kw: Any) -> FakeRepo:
        ff = {
            k: v if isinstance(v, FakeFile) else FakeFile(v, lfs=_is_lfs(k))
            for k, v in files.items()
        }
        sha = hashlib.sha1(repo_id.encode()).hexdigest()
        repo = FakeRepo(repo_id, ff, sha, **kw)
        self.repos[repo_id] = repo
        return repo

    def fault(self, repo_id: str, path: str, **kw: Any) -> Fault:
        f = Fault(**kw)
        with self._lock:
            self.faults.setdefault((repo_id, path), []).append(f)
        return f

    def hold(
        self, repo_id: str, path: str, at: int = 0, *, chunked: bool = False, times: int = 1
    ) -> Gate:
        """Hold the next ``times`` GETs of a file at byte ``at`` until the returned gate opens.

        ``at`` = the file's size holds after the last byte; only a chunked body (``chunked``)
        keeps the client waiting there, since with a Content-Length it has all it expects.
        """
        gate = Gate(self._loop)
        self.fault(repo_id, path, hold_at=at, gate=gate, chunked=chunked, times=times)
        return gate

    def file_requests(self, repo_id: str, path: str) -> list[Seen]:
        """The GET requests that fetched this file's bytes (resolve or CDN)."""
        want = self.repos[repo_id].files[path]
        key = f"/cdn/{want.sha256}" if want.lfs else f"/{repo_id}/resolve/"
        with self._lock:
            return [
                s
                for s in self.seen
                if s.method == "GET"
                and (
                    s.path.startswith(key)
                    if want.lfs
                    else s.path.startswith(key) and s.path.endswith("/" + path)
                )
            ]

    def ranges(self, repo_id: str, path: str) -> list[str | None]:
        return [s.range for s in self.file_requests(repo_id, path)]

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> FakeHub:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    async def _start(self) -> None:
        self._stopping = asyncio.Event()
        app = web.Application()
        app.router.add_get("/api/models", self._search)
        app.router.add_get("/api/models/{owner}/{name}", self._info)
        app.router.add_get("/api/models/{owner}/{name}/revision/{rev}", self._info)
        app.router.add_get("/api/models/{owner}/{name}/tree/{rev}", self._tree)
        app.router.add_route("*", "/{owner}/{name}/resolve/{rev}/{path:.+}", self._resolve)
        app.router.add_route("*", "/cdn/{oid}", self._cdn)
        self._runner = web.AppRunner(app, shutdown_timeout=0.5, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = getattr(site, "_server", None)
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def stop(self) -> None:
        async def _stop() -> None:
            if self._stopping is not None:
                self._stopping.set()
            if self._runner is not None:
                await self._runner.cleanup()

        try:
            asyncio.run_coroutine_threadsafe(_stop(), self._loop).result(15)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)

    # -- helpers ---------------------------------------------------------------------------
    def _record(self, request: web.Request) -> Seen:
        s = Seen(
            request.method,
            request.path,
            request.headers.get("Range"),
            request.headers.get("Authorization"),
        )
        with self._lock:
            self.seen.append(s)
        return s

    def _authorized(self, request: web.Request) -> bool | None:
        """True: the right token; False: a wrong one; None: none."""
        auth = request.headers.get("Authorization")
        if not auth:
            return None
        return auth == f"Bearer {self.token}"

    def _repo_or_error(self, request: web.Request) -> FakeRepo | web.Response:
        repo_id = f"{request.match_info['owner']}/{request.match_info['name']}"
        repo = self.repos.get(repo_id)
        if repo is None or (repo.private and self._authorized(request) is not True):
            return web.json_response(
                {"error": "Repository not found"},
                status=401 if repo is not None or not request.headers.get("Authorization") else 404,
                headers={"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"},
            )
        rev = request.match_info.get("rev")
        if rev is not None and rev not in ("main", repo.sha):
            return web.json_response(
                {"error": "Invalid rev id"},
                status=404,
                headers={"X-Error-Code": "RevisionNotFound"},
            )
        return repo

    def _summary(self, r: FakeRepo) -> dict[str, Any]:
        return {
            "id": r.api_id or r.id,
            "_id": r.sha[:24],
            "modelId": r.id,
            "author": r.id.split("/")[0],
            "downloads": r.downloads,
            "likes": r.likes,
            "lastModified": r.last_modified,
            "createdAt": r.created_at,
            "gated": r.gated,
            "private": r.private,
            "tags": list(r.tags),
            "library_name": r.library_name,
            "pipeline_tag": "text-generation",
        }

    def _pop_fault(self, repo_id: str, path: str) -> Fault | None:
        with self._lock:
            lst = self.faults.get((repo_id, path)) or []
            for f in lst:
                if f.times != 0:
                    if f.times > 0:
                        f.times -= 1
                    return f
        return None

    def _expanded(self, r: FakeRepo, props: list[str]) -> dict[str, Any]:
        """A search item with only ``props``, shaped as the real Hub's list answer."""
        full = self._summary(r)
        out: dict[str, Any] = {"_id": full["_id"], "id": full["id"]}
        for p in props:
            if p in full:
                out[p] = full[p]
            elif p == "sha":
                out[p] = r.sha
            elif p == "siblings":  # names only: sizes need model_info(files_metadata=True)
                out[p] = [{"rfilename": n} for n in [*r.files, *r.listed_only]]
            elif p == "usedStorage":  # every file of the repo, all quantizations together
                out[p] = sum(len(f.data) for f in r.files.values())
            elif p == "cardData":
                out[p] = r.card_data
            elif p == "config":
                out[p] = r.config
            elif p == "gguf" and any(n.endswith(".gguf") for n in r.files):
                # the real Hub: parameter count and header facts of one GGUF, never bytes
                out[p] = {"total": 135_000_000, "architecture": "llama", "context_length": 2048}
            elif p == "safetensors" and any(n.endswith(".safetensors") for n in r.files):
                out[p] = {"parameters": {"F32": 4096}, "total": 4096}
        return out

    # -- API -------------------------------------------------------------------------------
    async def _search(self, request: web.Request) -> web.Response:
        self._record(request)
        q = request.query
        items = [r for r in self.repos.values() if not r.private or self._authorized(request)]
        if q.get("search"):
            needle = q["search"].lower()
            items = [r for r in items if needle in r.id.lower()]
        if q.get("author"):
            items = [r for r in items if r.id.split("/")[0] == q["author"]]
        for flt in q.getall("filter", []):
            items = [r for r in items if flt in r.tags or flt == r.library_name]
        key = {
            "downloads": lambda r: r.downloads,
            "likes": lambda r: r.likes,
            "lastModified": lambda r: r.last_modified,
            "createdAt": lambda r: r.created_at,
            "trendingScore": lambda r: r.likes,
        }.get(q.get("sort", ""))
        if key is not None:
            items.sort(key=key, reverse=True)  # type: ignore[arg-type]
        if q.get("limit"):
            items = items[: int(q["limit"])]
        props = [*q.getall("expand", []), *q.getall("expand[]", [])]
        if props:
            bad = [p for p in props if p not in EXPAND_PROPERTIES]
            if bad:
                return web.json_response(
                    {"error": f'"expand" must be one of {sorted(EXPAND_PROPERTIES)}: {bad}'},
                    status=400,
                )
            return web.json_response([self._expanded(r, props) for r in items])
        return web.json_response([self._summary(r) for r in items])

    async def _info(self, request: web.Request) -> web.Response:
        self._record(request)
        repo = self._repo_or_error(request)
        if isinstance(repo, web.Response):
            return repo
        if repo.gone:
            return web.json_response(
                {"error": "Repository not found"},
                status=404,
                headers={"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"},
            )
        blobs = request.query.get("blobs") in ("true", "True", "1")
        siblings: list[dict[str, Any]] = []
        for path, f in repo.files.items():
            s: dict[str, Any] = {"rfilename": path}
            if blobs:
                s["size"] = len(f.data)
                s["blobId"] = f.git_sha1
                if f.lfs:
                    s["lfs"] = {
                        "sha256": f.advertised_sha256 or f.sha256,
                        "size": len(f.data),
                        "pointerSize": 134,
                    }
            siblings.append(s)
        for path in repo.listed_only:
            s = {"rfilename": path}
            if blobs:
                s.update(
                    size=10,
                    blobId="0" * 40,
                    lfs={"sha256": "0" * 64, "size": 10, "pointerSize": 134},
                )
            siblings.append(s)
        body = self._summary(repo)
        body.update(
            sha=repo.sha,
            siblings=siblings,
            cardData=repo.card_data,
            config=repo.config,
            disabled=False,
            usedStorage=sum(len(f.data) for f in repo.files.values()),
        )
        return web.json_response(body)

    async def _tree(self, request: web.Request) -> web.Response:
        self._record(request)
        repo = self._repo_or_error(request)
        if isinstance(repo, web.Response):
            return repo
        out = []
        for path, f in repo.files.items():
            e: dict[str, Any] = {
                "type": "file",
                "oid": f.git_sha1,
                "size": len(f.data),
                "path": path,
            }
            if f.lfs:
                e["lfs"] = {"oid": f.sha256, "size": len(f.data), "pointerSize": 134}
            out.append(e)
        return web.json_response(out)

    # -- files -----------------------------------------------------------------------------
    async def _resolve(self, request: web.Request) -> web.StreamResponse:
        seen = self._record(request)
        repo = self._repo_or_error(request)
        if isinstance(repo, web.Response):
            seen.status = repo.status
            return repo
        auth = self._authorized(request)
        if repo.gated and auth is not True:
            status = 401 if auth is None else 403
            seen.status = status
            return web.json_response(
                {"error": f"Access to model {repo.id} is restricted."},
                status=status,
                headers={"X-Error-Code": "GatedRepo", "X-Error-Message": "gated"},
            )
        path = request.match_info["path"]
        f = repo.files.get(path)
        if f is None:
            if path == "README.md" and repo.card:
                return web.Response(body=repo.card.encode(), content_type="text/markdown")
            seen.status = 404
            return web.json_response(
                {"error": "Entry not found"}, status=404, headers={"X-Error-Code": "EntryNotFound"}
            )
        common = {"X-Repo-Commit": repo.sha}
        if f.lfs:
            # another host name for the same server: like the real CDN, a cross-host redirect
            loc = f"http://localhost:{self.port}/cdn/{f.sha256}?repo={repo.id}&path={path}"
            seen.status = 302
            return web.Response(
                status=302,
                headers={
                    **common,
                    "Location": loc,
                    "ETag": f'"{f.sha256}"',
                    "X-Linked-Etag": f'"{f.sha256}"',
                    "X-Linked-Size": str(len(f.data)),
                },
            )
        return await self._send(
            request, seen, repo.id, path, f, {**common, "ETag": f'"{f.git_sha1}"'}
        )

    async def _cdn(self, request: web.Request) -> web.StreamResponse:
        seen = self._record(request)
        repo_id, path = request.query.get("repo", ""), request.query.get("path", "")
        repo = self.repos.get(repo_id)
        f = repo.files.get(path) if repo else None
        if f is None or f.sha256 != request.match_info["oid"]:
            seen.status = 404
            return web.Response(status=404)
        return await self._send(request, seen, repo_id, path, f, {"ETag": f'"{f.sha256}"'})

    async def _send(
        self,
        request: web.Request,
        seen: Seen,
        repo_id: str,
        path: str,
        f: FakeFile,
        headers: dict[str, str],
    ) -> web.StreamResponse:
        fault = self._pop_fault(repo_id, path) if request.method == "GET" else None
        if fault and fault.status:
            seen.status = fault.status
            h = {"Retry-After": str(fault.retry_after)} if fault.retry_after is not None else {}
            return web.Response(status=fault.status, headers=h, text="slow down")
        data = f.data
        if fault and fault.flip is not None:
            b = bytearray(data)
            b[fault.flip] ^= 0xFF
            data = bytes(b)
        size = len(data)
        start, end = 0, size - 1
        status = 200
        rng = request.headers.get("Range")
        if rng and not (fault and fault.ignore_range):
            spec = rng.removeprefix("bytes=")
            a, _, b2 = spec.partition("-")
            start = int(a) if a else 0
            end = min(int(b2), size - 1) if b2 else size - 1
            if start >= size:
                seen.status = 416
                return web.Response(status=416, headers={"Content-Range": f"bytes */{size}"})
            status = 206
        resp = web.StreamResponse(status=status, headers={**headers, "Accept-Ranges": "bytes"})
        resp.content_type = "application/octet-stream"
        if fault and fault.chunked:
            resp.enable_chunked_encoding()
        else:
            resp.content_length = end - start + 1
        if status == 206:
            resp.headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        seen.status = status
        await resp.prepare(request)
        if request.method == "HEAD":
            return resp
        pos = start
        hold = fault.hold_at if fault and fault.gate is not None else None
        try:
            while pos <= end:
                if hold is not None and pos == hold and fault and fault.gate is not None:
                    await fault.gate._pass(self._stopping)
                    if self._stopping is not None and self._stopping.is_set():
                        return resp
                stop = min(end + 1, pos + CHUNK)
                for mark in (fault.drop_at, fault.stall_at, hold) if fault else ():
                    if mark is not None and pos < mark < stop:
                        stop = mark
                if fault and fault.drop_at is not None and pos == fault.drop_at:
                    if request.transport is not None:
                        request.transport.abort()
                    return resp
                if fault and fault.stall_at is not None and pos == fault.stall_at and fault.stall_s:
                    stall, fault.stall_s = fault.stall_s, 0.0
                    if self._stopping is not None:
                        try:
                            await asyncio.wait_for(self._stopping.wait(), stall)
                            return resp
                        except TimeoutError:
                            pass
                await resp.write(data[pos:stop])
                pos = stop
            if hold is not None and hold == pos and fault and fault.gate is not None:
                await fault.gate._pass(self._stopping)  # every byte sent, the body not ended
                if self._stopping is not None and self._stopping.is_set():
                    return resp
            await resp.write_eof()
        except (ConnectionResetError, ConnectionError, asyncio.CancelledError):
            pass
        return resp


def _is_lfs(path: str) -> bool:
    return path.endswith((".gguf", ".safetensors", ".bin", ".pt", ".pth", ".pkl", ".ckpt"))


def serve() -> Iterator[FakeHub]:
    """Start a fake Hub, yield it, stop it (the ``fake_hub`` fixture's body)."""
    hub = FakeHub().start()
    try:
        yield hub
    finally:
        hub.stop()


def add_starters(
    hub: FakeHub, tmp: Path, *, large: tuple[str, ...] = (), large_elems: int = 5_000_000
) -> dict[str, str]:
    """Serve the first-run starter repos (app/core/hub/starters.py) as small GGUF repos: each
    has its starter's quantization and a Q8_0, named as their real repos name files. Repos in
    ``large`` get ``large_elems`` weights (to not fit a small budget). Returns repo -> the
    starter's file name."""
    from app.core.hub.starters import STARTERS

    files: dict[str, str] = {}
    for s in STARTERS:
        stem = s.repo_id.split("/")[1].lower().removesuffix("-gguf")
        name = f"{stem}-{s.quant.lower()}.gguf"
        elems = large_elems if s.repo_id in large else 1024
        hub.add_repo(
            s.repo_id,
            {
                name: gguf_bytes(tmp, name=stem, elems=elems),
                f"{stem}-q8_0.gguf": gguf_bytes(tmp, name=stem, file_type=7, elems=elems),
            },
            tags=["gguf", "license:apache-2.0"],
        )
        files[s.repo_id] = name
    return files
