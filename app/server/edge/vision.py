"""Images in requests, at the edge: the adapters leave :class:`ImageSource`s on the messages;
:func:`resolve_images` resolves the request's target and checks it takes images (before
anything is fetched or decoded), applies the URL policy (``vision.fetch_urls``), fetches and
decodes them on threads of their own (bounded per image and per request, stopped when the
request ends), and gives the service messages with decoded :class:`ImageInput`s only."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TypeVar

from aiohttp import web

from app.core.inference.images import (
    MAX_IMAGES,
    ImageInput,
    ImageLimits,
    ImageSource,
    InvalidImage,
    PixelBudget,
    decode_image,
)
from app.core.requests import ChatRequest, CompletionRequest
from app.core.util.job_pool import JobPool
from app.errors import UnsupportedParameter
from app.server.edge.image_fetch import ImageFetcher, Resolve, system_resolve
from app.server.state import SERVICE, with_context
from app.settings import VisionSettings

DECODE_THREADS = 2  # images decode one at a time per request; two requests' side by side


def decode_pool() -> JobPool:
    """The threads images decode on (see :class:`JobPool`: stopped with the request)."""
    return JobPool(threads=DECODE_THREADS, name="hearth-image")


@dataclass
class VisionEdge:
    """What the server needs for images: the settings (read per request, cached by the
    store) and the fetcher's seams (``resolve``, ``dial``: see :class:`ImageFetcher`)."""

    settings: Callable[[], VisionSettings] = VisionSettings
    resolve: Resolve = system_resolve
    dial: Mapping[tuple[str, int], tuple[str, int]] = field(default_factory=dict)
    pool: JobPool = field(default_factory=decode_pool)

    def fetcher(self, cfg: VisionSettings) -> ImageFetcher:
        return ImageFetcher(
            self.resolve, self.dial, max_redirects=cfg.max_redirects, timeout_s=cfg.fetch_timeout_s
        )


VISION = web.AppKey("vision", VisionEdge)
R = TypeVar("R", bound=ChatRequest | CompletionRequest)


def _local_client(request: web.Request) -> bool:
    try:
        return request.remote is not None and ipaddress.ip_address(request.remote).is_loopback
    except ValueError:
        return False  # a unix socket or a proxy's name: not known to be this machine


async def resolve_images(request: web.Request, req: R) -> R:
    """``req`` with every message's image sources fetched and decoded into ``images`` (any
    other request as it is).

    Raises:
        ModelNotFound, InvalidRequest: the model resolves to no target (as the chat would).
        UnsupportedParameter: the target takes no images, or URL fetching is off for this
            client (``param``: the first image / the URL).
        InvalidImage: an image that cannot be fetched or decoded, or over the request's
            pixel total (``param``: its part).
    """
    req = with_context(request, req)  # the caller's scope and limits go with it
    if not isinstance(req, ChatRequest):
        return req
    sources = [s for m in req.messages for s in m.image_sources]
    if not sources:
        return req
    await request.app[SERVICE].check_images(req)  # before any fetch or decode
    if len(sources) > MAX_IMAGES:
        raise InvalidImage(
            f"a request takes at most {MAX_IMAGES} images", param=sources[MAX_IMAGES].where
        )
    edge = request.app[VISION]
    cfg = edge.settings()
    urls = [s for s in sources if s.url is not None]
    if urls and (
        cfg.fetch_urls == "off"
        or (cfg.fetch_urls == "local-clients" and not _local_client(request))
    ):
        raise UnsupportedParameter(
            f"{urls[0].where}: image URLs are not fetched for this client (vision.fetch_urls is "
            f"{cfg.fetch_urls!r}); send the image as a data URL or base64",
            param=urls[0].where,
        )
    limits = cfg.limits()
    budget = PixelBudget(limits.max_request_pixels)
    fetcher = edge.fetcher(cfg)
    decoded: dict[int, ImageInput] = {}
    for s in sources:  # one at a time: each takes its pixels from the budget before decoding
        decoded[id(s)] = await _decode(s, fetcher, edge.pool, limits, budget)
    messages = tuple(
        replace(m, images=tuple(decoded[id(s)] for s in m.image_sources), image_sources=())
        if m.image_sources
        else m
        for m in req.messages
    )
    return replace(req, messages=messages)  # type: ignore[return-value]


async def _decode(
    s: ImageSource,
    fetcher: ImageFetcher,
    pool: JobPool,
    limits: ImageLimits,
    budget: PixelBudget,
) -> ImageInput:
    data = s.data
    if data is None:
        if s.url is None:
            raise InvalidImage("an image needs data or a URL", param=s.where)
        data = await fetcher.fetch(s.url, where=s.where, max_bytes=limits.max_bytes)
    encoded = data
    return await pool.run(
        lambda stop: decode_image(
            encoded, where=s.where, limits=limits, source=s, budget=budget, stop=stop
        )
    )
