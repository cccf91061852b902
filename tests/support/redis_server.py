"""A real ``redis-server`` (Debian's package) on a free loopback port, for tests of the shared
state: started in its own folder with persistence off, killed (SIGKILL) and restarted on the
same port to test what gateways do when it goes away and comes back."""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

READY_S = 20.0


def redis_binary() -> str | None:
    return shutil.which("redis-server") or shutil.which("valkey-server")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    def __init__(self, folder: Path, password: str | None = None) -> None:
        binary = redis_binary()
        if binary is None:
            pytest.skip("redis-server is not installed (apt-get install redis-server)")
        self.binary = binary
        self.folder = folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self.port = _free_port()
        self.password = password
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        args = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.folder),
            "--protected-mode", "no",
        ]  # fmt: skip
        if self.password:
            args += ["--requirepass", self.password]
        log = (self.folder / "redis.log").open("ab")
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + READY_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"redis-server exited: {(self.folder / 'redis.log').read_text()}"
                )
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as c,
            ):
                c.sendall(b"PING\r\n")
                if c.recv(64):
                    return self
            time.sleep(0.05)
        raise RuntimeError("redis-server did not answer")

    def kill(self) -> None:
        """SIGKILL: gone at once, nothing flushed (persistence is off anyway)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def restart(self) -> None:
        self.kill()
        self.start()

    def close(self) -> None:
        self.kill()
        self.proc = None
