"""Hearth's own log file: logs/hearth.log under the data folders, written by `hearth serve`
(and the desktop app, which shares the setup), flushed per record (the server's line per
request within a fraction of a second), private, size-bounded."""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.cli.common import (
    FLUSH_LATER,
    LOG_BACKUPS,
    LOG_FILE,
    LOG_MAX_BYTES,
    PrivateLogFile,
    setup_logging,
)
from app.paths import AppPaths


@pytest.fixture
def root_logging() -> Iterator[None]:
    """Put the root logger back as it was (the setup under test changes it for the process)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        for h in root.handlers:
            if h not in handlers:
                h.close()
        root.handlers[:] = handlers
        root.setLevel(level)


def test_the_log_file_is_written_at_once_private_and_bounded(
    tmp_path: Path, root_logging: None
) -> None:
    logs = tmp_path / "logs"
    path = setup_logging(0, logs)
    assert path is not None and path.resolve() == (logs / LOG_FILE).resolve()
    assert path.exists() and stat.S_IMODE(path.stat().st_mode) == 0o600

    logging.getLogger("app.test").info("a record with %s", "an argument")
    assert "INFO app.test: a record with an argument" in path.read_text()  # flushed already
    logging.getLogger("app.test").debug("not without -vv")
    assert "not without -vv" not in path.read_text()

    line = "x" * 1000
    for _ in range(5 * LOG_MAX_BYTES // 1000):
        logging.getLogger("app.test").info(line)
    names = sorted(p.name for p in logs.iterdir())
    assert names == [LOG_FILE] + [f"{LOG_FILE}.{i}" for i in range(1, LOG_BACKUPS + 1)]
    assert all(p.stat().st_size <= LOG_MAX_BYTES for p in logs.iterdir())
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in logs.iterdir())


def test_records_skip_what_the_format_never_shows(
    tmp_path: Path, root_logging: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The caller's lookup (a stack walk), the process and the thread: a line per request costs
    about a third of a default record."""
    for name in ("logThreads", "logProcesses", "logMultiprocessing", "_srcfile"):
        monkeypatch.setattr(logging, name, getattr(logging, name))  # put back after the test
    path = setup_logging(0, tmp_path / "logs")
    assert path is not None
    lookups: list[str] = []
    monkeypatch.setattr(
        logging.Logger, "findCaller", lambda *a, **k: lookups.append("caller") or ("", 0, "", None)
    )
    seen: list[logging.LogRecord] = []
    monkeypatch.setattr(PrivateLogFile, "filter", lambda self, r: seen.append(r) or True)
    logging.getLogger("app.test").info("POST %s %d", "/v1/chat/completions", 200)
    assert "INFO app.test: POST /v1/chat/completions 200" in path.read_text()
    assert lookups == []
    assert seen and seen[0].process is None and seen[0].thread is None


def file_handler() -> PrivateLogFile:
    (handler,) = [h for h in logging.getLogger().handlers if isinstance(h, PrivateLogFile)]
    return handler


def test_request_lines_are_flushed_with_the_next_line_or_at_close(
    tmp_path: Path, root_logging: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lines logged to be flushed later (the server's line per request) stay in the file's
    buffer, no write each, until a line that is flushed at once, or the file is closed."""
    logs = tmp_path / "logs"
    path = setup_logging(0, logs)
    assert path is not None
    monkeypatch.setattr(PrivateLogFile, "flush_later_s", 3600.0)  # no timer in this test
    log = logging.getLogger("app.test")
    log.info("before")
    size = path.stat().st_size
    for i in range(20):
        log.info("request line %d", i, extra={FLUSH_LATER: True})
    assert path.stat().st_size == size  # nothing written yet

    log.warning("a warning")  # flushes what waits, in order
    lines = path.read_text().splitlines()
    assert [x.rsplit(": ", 1)[1] for x in lines[-22:]] == [
        "before",
        *(f"request line {i}" for i in range(20)),
        "a warning",
    ]

    log.info("a last request line", extra={FLUSH_LATER: True})
    assert "a last request line" not in path.read_text()
    file_handler().close()
    assert path.read_text().splitlines()[-1].endswith("app.test: a last request line")


def test_request_lines_reach_the_file_within_a_moment_on_their_own(
    tmp_path: Path, root_logging: None
) -> None:
    path = setup_logging(0, tmp_path / "logs")
    assert path is not None
    logging.getLogger("app.test").info("a request line", extra={FLUSH_LATER: True})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "a request line" not in path.read_text():
        time.sleep(0.05)  # written by the handler's timer thread: poll the file
    assert "a request line" in path.read_text()


def test_the_size_bound_holds_for_request_lines(tmp_path: Path, root_logging: None) -> None:
    logs = tmp_path / "logs"
    assert setup_logging(0, logs) is not None
    line = "y" * 1000
    for _ in range(5 * LOG_MAX_BYTES // 1000):
        logging.getLogger("app.test").info(line, extra={FLUSH_LATER: True})
    file_handler().close()
    names = sorted(p.name for p in logs.iterdir())
    assert names == [LOG_FILE] + [f"{LOG_FILE}.{i}" for i in range(1, LOG_BACKUPS + 1)]
    assert all(p.stat().st_size <= LOG_MAX_BYTES for p in logs.iterdir())


def test_hearth_serve_writes_the_log_file_in_its_logs_folder(tmp_path: Path) -> None:
    home = tmp_path / "h"
    env = {**os.environ, "HEARTH_HOME": str(home)}
    env.pop("HEARTH_API_KEY", None)
    p = subprocess.Popen(
        [sys.executable, "-m", "app", "serve", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    log_file = AppPaths.default(home).logs / LOG_FILE
    try:
        assert p.stdout is not None
        url = p.stdout.readline().strip()  # printed once listening
        assert url.startswith("http://127.0.0.1:")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # written by another process: poll the file
            if log_file.exists() and "serving on" in log_file.read_text():
                break
            time.sleep(0.1)
        text = log_file.read_text()
        assert "INFO app.server.runner: serving on" in text
        assert url.removesuffix("/v1") in text
        # a request's line (flushed within a moment, not at once) reaches the file too
        with urllib.request.urlopen(url + "/models", timeout=60) as r:
            assert r.status == 200
        while time.monotonic() < deadline + 60 and "GET /v1/models 200" not in text:
            time.sleep(0.1)
            text = log_file.read_text()
        assert "INFO app.server.middleware: GET /v1/models 200" in text
    finally:
        p.terminate()
        p.communicate(timeout=60)


def test_a_full_disk_loses_records_quietly(
    tmp_path: Path, root_logging: None, capfd: pytest.CaptureFixture[str]
) -> None:
    """Writing the log file on a full disk (ENOSPC, as /dev/full answers every write) drops the
    record: no "--- Logging error ---" traceback on stderr, and flushing or closing the file
    raises nothing."""
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / LOG_FILE).symlink_to("/dev/full")
    assert setup_logging(0, logs) is not None
    logging.getLogger("hearth.test").info("a record the full disk cannot take")
    logging.getLogger("hearth.test").warning("and a warning")
    for h in logging.getLogger().handlers:
        h.flush()
    err = capfd.readouterr().err
    assert "Logging error" not in err and "Traceback" not in err, err
