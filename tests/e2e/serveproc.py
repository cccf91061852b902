"""A real `hearth serve` in a child process, for tests where a native crash must show as a
failure (a segfault in the test process would take pytest down with it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.paths import AppPaths
from tests.support import probes


@dataclass
class ServeProc:
    home: Path
    proc: subprocess.Popen[str]
    root: str  # http://127.0.0.1:PORT
    models: dict[str, str] = field(default_factory=dict)  # file stem -> model id

    @property
    def base_url(self) -> str:
        return self.root + "/v1"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        timeout: float = 120,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        """(status, parsed JSON or text); status 0 when the connection broke."""
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        req = urllib.request.Request(
            self.root + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json", **(headers or {})},
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                status, payload = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, payload = e.code, e.read()
        except (OSError, urllib.error.URLError):
            return 0, None
        try:
            return status, json.loads(payload)
        except ValueError:
            return status, payload.decode(errors="replace")

    def post(self, path: str, body: Any, **kw: Any) -> tuple[int, Any]:
        return self.request("POST", path, body, **kw)

    def get(self, path: str, **kw: Any) -> tuple[int, Any]:
        return self.request("GET", path, **kw)

    def health_seconds(self) -> float:
        """How long /health took to answer (raises when it did not answer with 200)."""
        t0 = time.monotonic()
        st, _ = self.get("/health", timeout=30)
        if st != 200:
            raise AssertionError(f"/health answered {st}; server alive: {self.alive()}")
        return time.monotonic() - t0

    def stderr_tail(self) -> str:
        log = self.home / "serve.stderr"
        return log.read_text(errors="replace")[-4000:] if log.exists() else ""

    def stop(self) -> int:
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        probes.keep(AppPaths.default(self.home).probe_file)
        return self.proc.returncode


def start_serve(
    home: Path,
    *model_files: Path,
    settings: dict[str, Any] | None = None,
    env_extra: dict[str, str] | None = None,
    args: tuple[str, ...] = (),
    new_session: bool = False,
    verbose: int = 0,
    cwd: Path | None = None,
) -> ServeProc:
    """Import ``model_files`` into a fresh HEARTH_HOME and run `hearth serve --port 0` there.

    ``new_session`` puts the server in its own process group (tests that SIGSTOP/SIGKILL it).
    ``cwd`` runs the `app` package of another checkout (a benchmark's baseline).
    """
    cfg = home / "config"
    cfg.mkdir(parents=True, exist_ok=True)
    base = {"load": {"context_length": 2048}}
    for k, v in (settings or {}).items():
        base[k] = {**base.get(k, {}), **v} if isinstance(v, dict) else v
    (cfg / "settings.json").write_text(json.dumps(base))
    probes.seed(AppPaths.default(home).probe_file)
    env = {**os.environ, "HEARTH_HOME": str(home), **(env_extra or {})}
    env.pop("HEARTH_API_KEY", None)
    models: dict[str, str] = {}
    for f in model_files:
        r = subprocess.run(
            [sys.executable, "-m", "app", "import", str(f)],
            env=env,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if r.returncode != 0:
            raise RuntimeError(f"import {f} failed: {r.stderr}")
        models[f.stem] = r.stdout.strip()
    err = (home / "serve.stderr").open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "app",
            *(["-" + "v" * verbose] if verbose else []),
            "serve",
            "--port",
            "0",
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=err,
        text=True,
        env=env,
        cwd=cwd,
        start_new_session=new_session,
    )
    line = proc.stdout.readline().strip() if proc.stdout else ""
    if not line.startswith(("http://", "https://")):
        proc.kill()
        raise RuntimeError(f"hearth serve did not start: {line!r}")
    return ServeProc(home, proc, line.removesuffix("/v1"), models)
