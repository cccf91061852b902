"""Real OpenAI-compatible engines on loopback, for end-to-end tests of remote providers.

Three kinds, each a real child process in its own process group, with its stderr in a file
under the test's tmp_path:
- a second `hearth serve` (its own HEARTH_HOME, the given GGUFs imported);
- llama-cpp-python's own server, `python -m llama_cpp.server` (the `[server]` extra);
- llama.cpp's `llama-server` binary, when one is built (see `llama_server_binary()`).

`EngineSet` (the `engines` fixture in tests/e2e/conftest.py) closes everything it started,
even when the test failed; an atexit hook kills whatever a crashed run left behind.
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.e2e.serveproc import start_serve

READY_DEADLINE_S = 240.0  # a shared 2-core machine loading a model while others compile
HEARTH_CTX = 1024
LLAMA_SERVER_DEFAULT = Path(
    "/work/llsrv/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/llama-server"
)
LLAMA_SERVER_HOWTO = (
    "llama.cpp's llama-server is not built: set HEARTH_LLAMA_SERVER to a llama-server binary, "
    "put one on PATH, or build it from the sources llama-cpp-python vendors: "
    "`pip download --no-binary :all: --no-deps llama-cpp-python==0.3.36`, unpack it, then in "
    "vendor/llama.cpp: `cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF "
    "-DLLAMA_BUILD_TESTS=OFF && cmake --build build --target llama-server -j2`"
)

# every engine not closed or killed yet, held (not weakly) so that one a test forgot is still
# killed at exit
_live: set[Engine] = set()


class EngineStartError(RuntimeError):
    """An engine exited or never answered ready; the message carries its stderr tail."""


@dataclass
class Reply:
    status: int  # 0 when the connection failed or timed out
    body: Any  # parsed JSON, else text; None when nothing came back
    raw: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    complete: bool = True  # False when the body was cut off before its end


def http_request(
    url: str,
    method: str = "GET",
    body: Any = None,
    *,
    timeout: float = 120,
    headers: dict[str, str] | None = None,
    raw: bytes | None = None,
) -> Reply:
    """One HTTP exchange read to the end (works for SSE too: the raw text is kept)."""
    u = urllib.parse.urlsplit(url)
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port, timeout=timeout)
    complete = True
    try:
        conn.request(method, u.path + (f"?{u.query}" if u.query else ""), body=data, headers=hdrs)
        resp = conn.getresponse()
        status, rh = resp.status, {k.lower(): v for k, v in resp.getheaders()}
        try:
            payload = resp.read()
        except http.client.IncompleteRead as cut:
            # the engine closed mid-body (a stream it abandoned): keep what arrived
            payload, complete = cut.partial, False
    except (OSError, http.client.HTTPException):
        return Reply(0, None)
    finally:
        conn.close()
    try:
        parsed: Any = json.loads(payload)
    except ValueError:
        parsed = payload.decode(errors="replace")
    return Reply(status, parsed, payload, rh, complete)


def sse_events(raw: str | bytes) -> list[Any]:
    """The JSON payloads of an SSE body's `data:` lines (the `[DONE]` sentinel dropped)."""
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    out: list[Any] = []
    for line in text.splitlines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data and data != "[DONE]":
            out.append(json.loads(data))
    return out


def free_port() -> int:
    """A loopback port the kernel just handed out (bound and closed; callers retry a lost race)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(eq=False)
class Engine:
    """A running engine process: its URLs, its models, and signals a test sends it."""

    kind: str  # "hearth" | "llama-cpp-python" | "llama.cpp"
    proc: subprocess.Popen[Any]
    root: str  # http://127.0.0.1:PORT
    log: Path  # its stderr
    models: dict[str, str] = field(default_factory=dict)  # role/name -> model id it serves
    api_key: str | None = None
    home: Path | None = None  # the HEARTH_HOME of a hearth engine

    @property
    def base_url(self) -> str:
        return self.root + "/v1"

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def port(self) -> int:
        return int(urllib.parse.urlsplit(self.root).port or 0)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def auth(self, key: str | None = None) -> dict[str, str]:
        k = key if key is not None else self.api_key
        return {"Authorization": f"Bearer {k}"} if k else {}

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        timeout: float = 120,
        key: str | None = None,
        headers: dict[str, str] | None = None,
        raw: bytes | None = None,
    ) -> Reply:
        """`path` is from the root ("/v1/models", "/health"); sends the engine's key unless
        ``key`` overrides it."""
        return http_request(
            self.root + path,
            method,
            body,
            timeout=timeout,
            headers={**self.auth(key), **(headers or {})},
            raw=raw,
        )

    def get(self, path: str, **kw: Any) -> Reply:
        return self.request("GET", path, **kw)

    def post(self, path: str, body: Any, **kw: Any) -> Reply:
        return self.request("POST", path, body, **kw)

    def stderr_tail(self, n: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""

    def _signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def stop(self) -> None:
        """SIGSTOP the engine's process group: connections are accepted, nothing answers.
        Returns once every thread of the engine is stopped (a signal is delivered to each
        thread when it next runs: until then one could still answer)."""
        self._signal(signal.SIGSTOP)
        deadline = time.monotonic() + 30
        while not _all_threads_stopped(self.proc.pid):
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.kind} engine did not stop within 30 s")
            time.sleep(0.01)

    def cont(self) -> None:
        self._signal(signal.SIGCONT)

    def kill(self) -> int:
        """SIGKILL the whole process group and reap it; returns the exit status."""
        self._signal(signal.SIGKILL)
        rc = self.proc.wait(60)
        _live.discard(self)
        return rc

    def close(self) -> None:
        """SIGTERM (after a SIGCONT, in case a test left it stopped), SIGKILL if it lingers."""
        if self.alive():
            self.cont()
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.proc.wait(30)
        else:
            # the leader is gone; make sure nothing it spawned lingers in its group
            self._signal(signal.SIGKILL)
        _live.discard(self)


def _all_threads_stopped(pid: int) -> bool:
    """Every thread of ``pid`` in state T (stopped), from /proc; True when it is gone."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:
        return True
    for t in tasks:
        try:
            stat = (t / "stat").read_text()
        except FileNotFoundError:
            continue  # a thread that just exited
        if stat.rsplit(")", 1)[1].split()[0] not in ("T", "t"):
            return False
    return True


@atexit.register
def _kill_leftovers() -> None:
    for e in list(_live):
        with contextlib.suppress(Exception):
            e.kill()


def listens_on(pid: int, port: int) -> bool | None:
    """Whether process ``pid`` holds the loopback LISTEN socket on ``port`` (None: no /proc)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
        rows = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return None
    inodes = set()
    for fd in fds:
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    for row in rows:
        cols = row.split()
        # local_address is HEXIP:HEXPORT; state 0A is LISTEN; column 9 is the inode
        if int(cols[1].split(":")[1], 16) == port and cols[3] == "0A" and cols[9] in inodes:
            return True
    return False


def _wait_ready(engine: Engine, path: str, deadline_s: float) -> None:
    """Poll ``path`` until 200; 503 (llama.cpp loading) and refused connections keep waiting.

    It asks only once the engine itself holds the listening socket (read from /proc): with the
    port lost to a race, an answer could come from whoever won it.
    """
    end = time.monotonic() + deadline_s
    last = "no answer"
    while time.monotonic() < end:
        if not engine.alive():
            raise EngineStartError(
                f"{engine.kind} exited with {engine.proc.returncode} before it was ready; "
                f"stderr:\n{engine.stderr_tail()}"
            )
        if listens_on(engine.pid, engine.port) is False:
            last = "not listening yet"  # still loading, or its port was lost to a race
            time.sleep(0.25)
            continue
        r = engine.get(path, timeout=10)
        if r.status == 200:
            return
        last = f"{r.status} {str(r.body)[:200]}" if r.status else "connection refused/timed out"
        time.sleep(0.25)
    engine.kill()
    raise EngineStartError(
        f"{engine.kind} not ready on {engine.root}{path} within {deadline_s:.0f}s "
        f"(last: {last}); stderr:\n{engine.stderr_tail()}"
    )


_BIND_ERRORS = ("address already in use", "couldn't bind", "failed to bind", "errno 98")


def _launch(
    kind: str,
    argv: Callable[[int], list[str]],
    log: Path,
    *,
    ready_path: str,
    models: dict[str, str],
    api_key: str | None,
    env: dict[str, str] | None = None,
    deadline_s: float = READY_DEADLINE_S,
    ports: Callable[[], int] | None = None,
) -> Engine:
    """Start ``argv(port)`` on a fresh free port; one retry when the port was taken meanwhile.

    ``ports`` (default `free_port`) is a seam for the test that proves the retry.
    """
    for attempt in (1, 2):
        port = (ports or free_port)()
        with log.open("w") as fh:
            proc = subprocess.Popen(
                argv(port),
                stdin=subprocess.DEVNULL,
                stdout=fh,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its own process group: stop/cont/kill reach all of it
            )
        engine = Engine(kind, proc, f"http://127.0.0.1:{port}", log, models, api_key)
        _live.add(engine)
        try:
            _wait_ready(engine, ready_path, deadline_s)
            return engine
        except EngineStartError:
            engine.close()
            tail = engine.stderr_tail().lower()
            if attempt == 1 and any(m in tail for m in _BIND_ERRORS):
                log.rename(log.with_suffix(".bind-race.log"))
                continue
            raise
    raise AssertionError("unreachable")


# --- hearth serve --------------------------------------------------------------------------


def start_hearth_engine(
    tmp_path: Path,
    models: list[Path],
    *,
    api_key: str | None = None,
    settings: dict[str, Any] | None = None,
    name: str = "hearth-engine",
) -> Engine:
    """A second `hearth serve --port 0` with its own HEARTH_HOME and ``models`` imported.

    ``Engine.models`` maps each file's stem to the id Hearth gave it. `--port 0` means the
    server binds first and prints its URL, so there is no port race to retry.
    """
    home = tmp_path / name
    args = ("--api-key", api_key) if api_key else ()
    try:
        sp = start_serve(
            home,
            *models,
            settings={
                **(settings or {}),
                "load": {"context_length": HEARTH_CTX, **(settings or {}).get("load", {})},
            },
            args=args,
            new_session=True,
        )
    except RuntimeError as e:
        log = home / "serve.stderr"
        tail = log.read_text(errors="replace")[-4000:] if log.exists() else ""
        raise EngineStartError(f"hearth serve did not start: {e}; stderr:\n{tail}") from e
    engine = Engine(
        "hearth", sp.proc, sp.root, home / "serve.stderr", dict(sp.models), api_key, home=home
    )
    _live.add(engine)
    try:
        _wait_ready(engine, "/v1/models", READY_DEADLINE_S)
    except BaseException:
        engine.close()
        raise
    return engine


# --- llama-cpp-python's server ---------------------------------------------------------------


def start_llama_cpp_python(
    tmp_path: Path,
    chat_gguf: Path,
    embedding_gguf: Path | None = None,
    *,
    api_key: str | None = None,
    chat_alias: str = "smollm2",
    embedding_alias: str = "minilm",
    n_ctx: int = 1024,
    name: str = "llama-cpp-python",
    ports: Callable[[], int] | None = None,
) -> Engine:
    """`python -m llama_cpp.server` with a JSON `--config_file` naming each model by alias.

    It keeps ONE model in memory and swaps on a request for another alias; an id it does not
    know silently falls back to the first model (the chat one).
    """
    d = tmp_path / name
    d.mkdir(parents=True, exist_ok=True)
    entries = [
        {
            "model": str(chat_gguf),
            "model_alias": chat_alias,
            "n_ctx": n_ctx,
            "n_threads": 1,
            "n_threads_batch": 1,
            "verbose": False,
        }
    ]
    aliases = {"chat": chat_alias}
    if embedding_gguf is not None:
        entries.append(
            {
                "model": str(embedding_gguf),
                "model_alias": embedding_alias,
                "embedding": True,
                "n_ctx": min(n_ctx, 512),
                "n_threads": 1,
                "n_threads_batch": 1,
                "verbose": False,
            }
        )
        aliases["embedding"] = embedding_alias

    def argv(port: int) -> list[str]:
        cfg = {"host": "127.0.0.1", "port": port, "models": entries}
        if api_key:
            cfg["api_key"] = api_key
        path = d / "config.json"
        path.write_text(json.dumps(cfg, indent=1))
        return [sys.executable, "-c", _NO_EXTRA_BUFTS_SERVER, "--config_file", str(path)]

    env = {**os.environ}
    env.pop("CONFIG_FILE", None)  # it would override --config_file
    return _launch(
        "llama-cpp-python",
        argv,
        d / "server.log",
        ready_path="/v1/models",
        models=aliases,
        api_key=api_key,
        env=env,
        ports=ports,
    )


# --- llama.cpp's llama-server ----------------------------------------------------------------


def llama_server_binary() -> Path | None:
    """HEARTH_LLAMA_SERVER, then `llama-server` on PATH, then the vendored build, else None."""
    env = os.environ.get("HEARTH_LLAMA_SERVER")
    candidates = [Path(env)] if env else []
    found = shutil.which("llama-server")
    if found:
        candidates.append(Path(found))
    candidates.append(LLAMA_SERVER_DEFAULT)
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    return None


def require_llama_server() -> Path:
    """The llama-server binary, or a pytest skip that says how to build one."""
    import pytest

    b = llama_server_binary()
    if b is None:
        pytest.skip(LLAMA_SERVER_HOWTO)
    return b


def start_llama_server(
    tmp_path: Path,
    gguf: Path,
    *,
    embedding: bool = False,
    rerank: bool = False,
    api_key: str | None = None,
    alias: str | None = None,
    n_ctx: int = 1024,
    binary: Path | None = None,
    name: str | None = None,
    ports: Callable[[], int] | None = None,
) -> Engine:
    """llama.cpp's `llama-server` serving one GGUF as ``alias`` (default: smollm2, minilm for
    ``embedding``, reranker for ``rerank``: a cross-encoder, see tests/support/cross_encoder.py)."""
    exe = binary or llama_server_binary()
    if exe is None:
        raise EngineStartError(LLAMA_SERVER_HOWTO)
    alias = alias or ("reranker" if rerank else "minilm" if embedding else "smollm2")
    d = tmp_path / (name or f"llama-server-{alias}")
    d.mkdir(parents=True, exist_ok=True)

    def argv(port: int) -> list[str]:
        a = llama_server_argv(exe, gguf, port, alias=alias, n_ctx=n_ctx, api_key=api_key)
        if embedding:
            a.append("--embeddings")
        if rerank:
            a.append("--rerank")
        return a

    # /health is public and answers 503 while the model loads, 200 once it can serve
    return _launch(
        "llama.cpp",
        argv,
        d / "server.log",
        ready_path="/health",
        models={"rerank" if rerank else "embedding" if embedding else "chat": alias},
        api_key=api_key,
        env={**os.environ, "LD_LIBRARY_PATH": _ld_path(exe)},
        ports=ports,
    )


# llama-cpp-python's server with llama.cpp's extra buffer types off, as Hearth runs on a CPU
# whose AMX path crashes (some Xeons; the server has no setting for it)
_NO_EXTRA_BUFTS_SERVER = """
import runpy
import llama_cpp.llama_cpp as C
_defaults = C.llama_model_default_params
def _params():
    p = _defaults()
    p.use_extra_bufts = False
    return p
C.llama_model_default_params = _params
runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)
"""


def llama_server_argv(
    exe: Path,
    gguf: Path,
    port: int,
    *,
    alias: str,
    n_ctx: int = 1024,
    threads: int = 1,
    parallel: int = 1,
    api_key: str | None = None,
    repack: bool = False,
) -> list[str]:
    """The command line of a loopback llama-server (the tests', the recorder's, the bench's).
    Without ``repack``, its extra buffer types are off (`--no-repack`): llama.cpp's AMX path
    crashes on some Xeons, where Hearth's probe turns them off too."""
    a = [str(exe), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
         "-t", str(threads), "-tb", str(threads), "-c", str(n_ctx), "--alias", alias,
         "-np", str(parallel)]  # fmt: skip
    if not repack:
        a.append("--no-repack")
    if api_key:
        a += ["--api-key", api_key]
    return a


def _ld_path(exe: Path) -> str:
    # a shared-library build keeps libllama/libggml next to the binary
    cur = os.environ.get("LD_LIBRARY_PATH", "")
    return f"{exe.parent}:{cur}" if cur else str(exe.parent)


# --- a set of engines a fixture owns ---------------------------------------------------------


class EngineSet:
    """Starts engines under one tmp folder and closes every one of them at the end."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self._engines: list[Engine] = []

    def _own(self, e: Engine) -> Engine:
        self._engines.append(e)
        return e

    def hearth(self, models: list[Path], **kw: Any) -> Engine:
        kw.setdefault("name", f"hearth-engine-{len(self._engines)}")
        return self._own(start_hearth_engine(self.tmp_path, models, **kw))

    def llama_cpp_python(
        self, chat_gguf: Path, embedding_gguf: Path | None = None, **kw: Any
    ) -> Engine:
        kw.setdefault("name", f"llama-cpp-python-{len(self._engines)}")
        return self._own(start_llama_cpp_python(self.tmp_path, chat_gguf, embedding_gguf, **kw))

    def llama_server(self, gguf: Path, **kw: Any) -> Engine:
        kw.setdefault("name", f"llama-server-{len(self._engines)}")
        return self._own(start_llama_server(self.tmp_path, gguf, **kw))

    def close(self) -> None:
        for e in reversed(self._engines):
            with contextlib.suppress(Exception):
                e.close()
        self._engines.clear()
