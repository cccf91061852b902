"""Typed settings <-> one JSON file (atomic writes, file lock). Validation happens here, at the edge."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import math
import secrets
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from app.core.engine.autofit import DEFAULT_MAX_AUTO_CONTEXT
from app.core.engine.load_options import SPECS
from app.core.gateway import AutoRule, Routing, parse_rules
from app.core.gateway.auto import rules_to_json
from app.core.gateway.cache.store import CACHE_MODES, CACHE_SCOPES, CacheConfig
from app.core.gateway.response_store import ResponseStoreConfig
from app.core.inference.images import ImageLimits
from app.core.util import filecache
from app.core.util.filecache import FileCache
from app.core.util.fsutil import (
    atomic_write_bytes,
    atomic_write_json,
    file_lock,
    read_json,
    remove_stale_writes,
)
from app.errors import ConfigError, InvalidRequest

log = logging.getLogger(__name__)

DEFAULT_PORT = 8421
DEFAULT_BODY_LIMIT = 32 * 1024 * 1024


def hash_key(key: str) -> str:
    """API keys are stored as sha256 hex digests, never in clear."""
    return hashlib.sha256(key.encode()).hexdigest()


def key_matches(key: str, hashes: list[str] | tuple[str, ...]) -> bool:
    digest = hash_key(key)
    ok = False
    for h in hashes:  # compare against all, in constant time each
        ok |= hmac.compare_digest(digest, h)
    return ok


def generate_key() -> str:
    return "hearth-" + secrets.token_urlsafe(24)


@dataclass(frozen=True, slots=True)
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    api_key_hashes: tuple[str, ...] = ()
    start_at_launch: bool = False
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    max_body_bytes: int = DEFAULT_BODY_LIMIT
    jit_loading: bool = True
    queue_size: int = 16
    request_timeout_s: float = 600.0
    reasoning_field_also: bool = False  # also send a model's thinking as `reasoning` (some clients)
    # slow clients (SECURITY.md 6): a request's headers must arrive within header_timeout_s of
    # its first byte (of the connection, for its first request); its body within body_timeout_s
    # plus one second per body_min_rate bytes received (0 = no extension)
    header_timeout_s: float = 20.0
    body_timeout_s: float = 30.0
    body_min_rate: int = 16 * 1024
    # connections still sending their headers or body, in all and per client address (IPv6: /64)
    max_incomplete_connections: int = 512
    max_incomplete_per_client: int = 64
    # HTTPS: PEM certificate (chain) and unencrypted key files; both empty = plain HTTP
    tls_cert: str = ""
    tls_key: str = ""


@dataclass(frozen=True, slots=True)
class LoadDefaults:
    # 0 = "auto" in settings.json: the largest context that fits the budget free
    # at load time, up to the model's trained length and max_auto_context
    context_length: int = 0
    max_auto_context: int = DEFAULT_MAX_AUTO_CONTEXT
    threads: int = 0  # 0 = auto: the physical cores, fewer while other programs keep them busy
    batch_size: int = 512
    # the most requests one GGUF model decodes together; they share one cache of context_length
    # tokens, and beyond 4 join only while that is faster (app/runtimes/llama/admission.py);
    # with prompt_cache.mode "exact" or kv_layout "per-sequence", each gets its own cache
    parallel: int = 8
    jit_ttl_s: int = 900  # an on-demand load unloads after this long idle; 0 = at once when idle
    jit_keep_forever: bool = False  # on-demand loads never unload on their own
    memory_budget_bytes: int = 0  # 0 = 80% of RAM (or of the largest GPU)


# top-level Settings fields of the first run; what closing the window does is
# ui.close_action (an older file's keep_in_tray: false reads as close_action "quit")
FIRST_RUN_KEYS = ("start_at_login",)

# LoadDefaults fields that are load options (validated with the option table)
LOAD_DEFAULT_OPTIONS = ("context_length", "threads", "batch_size", "parallel")


@dataclass(frozen=True, slots=True)
class PromptCacheSettings:
    """``prompt_cache`` in settings.json: how a prompt reuses cached ones.

    ``mode``: reuse (the whole common prefix of a kept prompt and answer, several
    conversations kept), exact (only what keeps answers bit-identical to an uncached solo run:
    whole aligned micro-batches, one cache per parallel sequence) or off."""

    mode: str = "reuse"


@dataclass(frozen=True, slots=True)
class DownloadSettings:
    """Hub downloads. The Hugging Face token is not here: see ``TokenStore``."""

    stall_timeout_s: float = 30.0  # no bytes for this long: the connection counts as stalled
    max_concurrent: int = 2


@dataclass(frozen=True, slots=True)
class RoutingSettings:
    """``routing`` in settings.json: the special model ``auto``'s rules (app/core/gateway/auto)."""

    auto: tuple[AutoRule, ...] = ()


@dataclass(frozen=True, slots=True)
class RecordSettings:
    """``records`` in settings.json: the request records database (data folder)."""

    max_rows: int = 100_000  # the oldest records are pruned past this many
    log_content: bool = False  # also keep each request's body and answer text, capped
    content_max_chars: int = 4096  # per record, for each of the two


CLOSE_ACTIONS = ("ask", "background", "quit")  # closing the window while the server runs
THEMES = ("system", "light", "dark")


@dataclass(frozen=True, slots=True)
class WindowState:
    """``ui.window``: where the main window was (the normal geometry when it was maximized) and
    its last page; width 0 = never saved."""

    x: int = 0
    y: int = 0
    width: int = 0
    height: int = 0
    maximized: bool = False
    page: str = ""


@dataclass(frozen=True, slots=True)
class UiSettings:
    """``ui`` in settings.json: the desktop window's choices."""

    # closing the window while the server runs: keep serving (in the tray, or in the background
    # where there is none; "ask" asks there), or quit
    close_action: str = "ask"
    theme: str = "system"
    window: WindowState = field(default_factory=WindowState)


@dataclass(frozen=True, slots=True)
class LimitsSettings:
    """The server-wide token buckets: requests and tokens per minute; 0 = off."""

    rpm: int = 0
    tpm: int = 0


LIMITS_ON_FAILURE = ("open", "closed")


@dataclass(frozen=True, slots=True)
class StateSettings:
    """``state`` in settings.json: state several gateways share. ``url``: a Redis (or Valkey)
    URL, "" = every piece in process (``hearth serve --state`` wins). ``limits_on_failure``:
    while it is unreachable, rate-limited callers are admitted on this gateway's own buckets
    (open) or refused with 503 (closed)."""

    url: str = ""
    limits_on_failure: str = "open"


@dataclass(frozen=True, slots=True)
class McpSettings:
    """``mcp`` in settings.json: the chat's MCP tool calls (servers: mcp.json)."""

    call_timeout_s: float = 60.0  # one tool call, then a timeout result the model reads
    max_rounds: int = 8  # tool rounds per answer before the loop ends with a notice
    start_timeout_s: float = 30.0  # a server that has not answered by then is in error


@dataclass(frozen=True, slots=True)
class ChatSettings:
    """``chat`` in settings.json: the Chat page's choices."""

    # the model that embeds attached files too big to go in whole; "" = the library's first
    embedding_model: str = ""
    # the model picked last on the Chat page, chosen again at the next start ("" = none yet)
    last_model: str = ""


FETCH_URLS = ("local-clients", "all", "off")


@dataclass(frozen=True, slots=True)
class VisionSettings:
    """``vision`` in settings.json: images in requests. ``fetch_urls``: http(s) image
    URLs are fetched for requests from this machine only (local-clients), for all, or never
    (off); private addresses are refused in every mode."""

    fetch_urls: str = "local-clients"
    max_pixels: int = 16_777_216  # checked on the header, before decoding (4096 x 4096)
    max_image_bytes: int = 20 * 1024 * 1024  # the encoded image, inline or fetched
    # one request's images together, decoded (4 x 4096 x 4096: about 200 MB of RGB)
    max_request_pixels: int = 67_108_864
    fetch_timeout_s: float = 10.0
    max_redirects: int = 3

    def limits(self) -> ImageLimits:
        """The decoder's bounds these settings give (server, Chat page and ``hearth run``)."""
        return ImageLimits(
            max_pixels=self.max_pixels,
            max_bytes=self.max_image_bytes,
            max_request_pixels=self.max_request_pixels,
        )


@dataclass(frozen=True, slots=True)
class AudioSettings:
    """``audio`` in settings.json: speech-to-text uploads. ``max_bytes``: the uploaded file
    (OpenAI's 25 MB), checked while it streams in; ``max_seconds``: the audio's length,
    checked on the container's header and again while decoding (an hour of 16 kHz audio is
    230 MB of samples in memory)."""

    max_bytes: int = 25 * 1024 * 1024
    max_seconds: float = 3600.0


@dataclass(frozen=True, slots=True)
class Settings:
    server: ServerSettings = field(default_factory=ServerSettings)
    load: LoadDefaults = field(default_factory=LoadDefaults)
    prompt_cache: PromptCacheSettings = field(default_factory=PromptCacheSettings)
    downloads: DownloadSettings = field(default_factory=DownloadSettings)
    models_dir: str = ""  # empty = the default models folder
    tray_hint_shown: bool = False
    # the model (id or alias) a request that names none gets; empty = a 400
    default_model: str = ""
    routing: RoutingSettings = field(default_factory=lambda: RoutingSettings())
    # first run: the OS autostart (its entry is the truth; this is what the user chose)
    start_at_login: bool = False
    ui: UiSettings = field(default_factory=UiSettings)
    records: RecordSettings = field(default_factory=RecordSettings)
    limits: LimitsSettings = field(default_factory=LimitsSettings)
    cache: CacheConfig = field(default_factory=CacheConfig)  # the response cache
    mcp: McpSettings = field(default_factory=McpSettings)  # MCP tools in the chat
    chat: ChatSettings = field(default_factory=ChatSettings)  # the Chat page
    vision: VisionSettings = field(default_factory=VisionSettings)  # images
    # stored Responses (``store``): how long and how many bytes
    responses: ResponseStoreConfig = field(default_factory=ResponseStoreConfig)
    state: StateSettings = field(default_factory=StateSettings)  # shared by several gateways
    audio: AudioSettings = field(default_factory=AudioSettings)  # speech-to-text uploads

    def routing_config(self) -> Routing:
        return Routing(self.default_model, self.routing.auto)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["routing"] = {"auto": rules_to_json(self.routing.auto)}
        if not self.load.context_length:
            d["load"]["context_length"] = "auto"
        return d


def _coerce(cls: type, raw: Any, where: str) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"settings: {where} must be an object")
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        if f.name not in raw:
            continue
        v = raw[f.name]
        default = getattr(cls(), f.name)
        if isinstance(default, bool):
            if not isinstance(v, bool):
                raise ConfigError(f"settings: {where}.{f.name} must be true or false")
        elif isinstance(default, int):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"settings: {where}.{f.name} must be a non-negative integer")
        elif isinstance(default, float):
            if (
                isinstance(v, bool)
                or not isinstance(v, int | float)
                or not math.isfinite(v)
                or v <= 0
            ):
                raise ConfigError(f"settings: {where}.{f.name} must be a positive number")
            v = float(v)
        elif isinstance(default, tuple):
            if not isinstance(v, list | tuple) or not all(isinstance(x, str) for x in v):
                raise ConfigError(f"settings: {where}.{f.name} must be a list of strings")
            v = tuple(v)
        elif isinstance(default, str):
            if not isinstance(v, str):
                raise ConfigError(f"settings: {where}.{f.name} must be a string")
        kwargs[f.name] = v
    return cls(**kwargs)


def settings_from_dict(raw: dict[str, Any]) -> Settings:
    server = _coerce(ServerSettings, raw.get("server", {}), "server")
    if not 0 <= server.port < 65536:  # 0 = any free port
        raise ConfigError("settings: server.port must be 0-65535")
    for name in ("max_incomplete_connections", "max_incomplete_per_client"):
        if getattr(server, name) < 1:
            raise ConfigError(f"settings: server.{name} must be at least 1")
    load_raw = raw.get("load", {})
    if isinstance(load_raw, dict) and load_raw.get("context_length") == "auto":
        load_raw = {**load_raw, "context_length": 0}
    load = _coerce(LoadDefaults, load_raw, "load")
    if load.max_auto_context < 256:
        raise ConfigError("settings: load.max_auto_context must be at least 256")
    for name in LOAD_DEFAULT_OPTIONS:  # the load options a default exists for: the table's ranges
        spec = SPECS[name]
        try:
            spec.check(getattr(load, name))
        except InvalidRequest:
            raise ConfigError(f"settings: load.{name} must be {spec.describe_range()}") from None
    downloads = _coerce(DownloadSettings, raw.get("downloads", {}), "downloads")
    if downloads.max_concurrent < 1:
        raise ConfigError("settings: downloads.max_concurrent must be at least 1")
    cache = _coerce(PromptCacheSettings, raw.get("prompt_cache", {}), "prompt_cache")
    try:
        SPECS["prompt_cache"].check(cache.mode)
    except InvalidRequest:
        raise ConfigError(
            "settings: prompt_cache.mode must be " + SPECS["prompt_cache"].describe_range()
        ) from None
    records = _coerce(RecordSettings, raw.get("records", {}), "records")
    if records.max_rows < 1:
        raise ConfigError("settings: records.max_rows must be at least 1")
    top: dict[str, Any] = {
        k: raw[k] for k in ("models_dir", "tray_hint_shown", "default_model") if k in raw
    }
    top.update({k: raw[k] for k in FIRST_RUN_KEYS if k in raw})
    base = _coerce(Settings, top, "settings")
    routing_raw = raw.get("routing", {})
    if not isinstance(routing_raw, dict):
        raise ConfigError("settings: routing must be an object")
    routing = RoutingSettings(parse_rules(routing_raw.get("auto")))
    return replace(
        base,
        server=server,
        load=load,
        prompt_cache=cache,
        downloads=downloads,
        routing=routing,
        ui=_ui_from_dict(raw.get("ui", {}), legacy_quit=raw.get("keep_in_tray") is False),
        records=records,
        limits=_coerce(LimitsSettings, raw.get("limits", {}), "limits"),
        cache=_cache_from_dict(raw.get("cache", {})),
        mcp=_mcp_from_dict(raw.get("mcp", {})),
        chat=_coerce(ChatSettings, raw.get("chat", {}), "chat"),
        vision=_vision_from_dict(raw.get("vision", {})),
        responses=_responses_from_dict(raw.get("responses", {})),
        state=_state_from_dict(raw.get("state", {})),
        audio=_audio_from_dict(raw.get("audio", {})),
    )


def _audio_from_dict(raw: Any) -> AudioSettings:
    audio = _coerce(AudioSettings, raw, "audio")
    if audio.max_bytes < 1:
        raise ConfigError("settings: audio.max_bytes must be at least 1")
    return audio


def _state_from_dict(raw: Any) -> StateSettings:
    state = _coerce(StateSettings, raw, "state")
    if state.limits_on_failure not in LIMITS_ON_FAILURE:
        raise ConfigError("settings: state.limits_on_failure must be one of open, closed")
    if state.url:
        from app.redis_state.connection import check_url  # redis is imported only when used

        try:
            check_url(state.url)
        except ValueError as e:
            raise ConfigError(f"settings: state.url: {e}") from None
    return state


def _responses_from_dict(raw: Any) -> ResponseStoreConfig:
    responses = _coerce(ResponseStoreConfig, raw, "responses")
    if responses.max_bytes < 1:
        raise ConfigError("settings: responses.max_bytes must be at least 1")
    return responses


def _vision_from_dict(raw: Any) -> VisionSettings:
    vision = _coerce(VisionSettings, raw, "vision")
    if vision.fetch_urls not in FETCH_URLS:
        raise ConfigError("settings: vision.fetch_urls must be one of " + ", ".join(FETCH_URLS))
    if min(vision.max_pixels, vision.max_image_bytes, vision.max_request_pixels) < 1:
        raise ConfigError(
            "settings: vision.max_pixels, max_image_bytes and max_request_pixels must be at least 1"
        )
    return vision


def _mcp_from_dict(raw: Any) -> McpSettings:
    mcp = _coerce(McpSettings, raw, "mcp")
    if mcp.max_rounds < 1:
        raise ConfigError("settings: mcp.max_rounds must be at least 1")
    return mcp


def _cache_from_dict(raw: Any) -> CacheConfig:
    cache = _coerce(CacheConfig, raw, "cache")
    if cache.mode not in CACHE_MODES:
        raise ConfigError("settings: cache.mode must be one of " + ", ".join(CACHE_MODES))
    if cache.scope not in CACHE_SCOPES:
        raise ConfigError("settings: cache.scope must be one of " + ", ".join(CACHE_SCOPES))
    if cache.max_entries < 1:
        raise ConfigError("settings: cache.max_entries must be at least 1")
    if cache.semantic_threshold > 1:
        raise ConfigError("settings: cache.semantic_threshold must be in (0, 1]")
    return cache


def _ui_from_dict(raw: Any, *, legacy_quit: bool = False) -> UiSettings:
    if not isinstance(raw, dict):
        raise ConfigError("settings: ui must be an object")
    ui = _coerce(UiSettings, {k: v for k, v in raw.items() if k != "window"}, "ui")
    if legacy_quit and "close_action" not in raw:
        ui = replace(ui, close_action="quit")
    if ui.close_action not in CLOSE_ACTIONS:
        raise ConfigError("settings: ui.close_action must be one of " + ", ".join(CLOSE_ACTIONS))
    if ui.theme not in THEMES:
        raise ConfigError("settings: ui.theme must be one of " + ", ".join(THEMES))
    win = raw.get("window", {})
    if not isinstance(win, dict):
        raise ConfigError("settings: ui.window must be an object")
    # x and y may be negative (a screen left of or above the primary one): not _coerce's rule
    for name in ("x", "y", "width", "height"):
        v = win.get(name, 0)
        if isinstance(v, bool) or not isinstance(v, int) or abs(v) > 1_000_000:
            raise ConfigError(f"settings: ui.window.{name} must be an integer")
    window = _coerce(
        WindowState, {k: v for k, v in win.items() if k not in ("x", "y")}, "ui.window"
    )
    return replace(ui, window=replace(window, x=win.get("x", 0), y=win.get("y", 0)))


class SettingsStore:
    """Reads and writes ``settings.json``; a corrupt file falls back to defaults (and says so).

    ``load()`` is what requests call (load defaults, JIT, TTL, budget): it answers from memory,
    re-reading the file only when a stat, at most once a second, shows another process replaced
    it. Every store of one file in this process shares that memory, so a save is seen at once.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        remove_stale_writes(path)  # left by a write that was killed mid-way
        self._cache: FileCache[Settings] = filecache.shared(path, "settings")

    def load(self) -> Settings:
        return self._cache.get(self._read)

    def _read(self) -> Settings:
        try:
            raw = read_json(self.path, {})
        except ValueError as e:
            log.error("settings file %s is invalid (%s); using defaults", self.path, e)
            return Settings()
        return self._parse(raw)

    def _parse(self, raw: Any) -> Settings:
        try:
            return settings_from_dict(raw if isinstance(raw, dict) else {})
        except ConfigError as e:
            log.error("settings file %s is invalid (%s); using defaults", self.path, e)
            return Settings()

    def save(self, settings: Settings) -> None:
        with file_lock(self.path):
            self._write(settings)

    def update(self, **changes: Any) -> Settings:
        with file_lock(self.path):
            s = replace(self._read(), **changes)  # the file as it is now, not as cached
            self._write(s)
        return s

    def update_ui(self, **changes: Any) -> Settings:
        """Change ``ui`` fields, the rest of ``ui`` as in the file now (the window's place and
        a close choice may be written from two threads at once)."""
        with file_lock(self.path):
            s = self._read()
            s = replace(s, ui=replace(s.ui, **changes))
            self._write(s)
        return s

    def change(self, edit: Callable[[Settings], Settings]) -> Settings:
        """Write ``edit`` of the file as it is now (not as cached), under the file lock: what
        another process or page wrote meanwhile to fields ``edit`` leaves alone survives."""
        with file_lock(self.path):
            s = edit(self._read())
            self._write(s)
        return s

    def _write(self, settings: Settings) -> None:
        raw = settings.to_dict()
        atomic_write_json(self.path, raw, mode=0o600)
        self._cache.put(self._parse(raw))  # what a read of the file would give


# -- the Hugging Face token ---------------------------------------------------------------
class TokenStore:
    """The Hugging Face access token, alone in a 0600 file beside settings.json (never in it, so
    sharing or logging the settings never leaks it)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> str | None:
        try:
            token = self.path.read_text().strip()
        except (OSError, UnicodeDecodeError):
            return None
        return token or None

    def save(self, token: str | None) -> None:
        """Store ``token`` (None or empty: forget it).

        Raises:
            ConfigError: the token has whitespace or control characters.
        """
        token = (token or "").strip()
        if not token:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            return
        if any(c.isspace() or ord(c) < 32 for c in token) or len(token) > 1024:
            raise ConfigError("the Hugging Face token must be one line without spaces")
        atomic_write_bytes(self.path, token.encode() + b"\n", mode=0o600)
