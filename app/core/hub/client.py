"""HubClient: search the Hugging Face Hub and look inside a repo before downloading anything.

huggingface_hub does the talking (``HfApi`` for search and repo metadata, ``hf_hub_url`` and
``build_hf_headers`` for file URLs and auth); Hearth adds what it needs on top and trusts
nothing the repo says: names are checked before they can become paths, quantizations are read
from the GGUF header itself (fetched with an HTTP Range request), and repos that could run code
(pickle weights, ``auto_map``/``trust_remote_code``, ``model_file``) are refused with a reason.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import weakref
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx2
from huggingface_hub import HfApi, constants, get_async_session, hf_hub_url
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import build_hf_headers

from app.core.hub.catalog import (
    SEARCH_EXPAND,
    SORT_PARAMS,
    ModelSummary,
    RepoInfo,
    Sort,
    assess,
    canonical_id,
    license_of,
)
from app.core.hub.listing import Listing, ListingCache
from app.core.hub.reach import CONNECT_TIMEOUT_S, Reachability, network_reason
from app.core.hub.refs import check_repo_id, check_repo_path
from app.core.library import fit as fitlib
from app.core.library import gguf
from app.core.library.formats import HubFormat, ModelOption, RepoFile, format_named, tagged_format
from app.errors import (
    AccessDenied,
    HearthError,
    HubUnavailable,
    InvalidModel,
    RepoNotFound,
    RepoRefused,
)

log = logging.getLogger(__name__)

SIZE_CONCURRENCY = 4  # repo lookups at once when filling in search results' sizes
HEADER_FIRST_READ = 2 * 1024 * 1024
HEADER_MAX_READ = 64 * 1024 * 1024  # vocabularies of 256k tokens need ~10 MB; beyond this: refuse


class HubClient:
    """Search and inspect Hub repos through huggingface_hub; read GGUF headers remotely.

    Args:
        endpoint: the Hub's base URL; None = ``HF_ENDPOINT`` or https://huggingface.co.
        token: a token string, or a callable that returns the current one (settings change);
            None = huggingface_hub's own (``HF_TOKEN``, ``hf auth login``).
        memory_probe: what this machine can hold, for fit verdicts (tests pass a fake machine).
        context_length: the context a fit verdict assumes.
        connect_timeout: how long finding out that the Hub cannot be reached may take (per step).
        listing_cache: where the last featured listing is kept for when the Hub cannot be
            reached (None: not kept).
    """

    def __init__(
        self,
        *,
        endpoint: str | None = None,
        token: str | Callable[[], str | None] | None = None,
        memory_probe: Callable[[], fitlib.DeviceMemory] = fitlib.probe_memory,
        context_length: int = 4096,
        timeout: float = 30.0,
        connect_timeout: float = CONNECT_TIMEOUT_S,
        listing_cache: Path | None = None,
    ) -> None:
        self.endpoint = (endpoint or os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip(
            "/"
        )
        self._token = token
        self.memory_probe = memory_probe
        self.context_length = context_length
        self.timeout = timeout
        self.reach = Reachability(self.endpoint, timeout=connect_timeout)
        self.listings = ListingCache(listing_cache) if listing_cache is not None else None
        # one limit per event loop on concurrent repo lookups for search-result sizes
        self._size_limits: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, asyncio.Semaphore
        ] = weakref.WeakKeyDictionary()

    # -- plumbing shared with the DownloadManager ------------------------------------------
    def token(self) -> str | None:
        t = self._token() if callable(self._token) else self._token
        return t or None

    def api(self) -> HfApi:
        return HfApi(endpoint=self.endpoint, token=self.token())

    def headers(self) -> dict[str, str]:
        """Auth and user-agent headers for a file request (never logged)."""
        return build_hf_headers(token=self.token(), library_name="hearth")

    def file_url(self, repo_id: str, path: str, revision: str) -> str:
        return hf_hub_url(repo_id, path, revision=revision, endpoint=self.endpoint)

    def repo_url(self, repo_id: str) -> str:
        return f"{self.endpoint}/{repo_id}"

    def http(self) -> httpx2.AsyncClient:
        """huggingface_hub's async HTTP client (honours a user-set client factory)."""
        return get_async_session()

    def access_error(self, repo_id: str, status: int, *, gated: bool = True) -> AccessDenied:
        url = self.repo_url(repo_id)
        has_token = self.token() is not None or build_hf_headers().get("authorization")
        if has_token:
            msg = (
                f"Access to {repo_id} is restricted (HTTP {status}) and your Hugging Face token "
                f"cannot download it. Accept the model's conditions at {url} with the account "
                f"that owns the token, then try again."
            )
        else:
            msg = (
                f"{repo_id} is {'gated' if gated else 'private'} (HTTP {status}): accept its "
                f"conditions at {url}, then set a Hugging Face access token in Hearth's settings "
                f"(or HF_TOKEN) and try again."
            )
        return AccessDenied(msg, url=url)

    def _map_error(self, repo_id: str, e: Exception) -> HearthError:
        if isinstance(e, GatedRepoError):
            status = e.response.status_code if e.response is not None else 403
            return self.access_error(repo_id, status)
        if isinstance(e, RevisionNotFoundError):
            return RepoNotFound(f"{repo_id}: revision not found", param="model")
        if isinstance(e, RepositoryNotFoundError):
            return RepoNotFound(
                f"{repo_id} was not found on {self.endpoint}. If it is private or gated, set a "
                f"Hugging Face token in Hearth's settings (or HF_TOKEN). {self.repo_url(repo_id)}",
                param="model",
            )
        if isinstance(e, HfHubHTTPError):
            status = e.response.status_code if e.response is not None else "?"
            return HubUnavailable(f"the Hub answered HTTP {status} for {repo_id}")
        if isinstance(e, OfflineModeIsEnabled):
            return HubUnavailable("HF_HUB_OFFLINE is set: the Hub is not contacted")
        return HubUnavailable(f"Can't reach the Hub at {self.endpoint}: {network_reason(e)}.")

    # -- search ----------------------------------------------------------------------------
    async def search(
        self,
        query: str = "",
        *,
        format: HubFormat | None = "gguf",
        sort: Sort = "downloads",
        author: str | None = None,
        limit: int = 30,
    ) -> list[ModelSummary]:
        """Search models of one format (its ``search_tags`` as the Hub's ``filter``: ``gguf``,
        ``mlx``, or ``ctranslate2`` + ``automatic-speech-recognition`` for Whisper), best first.

        Raises:
            HubUnavailable: the Hub cannot be reached.
            InvalidRequest-like ``RepoRefused``: a bad sort key.
        """
        if sort not in SORT_PARAMS:
            raise RepoRefused(f"unknown sort '{sort}' (use {', '.join(SORT_PARAMS)})")
        limit = max(1, min(int(limit), 500))
        await self.reach.check()  # offline: say so now, not after huggingface_hub's retries

        def run() -> list[ModelSummary]:
            items = self.api().list_models(
                search=query or None,
                filter=list(format_named(format).search_tags) if format else None,
                author=author or None,
                sort=SORT_PARAMS[sort],  # type: ignore[arg-type]
                limit=limit,
                expand=SEARCH_EXPAND,  # type: ignore[arg-type]
            )
            return [self._summary(m) for m in items]

        try:
            return await asyncio.to_thread(run)
        except (HfHubHTTPError, httpx2.HTTPError, OSError, OfflineModeIsEnabled) as e:
            raise self._map_error(query or "search", e) from e

    async def featured(
        self, *, format: HubFormat | None = "gguf", sort: Sort = "downloads", limit: int = 30
    ) -> Listing:
        """The featured models (an empty search); when the Hub cannot be reached, the last such
        listing that came back (``cached_at`` set) if one was kept.

        Raises:
            HubUnavailable (HubOffline when offline): unreachable and nothing cached.
        """
        key = f"{format or 'any'}:{sort}:{limit}"
        try:
            results = await self.search("", format=format, sort=sort, limit=limit)
        except HubUnavailable as e:
            cached = self.listings.load(key) if self.listings is not None else None
            if cached is None:
                raise
            log.info(
                "the Hub cannot be reached (%s): featured models as of %s", e, cached.cached_at
            )
            return replace(cached, unreachable=e.message)
        if self.listings is not None:
            await asyncio.to_thread(self.listings.save, key, results)
        return Listing(tuple(results))

    async def repo_size_range(self, repo_id: str) -> tuple[int, int] | None:
        """A search result's size range, from the repo's file list (one ``model_info`` call with
        file metadata; the search answer cannot carry sizes). At most ``SIZE_CONCURRENCY`` of
        these run at once per loop, however many a caller starts.

        Raises:
            RepoRefused, RepoNotFound, AccessDenied, HubUnavailable: as ``repo``.
        """
        loop = asyncio.get_running_loop()
        limit = self._size_limits.get(loop)
        if limit is None:
            limit = self._size_limits[loop] = asyncio.Semaphore(SIZE_CONCURRENCY)
        async with limit:
            info = await self.repo(repo_id, with_fit=False)
        if self.listings is not None:  # so a kept featured listing shows sizes offline
            await asyncio.to_thread(self.listings.set_size, info.id, info.size_range)
        return info.size_range

    async def with_sizes(self, results: Sequence[ModelSummary]) -> list[ModelSummary]:
        """``results`` with ``size_range`` filled in where the repo's files could be read (a repo
        that fails keeps None; the failure is logged)."""

        async def one(s: ModelSummary) -> ModelSummary:
            if s.size_range is not None:
                return s
            try:
                return replace(s, size_range=await self.repo_size_range(s.id))
            except HearthError as e:
                log.info("%s: no size range: %s", s.id, e.message)
                return s

        return list(await asyncio.gather(*(one(s) for s in results)))

    def _summary(self, m: Any) -> ModelSummary:
        tags = tuple(t for t in (m.tags or ()) if isinstance(t, str))
        card = m.card_data.to_dict() if hasattr(m.card_data, "to_dict") else m.card_data
        return ModelSummary(
            id=m.id,
            author=m.author or m.id.split("/")[0],
            downloads=int(m.downloads or 0),
            likes=int(m.likes or 0),
            last_modified=m.last_modified,
            created_at=m.created_at,
            gated=m.gated if m.gated in ("auto", "manual") else bool(m.gated),
            private=bool(m.private),
            license=license_of(tags, card),
            tags=tags,
            library_name=m.library_name,
            pipeline_tag=m.pipeline_tag,
            format=fmt.name if (fmt := tagged_format(tags, m.library_name)) else None,
        )

    # -- one repo ----------------------------------------------------------------------------
    async def repo(
        self, repo_id: str, *, revision: str | None = None, with_fit: bool = True
    ) -> RepoInfo:
        """A repo's files grouped into options, each with size and (``with_fit``) a fit verdict.

        Raises:
            RepoRefused: a malformed repo id.
            RepoNotFound, AccessDenied, HubUnavailable.
        """
        check_repo_id(repo_id)
        await self.reach.check()

        def run() -> Any:
            return self.api().model_info(repo_id, revision=revision, files_metadata=True)

        try:
            m = await asyncio.to_thread(run)
        except (HfHubHTTPError, httpx2.HTTPError, OSError, OfflineModeIsEnabled) as e:
            raise self._map_error(repo_id, e) from e
        files: list[RepoFile] = []
        unsafe: list[str] = []
        for s in m.siblings or ():
            try:
                check_repo_path(s.rfilename)
            except RepoRefused:
                unsafe.append(s.rfilename)
                continue
            lfs = s.lfs
            sha = lfs.sha256 if lfs is not None else None
            size = lfs.size if lfs is not None else s.size
            if sha is not None and not re.fullmatch(r"[0-9a-f]{64}", str(sha)):
                sha = None  # an oid that is not a sha256 cannot verify anything
            blob = (
                s.blob_id
                if isinstance(s.blob_id, str) and re.fullmatch(r"[0-9a-f]{40}", s.blob_id)
                else None
            )
            files.append(RepoFile(s.rfilename, size, sha, blob))
        tags = tuple(t for t in (m.tags or ()) if isinstance(t, str))
        card = m.card_data.to_dict() if hasattr(m.card_data, "to_dict") else (m.card_data or {})
        fmt, options, refused, warnings = assess(
            files, tags=tags, library_name=m.library_name, config=m.config, unsafe=unsafe
        )
        for w in warnings:
            log.warning("%s: %s", repo_id, w)
        info = RepoInfo(
            id=canonical_id(repo_id, m.id),
            revision=m.sha or revision or "main",
            author=m.author or repo_id.split("/")[0],
            format=fmt,
            gated=m.gated if m.gated in ("auto", "manual") else bool(m.gated),
            private=bool(m.private),
            license=license_of(tags, card),
            downloads=int(m.downloads or 0),
            likes=int(m.likes or 0),
            last_modified=m.last_modified,
            created_at=m.created_at,
            tags=tags,
            library_name=m.library_name,
            files=tuple(files),
            options=tuple(options),
            refused=refused,
            url=self.repo_url(repo_id),
            warnings=tuple(warnings),
            card_data=card if isinstance(card, dict) else {},
        )
        if with_fit and info.options and not info.refused:
            info = await self.with_fit(info)
        return info

    async def with_fit(self, info: RepoInfo, *, concurrency: int = 4) -> RepoInfo:
        """``info`` with a fit verdict on every option (headers read remotely, a few at a time)."""
        memory = await asyncio.to_thread(self.memory_probe)
        sem = asyncio.Semaphore(concurrency)

        async def one(o: ModelOption) -> ModelOption:
            async with sem:
                return await self.fit_option(info, o, memory)

        opts = await asyncio.gather(*(one(o) for o in info.options))
        return replace(info, options=tuple(opts))

    async def fit_option(
        self, info: RepoInfo, option: ModelOption, memory: fitlib.DeviceMemory | None = None
    ) -> ModelOption:
        """One option with its memory estimate and verdict (fits-gpu / fits-ram / too-large)."""
        if memory is None:
            memory = await asyncio.to_thread(self.memory_probe)
        first = option.first_file

        async def read_header(f: RepoFile) -> gguf.GGUFHeader:
            return await self.read_header(info.id, f.path, revision=info.revision, size=f.size)

        try:
            est = await format_named(option.format).estimate_remote(
                option, read_header, context_length=self.context_length
            )
        except HearthError as e:
            log.info("%s/%s: no fit estimate: %s", info.id, first.path, e.message)
            return replace(option, fit_error=e.message)
        return replace(option, fit=fitlib.verdict(est.total, memory), estimate=est)

    async def read_header(
        self, repo_id: str, path: str, *, revision: str, size: int | None
    ) -> gguf.GGUFHeader:
        """Read and validate a GGUF header over HTTP: the first 2 MiB, more while it needs more.

        Raises:
            InvalidModel: a malformed header (or one larger than 64 MiB).
            AccessDenied, RepoNotFound, HubUnavailable.
        """
        check_repo_path(path)
        url = self.file_url(repo_id, path, revision)
        want = HEADER_FIRST_READ if size is None else min(size, HEADER_FIRST_READ)
        buf = bytearray()
        async with self.http() as client:
            while True:
                await self._read_range(client, repo_id, url, buf, want)
                total = size if size is not None else None
                try:
                    return gguf.parse_header(bytes(buf), file_size=total)
                except gguf.TruncatedHeader as e:
                    if size is not None and len(buf) >= size:
                        raise InvalidModel(f"invalid GGUF: {path} ends inside its header") from e
                    nxt = max(want * 2, e.needed + 64 * 1024)
                    if nxt > HEADER_MAX_READ:
                        raise InvalidModel(
                            f"the GGUF header of {path} is larger than {HEADER_MAX_READ} bytes"
                        ) from e
                    want = nxt if size is None else min(size, nxt)

    async def _read_range(
        self, client: httpx2.AsyncClient, repo_id: str, url: str, buf: bytearray, want: int
    ) -> None:
        """Extend ``buf`` to ``want`` bytes from the file's start (Range; a 200 is cut short)."""
        start = len(buf)
        headers = {
            **self.headers(),
            "Range": f"bytes={start}-{want - 1}",
            "Accept-Encoding": "identity",
        }
        try:
            async with client.stream(
                "GET", url, headers=headers, timeout=httpx2.Timeout(self.timeout)
            ) as r:
                if r.status_code in (401, 403):
                    raise self.access_error(repo_id, r.status_code)
                if r.status_code == 404:
                    raise RepoNotFound(f"{repo_id}: file not found", param="model")
                if r.status_code not in (200, 206):
                    raise HubUnavailable(f"the Hub answered HTTP {r.status_code} for {url}")
                if r.status_code == 200 and start:
                    del buf[:]  # the server ignored Range: this is the file from byte 0
                async for chunk in r.aiter_bytes():
                    buf += chunk
                    if len(buf) >= want:
                        break
        except httpx2.HTTPError as e:
            raise HubUnavailable(f"cannot read {url}: {e}") from e
        del buf[want:]

    async def check_access(self, repo_id: str, path: str, *, revision: str) -> None:
        """Fail early, before queuing a download, when the token cannot read a gated file.

        Raises:
            AccessDenied: 401/403 (the message links to the repo page).
            RepoNotFound: 404.
        """
        url = self.file_url(repo_id, path, revision)
        headers = {**self.headers(), "Range": "bytes=0-0", "Accept-Encoding": "identity"}
        try:
            async with self.http() as client:
                async with client.stream(
                    "GET", url, headers=headers, timeout=httpx2.Timeout(self.timeout)
                ) as r:
                    if r.status_code in (401, 403):
                        raise self.access_error(repo_id, r.status_code)
                    if r.status_code == 404:
                        raise RepoNotFound(f"{repo_id}: {path} is not on the Hub", param="model")
        except httpx2.HTTPError as e:  # the download itself retries network trouble
            log.info("access check for %s failed: %s", repo_id, e)

    async def model_card(
        self, repo_id: str, *, revision: str = "main", limit: int = 1 << 20
    ) -> str:
        """The repo's README (model card) as Markdown, without its YAML front matter; "" if none."""
        check_repo_id(repo_id)
        url = self.file_url(repo_id, "README.md", revision)
        try:
            async with self.http() as client:
                async with client.stream(
                    "GET", url, headers=self.headers(), timeout=httpx2.Timeout(self.timeout)
                ) as r:
                    if r.status_code == 404:
                        return ""
                    if r.status_code in (401, 403):
                        raise self.access_error(repo_id, r.status_code)
                    if r.status_code != 200:
                        raise HubUnavailable(f"the Hub answered HTTP {r.status_code} for {url}")
                    data = bytearray()
                    async for chunk in r.aiter_bytes():
                        data += chunk
                        if len(data) > limit:
                            break
        except httpx2.HTTPError as e:
            raise HubUnavailable(f"cannot read {url}: {e}") from e
        text = bytes(data[:limit]).decode("utf-8", errors="replace")
        if text.startswith("---"):
            end = text.find("\n---", 3)
            if end != -1:
                text = text[end + 4 :].lstrip("\n")
        return text
