"""The MCP servers of mcp.json, each a client session (official ``mcp`` SDK) held open by its
own task on the Hearth loop. Lists their tools as Hearth ``Tool``s (``server__tool``), calls
them with a per-call timeout, and keeps each server's state (starting, running, error,
stopped, disabled) so one that fails to start, crashes or prints garbage is reported while
the others go on."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TextIO

import anyio

from app.core.inference.tools import Tool
from app.core.workspace.mcp.config import McpConfig, ServerConfig, load_config
from app.core.workspace.mcp.results import result_text
from app.errors import HearthError

log = logging.getLogger(__name__)

State = Literal["starting", "running", "error", "stopped", "disabled"]
CallStatus = Literal["ok", "error", "timeout"]
DEFAULT_CALL_TIMEOUT_S = 60.0
DEFAULT_START_TIMEOUT_S = 30.0
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
MAX_NAME = 64  # the longest function name OpenAI-style tool lists accept


@dataclass(frozen=True, slots=True)
class McpTool:
    """A server's tool as the model sees it: ``name`` is unique and safe (``server__tool``)."""

    name: str
    server: str
    tool: str  # the server's own name for it
    description: str
    input_schema: dict[str, Any]

    def as_tool(self) -> Tool:
        return Tool(self.name, self.description, self.input_schema)


@dataclass(frozen=True, slots=True)
class ServerStatus:
    name: str
    state: State
    transport: str
    tools: tuple[McpTool, ...] = ()
    error: str = ""

    @property
    def summary(self) -> str:
        """``running 3 tools`` / the error text, as the status list shows it."""
        if self.state == "running":
            n = len(self.tools)
            return f"running · {n} tool{'s' if n != 1 else ''}"
        if self.state == "error":
            return f"error: {self.error}"
        return self.state


@dataclass(frozen=True, slots=True)
class CallOutcome:
    """A tool call's end: ``content`` is what the tool message carries."""

    status: CallStatus
    content: str

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass(slots=True)
class _Server:
    config: ServerConfig
    state: State = "starting"
    error: str = ""
    tools: tuple[McpTool, ...] = ()
    session: Any = None
    task: asyncio.Task[None] | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    bad_output: str = ""
    stop_scope: Any = None  # the running part of its task: cancelled on garbage or stop

    def status(self) -> ServerStatus:
        return ServerStatus(
            self.config.name, self.state, self.config.transport, self.tools, self.error
        )


def safe_name(server: str, tool: str, taken: set[str]) -> str:
    """``server__tool`` with unsafe characters as ``_``, at most 64 characters, unique."""
    base = _UNSAFE.sub("_", f"{server}__{tool}")[:MAX_NAME]
    name, i = base, 2
    while name in taken:
        suffix = f"_{i}"
        name, i = base[: MAX_NAME - len(suffix)] + suffix, i + 1
    taken.add(name)
    return name


class McpManager:
    """Owns the MCP client sessions. Every method runs on the Hearth loop (the GUI reaches it
    through the bridge), so the GUI thread never waits on a server."""

    def __init__(
        self,
        config_path: Path,
        *,
        log_dir: Path | None = None,
        call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
        start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
        max_rounds: int = 8,
        on_change: Callable[[], None] | None = None,
        live: Callable[[], Any] | None = None,
    ) -> None:
        """``live``: returns the current ``mcp`` settings (call_timeout_s, start_timeout_s,
        max_rounds), read at each use so a change applies without a restart; without it the
        numbers given here apply."""
        self.config_path = config_path
        self.log_dir = log_dir
        self.call_timeout_s = call_timeout_s
        self.start_timeout_s = start_timeout_s
        self.max_rounds = max_rounds
        self.live = live
        self.on_change = on_change
        self.config_errors: dict[str, str] = {}
        self._servers: dict[str, _Server] = {}
        self._by_tool: dict[str, McpTool] = {}
        self._started = False

    def limit(self, name: str) -> Any:
        """``call_timeout_s``, ``start_timeout_s`` or ``max_rounds``, live where wired."""
        if self.live is not None:
            try:
                return getattr(self.live(), name)
            except Exception:  # an unreadable settings file: the numbers given at start
                log.warning("MCP: cannot read the mcp settings; using %s", name, exc_info=True)
        return getattr(self, name)

    # -- state -------------------------------------------------------------------------------
    def statuses(self) -> list[ServerStatus]:
        """Every server of mcp.json (a bad entry as an error) in file order."""
        out = [s.status() for s in self._servers.values()]
        out += [ServerStatus(n, "error", "", error=e) for n, e in self.config_errors.items()]
        return out

    def tools(self) -> list[McpTool]:
        """The tools of the running servers."""
        return [t for s in self._servers.values() if s.state == "running" for t in s.tools]

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self, config: McpConfig | None = None) -> list[ServerStatus]:
        """(Re)read mcp.json and start every enabled server; returns once each is running or
        failed. A file that cannot be used as a whole is raised (ConfigError)."""
        await self.stop()
        self._started = True
        cfg = config if config is not None else load_config(self.config_path)
        self.config_errors = dict(cfg.errors)
        for sc in cfg.servers:
            srv = _Server(sc)
            self._servers[sc.name] = srv
            if sc.disabled:
                srv.state = "disabled"
            else:
                srv.task = asyncio.create_task(self._run(srv), name=f"mcp:{sc.name}")
        await self._wait_ready(list(self._servers.values()))
        return self.statuses()

    async def ensure_started(self) -> list[ServerStatus]:
        """Start the servers unless they were started already (the Chat page, at its birth)."""
        if not self._started:
            await self.start()
        return self.statuses()

    async def restart(self, name: str | None = None) -> list[ServerStatus]:
        """Restart one server (or, with no name, re-read mcp.json and restart all)."""
        if name is None:
            return await self.start()
        srv = self._servers.get(name)
        if srv is None:
            raise HearthError(f"no MCP server named {name!r}")
        await self._stop_one(srv)
        fresh = _Server(srv.config)
        self._servers[name] = fresh
        if not fresh.config.disabled:
            fresh.task = asyncio.create_task(self._run(fresh), name=f"mcp:{name}")
            await self._wait_ready([fresh])
        else:
            fresh.state = "disabled"
        self._reindex()
        return self.statuses()

    async def stop(self) -> None:
        """Stop every server (a stdio server's process is ended and reaped)."""
        servers = list(self._servers.values())
        await asyncio.gather(*(self._stop_one(s) for s in servers), return_exceptions=True)
        self._servers.clear()
        self._by_tool.clear()
        self._started = False

    # -- calls ------------------------------------------------------------------------------
    def find(self, name: str) -> McpTool | None:
        return self._by_tool.get(name)

    async def call(
        self, name: str, arguments: dict[str, Any], *, timeout_s: float | None = None
    ) -> CallOutcome:
        """Call the tool exposed as ``name``. Never raises for the server's faults: a timeout,
        a crash or an error result come back as the outcome the model reads."""
        t = self._by_tool.get(name)
        srv = self._servers.get(t.server) if t is not None else None
        if t is None or srv is None:
            return CallOutcome("error", f"Error: there is no tool named {name!r}.")
        if srv.state != "running" or srv.session is None:
            return CallOutcome("error", f"Error: the MCP server {t.server!r} is not running.")
        limit = self.limit("call_timeout_s") if timeout_s is None else timeout_s
        try:
            with anyio.fail_after(limit):
                result = await srv.session.call_tool(t.tool, arguments)
        except TimeoutError:
            return CallOutcome("timeout", f"Error: the tool {t.tool} timed out after {limit:g} s.")
        except Exception as e:  # the SDK's MCPError, a closed connection, a transport fault
            text = str(e) or type(e).__name__
            if "closed" in text.lower() or isinstance(e, (anyio.ClosedResourceError, OSError)):
                self._fail(srv, "the server stopped (it exited or crashed); restart it")
            return CallOutcome("error", f"Error: calling {t.tool} failed: {text}")
        content = result_text(result)
        if getattr(result, "is_error", False):
            return CallOutcome("error", content)
        return CallOutcome("ok", content)

    # -- one server's task -------------------------------------------------------------------
    async def _run(self, srv: _Server) -> None:
        name = srv.config.name
        start_limit = float(self.limit("start_timeout_s"))
        errlog: TextIO | None = None
        try:
            async with contextlib.AsyncExitStack() as stack:
                errlog = self._open_errlog(name)
                if errlog is not None:
                    stack.callback(errlog.close)
                streams = await stack.enter_async_context(self._transport(srv.config, errlog))
                session = await stack.enter_async_context(self._session(srv, streams))
                with anyio.CancelScope() as scope:
                    srv.stop_scope = scope
                    with anyio.fail_after(start_limit):
                        await session.initialize()
                        listed = await session.list_tools()
                    srv.session = session
                    srv.tools = self._map_tools(name, listed.tools)
                    srv.state = "running"
                    self._reindex()
                    srv.ready.set()
                    self._changed()
                    log.info("MCP server %s: running, %d tools", name, len(srv.tools))
                    await srv.stop.wait()
                if srv.bad_output and not srv.stop.is_set():
                    raise _BadOutput(srv.bad_output)
        except TimeoutError:
            self._fail(srv, f"did not answer within {start_limit:g} s of starting")
        except _BadOutput as e:
            self._fail(srv, str(e))
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # noqa: BLE001 - a server's failure is its state, never ours
            self._fail(srv, _failure_text(e))
        finally:
            srv.session = None
            if srv.state == "running" or srv.state == "starting":
                srv.state = "stopped"
            srv.ready.set()
            self._reindex()
            self._changed()

    def _transport(self, sc: ServerConfig, errlog: TextIO | None) -> Any:
        if sc.url:
            import httpx2
            from mcp.client.streamable_http import streamable_http_client

            client = httpx2.AsyncClient(
                headers=sc.headers, timeout=httpx2.Timeout(30.0, read=300.0)
            )
            return _http(streamable_http_client(sc.url, http_client=client), client)
        import sys

        from mcp.client.stdio import StdioServerParameters, stdio_client

        params = StdioServerParameters(
            command=sc.command, args=list(sc.args), env=sc.env or None, cwd=sc.cwd
        )
        return stdio_client(params, errlog=errlog if errlog is not None else sys.stderr)

    def _session(self, srv: _Server, streams: Any) -> Any:
        from mcp.client.session import ClientSession

        async def on_message(message: Any) -> None:
            if isinstance(message, Exception) and not srv.bad_output:
                # a stdio server's stdout must carry only JSON-RPC: a log line there is fatal
                srv.bad_output = (
                    "printed something that is not JSON-RPC on stdout (a stdio server must "
                    "write its logs to stderr)"
                )
                scope = srv.stop_scope
                if scope is not None:
                    scope.cancel()

        read, write = streams
        return ClientSession(read, write, message_handler=on_message)

    def _open_errlog(self, name: str) -> TextIO | None:
        """The server's stderr goes to logs/mcp-NAME.log (it is the server's own log)."""
        if self.log_dir is None:
            return None
        try:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            return open(  # noqa: SIM115 - closed by the server's exit stack
                self.log_dir / f"mcp-{_UNSAFE.sub('_', name)}.log", "a", encoding="utf-8"
            )
        except OSError as e:
            log.warning("MCP server %s: cannot open its log: %s", name, e)
            return None

    def _map_tools(self, server: str, listed: list[Any]) -> tuple[McpTool, ...]:
        taken = {n for n in self._by_tool if self._by_tool[n].server != server}
        out = []
        for t in listed:
            schema = t.input_schema if isinstance(t.input_schema, dict) else {}
            out.append(
                McpTool(
                    safe_name(server, t.name, taken),
                    server,
                    t.name,
                    (t.description or "").strip(),
                    json.loads(json.dumps(schema)) or {"type": "object", "properties": {}},
                )
            )
        return tuple(out)

    async def _wait_ready(self, servers: list[_Server]) -> None:
        await asyncio.gather(*(s.ready.wait() for s in servers if s.task is not None))

    async def _stop_one(self, srv: _Server) -> None:
        srv.stop.set()
        scope = srv.stop_scope
        if scope is not None and srv.state != "running":
            scope.cancel()  # still starting: do not wait out its start timeout
        if srv.task is not None:
            try:
                # the SDK bounds its own shutdown (stdin closed, then SIGTERM, then SIGKILL)
                await asyncio.wait_for(asyncio.shield(srv.task), timeout=15.0)
            except (TimeoutError, Exception):
                srv.task.cancel()
                with contextlib.suppress(BaseException):
                    await srv.task
        if srv.state != "error":
            srv.state = "stopped"

    def _fail(self, srv: _Server, text: str) -> None:
        if srv.state != "error":
            log.warning("MCP server %s: %s", srv.config.name, text)
        srv.state, srv.error = "error", text
        srv.ready.set()
        self._reindex()
        self._changed()

    def _reindex(self) -> None:
        self._by_tool = {t.name: t for t in self.tools()}

    def _changed(self) -> None:
        if self.on_change is not None:
            try:
                self.on_change()
            except Exception:
                log.exception("MCP status listener failed")


class _BadOutput(Exception):
    pass


@contextlib.asynccontextmanager
async def _http(inner: Any, client: Any) -> Any:
    async with client, inner as streams:
        yield streams


def _failure_text(e: BaseException) -> str:
    """A readable reason from the SDK's (often grouped) exceptions."""
    while getattr(e, "exceptions", None):  # an ExceptionGroup from the SDK's task groups
        e = e.exceptions[0]  # type: ignore[attr-defined]
    if isinstance(e, FileNotFoundError):
        return f"cannot start: {e.strerror}: {e.filename}"
    if isinstance(e, OSError):
        return f"cannot start: {e}"
    text = str(e) or type(e).__name__
    return f"failed: {text}"
