"""Hearth as real processes, for end-to-end tests: one-shot ``hearth`` commands, a ``hearth pull``
or ``hearth serve`` to watch and ``kill -9``, and a pull through a server's API read line by line.

Every wait here is on something the process says or does (a line on stderr, a line of NDJSON, an
exit), with a generous deadline; nothing waits a fixed time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tests.support.fakehub import FakeHub

DEADLINE = 60.0  # seconds: how long a step may take before the test gives up (liveness only)


def env_for(home: Path, hub: FakeHub | None, **extra: str) -> dict[str, str]:
    env = {**os.environ, "HEARTH_HOME": str(home), **extra}
    env.setdefault("HF_ENDPOINT", hub.endpoint if hub else "http://127.0.0.1:9")
    for var in ("HEARTH_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        if var not in extra:
            env.pop(var, None)
    return env


def argv(*args: str, prefix: Sequence[str] = ()) -> list[str]:
    return [*prefix, sys.executable, "-m", "app", *args]


def hearth(
    home: Path,
    hub: FakeHub | None,
    *args: str,
    timeout: float = 60,
    prefix: Sequence[str] = (),
    **extra: str,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv(*args, prefix=prefix),
        capture_output=True,
        text=True,
        env=env_for(home, hub, **extra),
        timeout=timeout,
    )


def ls(home: Path, prefix: Sequence[str] = ()) -> list[dict[str, Any]]:
    r = hearth(home, None, "ls", "--json", prefix=prefix)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def hold_settings(home: Path) -> None:
    """Settings for tests that hold a transfer at a gate: no stall timeout fires meanwhile."""
    cfg = home / "config"
    cfg.mkdir(parents=True, exist_ok=True)
    (cfg / "settings.json").write_text(json.dumps({"downloads": {"stall_timeout_s": 3600}}))


def kill_pull_at(home: Path, hub: FakeHub, repo: str, file: str, cut: int, partial: Path) -> None:
    """``hearth pull REPO`` held by the fake Hub after ``cut`` bytes of ``file``, killed with
    SIGKILL once those bytes are in ``partial`` (for the resume that follows)."""
    gate = hub.hold(repo, file, at=cut)  # never opened: the pull sits there until killed
    hold_settings(home)
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "pull", repo],
        env=env_for(home, hub),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        gate.wait()
        deadline = time.monotonic() + 120
        while not (partial.exists() and partial.stat().st_size == cut):  # the bytes landed
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the bytes before the gate never reached disk"
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def wait_until(cond: Callable[[], bool], what: str, timeout: float = DEADLINE) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


class Proc:
    """A child process whose stderr is read as it comes (a thread keeps the lines)."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.p = subprocess.Popen(
            args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.err: list[str] = []
        self.out = ""
        self._cv = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.p.pid

    def _read(self) -> None:
        assert self.p.stderr is not None
        for line in self.p.stderr:
            with self._cv:
                self.err.append(line)
                self._cv.notify_all()
        with self._cv:
            self._cv.notify_all()

    @property
    def stderr(self) -> str:
        with self._cv:
            return "".join(self.err)

    def wait_stderr(self, needle: str, timeout: float = DEADLINE) -> None:
        """Block until a line of stderr contains ``needle`` (AssertionError if it exits first)."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while not any(needle in line for line in self.err):
                if self.p.poll() is not None and not self._reader.is_alive():
                    raise AssertionError(
                        f"exited ({self.p.returncode}) before {needle!r}:\n" + "".join(self.err)
                    )
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {needle!r} on stderr:\n" + "".join(self.err))
                self._cv.wait(min(left, 0.5))

    def alive(self) -> bool:
        return self.p.poll() is None

    def kill9(self) -> None:
        os.kill(self.p.pid, signal.SIGKILL)
        self.p.wait(DEADLINE)
        self._drain()

    def finish(self, timeout: float = DEADLINE) -> int:
        """Wait for the exit; keeps stdout in ``out``. Returns the exit status."""
        try:
            self.p.wait(timeout)  # stdout carries one line (an id, a URL): it cannot fill a pipe
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
            raise
        self._drain()
        return self.p.returncode

    def _drain(self) -> None:
        if self.p.stdout is not None:
            self.out = self.p.stdout.read() or ""
        self._reader.join(DEADLINE)

    def close(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait(DEADLINE)
        for f in (self.p.stdout, self.p.stderr):
            if f is not None:
                f.close()


def pull_proc(home: Path, hub: FakeHub, ref: str, prefix: Sequence[str] = ()) -> Proc:
    """``hearth pull REF`` in the background."""
    return Proc(argv("pull", ref, prefix=prefix), env_for(home, hub))


class Server(Proc):
    """``hearth serve --port 0`` in the background; ``root`` once it listens."""

    def __init__(
        self, home: Path, hub: FakeHub | None, *args: str, prefix: Sequence[str] = ()
    ) -> None:
        super().__init__(argv("serve", "--port", "0", *args, prefix=prefix), env_for(home, hub))
        assert self.p.stdout is not None
        line = self.p.stdout.readline().strip()  # printed once listening
        if not line.startswith("http://"):
            self.close()
            raise AssertionError(f"hearth serve did not start: {line!r}\n{self.stderr}")
        self.root = line.removesuffix("/v1")

    def api(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        req = urllib.request.Request(
            self.root + path,
            data=json.dumps(body).encode() if body is not None else None,
            method=method,
        )
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=DEADLINE) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def stop(self) -> int:
        """SIGTERM and wait: a clean shutdown exits 0."""
        self.p.send_signal(signal.SIGTERM)
        return self.finish()


class PullStream:
    """``POST /api/v1/pull`` read on a thread: ``lines`` grows as the server sends NDJSON."""

    def __init__(self, root: str, ref: str) -> None:
        self.lines: list[dict[str, Any]] = []
        self.error: BaseException | None = None
        self.status = 0
        self._cv = threading.Condition()
        self._t = threading.Thread(target=self._run, args=(root, ref), daemon=True)
        self._t.start()

    def _run(self, root: str, ref: str) -> None:
        req = urllib.request.Request(
            root + "/api/v1/pull", data=json.dumps({"model": ref}).encode(), method="POST"
        )
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=3600) as r:
                self.status = r.status
                for raw in r:
                    with self._cv:
                        self.lines.append(json.loads(raw))
                        self._cv.notify_all()
        except urllib.error.HTTPError as e:
            self.status = e.code
            with self._cv:
                self.lines.append(json.loads(e.read()))
        except (OSError, ValueError) as e:  # the server went away (kill -9)
            self.error = e
        finally:
            with self._cv:
                self._cv.notify_all()

    def wait_for(self, cond: Callable[[dict[str, Any]], bool], timeout: float = DEADLINE) -> Any:
        """The first line that satisfies ``cond`` (AssertionError if the stream ends first)."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while True:
                for line in self.lines:
                    if cond(line):
                        return line
                if not self._t.is_alive():
                    raise AssertionError(f"the pull ended without it: {self.lines} {self.error}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out; lines so far: {self.lines}")
                self._cv.wait(min(left, 0.5))

    def result(self, timeout: float = DEADLINE) -> dict[str, Any]:
        """The last line, once the stream ended."""
        self._t.join(timeout)
        assert not self._t.is_alive(), f"the pull is still streaming: {self.lines[-3:]}"
        assert self.lines, f"no NDJSON at all ({self.error})"
        return self.lines[-1]
