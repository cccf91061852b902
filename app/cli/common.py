"""What every command shares: logging (stderr and the log file), paths and settings, errors,
talking to a running server, formats.
Tested by tests/e2e/cli/test_cli.py, tests/e2e/cli/test_cache_cli.py and
tests/e2e/cli/test_log_file.py."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import ssl
import stat
import sys
import threading
import urllib.error
import urllib.request
from logging.handlers import RotatingFileHandler
from pathlib import Path
from typing import Any, TextIO

from app.errors import HearthError
from app.paths import AppPaths
from app.settings import SettingsStore

log = logging.getLogger("app.cli")

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LOG_FILE = "hearth.log"  # in AppPaths.logs; the Server page tails it
LOG_MAX_BYTES = 2 * 1024 * 1024  # then it rolls over to hearth.log.1 ...
LOG_BACKUPS = 3  # ... up to hearth.log.3: at most 8 MiB of logs in all
_FILE_HANDLER = "hearth-log-file"
# a record logged with ``extra={FLUSH_LATER: True}`` (the server's line per request) is flushed
# with the next one, or within PrivateLogFile.flush_later_s
FLUSH_LATER = "flush_later"


class PrivateLogFile(RotatingFileHandler):
    """A rotating log file only its owner can read (it names models, folders and clients).

    Every record is flushed as it is written, except those logged with ``extra={FLUSH_LATER:
    True}`` (the server's line per request): they wait in the file's buffer for the next record
    without it (a warning, say), for ``flush_later_s`` at most (a timer thread) or for close. A
    process killed hard loses at most that last fraction of a second of them; a busy server
    writes its request lines in one system call per buffer rather than one per request.
    """

    flush_later_s = 0.2
    _timer: threading.Timer | None = None
    _buffered = 0  # characters written since the last flush
    _file: tuple[bool, int] | None = None  # (a regular file, its size with what is buffered)

    def _open(self) -> io.TextIOWrapper:  # type: ignore[override]
        fd = os.open(self.baseFilename, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._file, self._buffered = None, 0
        return open(fd, "a", encoding=self.encoding, errors=self.errors)  # noqa: SIM115

    def emit(self, record: logging.LogRecord) -> None:
        """logging's rotating emit with each record formatted once, and the size and kind of
        the file asked of the open file (one fstat) rather than of its path (two stats, a seek);
        a line flushed later reuses the size known from the last one."""
        try:
            msg = self.format(record) + self.terminator
            later = bool(getattr(record, FLUSH_LATER, False))
            if self.stream is None:
                self.stream = self._open()
            if self._file is None or not later:
                self._file = self._stat(self.stream)
            regular, size = self._file
            # a pipe or /dev/null is never rolled over (logging's own rule); another process's
            # lines count too: the size is the file's, not what this one wrote
            if self.maxBytes > 0 and regular and size + len(msg) >= self.maxBytes:
                self.doRollover()  # closing the old file writes what was buffered
                if self.stream is None:
                    self.stream = self._open()
                regular, size = self._stat(self.stream)
            self.stream.write(msg)
            self._file = (regular, size + len(msg))
            if not later:
                self.flush()
                return
            self._buffered += len(msg)
            if self._timer is None:
                self._timer = threading.Timer(self.flush_later_s, self._flush_buffered)
                self._timer.daemon = True
                self._timer.start()
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)

    def _stat(self, stream: TextIO) -> tuple[bool, int]:
        st = os.fstat(stream.fileno())
        return stat.S_ISREG(st.st_mode), st.st_size + self._buffered

    def _flush_buffered(self) -> None:
        with self.lock:  # type: ignore[union-attr]  # logging's RLock, made in __init__
            self._timer = None
            self.flush()

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 (logging's name)
        # a full or vanished disk loses the record quietly: logging's own report is a traceback
        # on stderr for every record, and warnings still reach stderr through its own handler
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handleError(record)

    def flush(self) -> None:
        with contextlib.suppress(OSError):  # lines a full disk cannot take are lost
            super().flush()
        self._buffered = 0

    def close(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        with contextlib.suppress(OSError):
            super().close()  # writes what is buffered


def setup_logging(verbose: int, logs: Path | None = None) -> Path | None:
    """Log to stderr (warnings; -v info, -vv debug) and to ``logs``/hearth.log (info, -vv
    debug; default: AppPaths' logs folder), for the desktop app and every command alike.

    Returns the log file, or None where it cannot be written (said on stderr)."""
    level = logging.WARNING - 10 * min(verbose, 2)
    lean_records()
    root = logging.getLogger()
    had_handlers = bool(root.handlers)
    logging.basicConfig(level=level, stream=sys.stderr, format=LOG_FORMAT)
    if not had_handlers:  # basicConfig's stderr handler keeps -v's level
        root.handlers[0].setLevel(level)
    file_level = logging.DEBUG if verbose >= 2 else logging.INFO
    root.setLevel(min(level, file_level))
    return install_log_file(logs if logs is not None else AppPaths.default().logs, file_level)


def lean_records() -> None:
    """Records without what LOG_FORMAT never shows: the process, thread and caller (logging's
    own optimisation switches). A record then costs about a third of its default (the caller's
    lookup walks the stack; the server logs a line per request: ~32 -> ~12 us each)."""
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    logging._srcfile = None  # type: ignore[attr-defined]  # the switch logging's HOWTO names


def install_log_file(folder: Path, level: int = logging.INFO) -> Path | None:
    """(Re)place the root logger's log file with ``folder``/hearth.log. Each record is
    flushed as it is written (the server's request lines within a fraction of a second: see
    PrivateLogFile), so a tail of the file is never far behind."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == _FILE_HANDLER]:
        root.removeHandler(old)
        old.close()
    path = folder / LOG_FILE
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handler = PrivateLogFile(
            path, maxBytes=LOG_MAX_BYTES, backupCount=LOG_BACKUPS, encoding="utf-8"
        )
    except OSError as e:
        log.warning("cannot write the log file %s: %s", path, e)
        return None
    handler.set_name(_FILE_HANDLER)
    handler.setLevel(level)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    root.addHandler(handler)
    return path


def context() -> tuple[AppPaths, SettingsStore]:
    paths = AppPaths.default().ensure()
    return paths, SettingsStore(paths.settings_file)


def fail(msg: str) -> int:
    print(f"hearth: error: {msg}", file=sys.stderr)
    return EXIT_FAIL


# -- talking to a running server ---------------------------------------------------------------
def api_key(args: argparse.Namespace) -> str | None:
    return getattr(args, "api_key", None) or os.environ.get("HEARTH_API_KEY") or None


class ServerRoot(str):
    """A running server's root URL, and for HTTPS the context that trusts its certificate.

    A ``str`` so every caller that joins paths onto it works unchanged; ``api`` (and anything
    else that opens it) passes ``ssl_context`` on.
    """

    ssl_context: ssl.SSLContext | None = None

    def __new__(cls, url: str, ssl_context: ssl.SSLContext | None = None) -> ServerRoot:
        root = super().__new__(cls, url)
        root.ssl_context = ssl_context
        return root


def pinned_context(cert_pem: str) -> ssl.SSLContext:
    """Trust exactly the certificate the server recorded it presents, and nothing else.

    The record is the server's own (a 0600 file in the user's data folder), so the certificate
    itself is the trust anchor (a partial chain): a self-signed or privately issued certificate
    works, and the address in the URL need not be one of its names (no hostname check; nobody
    without its key can present it).
    """
    ctx = ssl.create_default_context(cadata=cert_pem)
    ctx.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    ctx.check_hostname = False
    ctx.verify_mode = (
        ssl.CERT_REQUIRED
    )  # the certificate must still verify; only names are not checked
    return ctx


def find_server(paths: AppPaths, url: str | None) -> str | None:
    if url:  # an https --url is verified as any client would (system CAs, SSL_CERT_FILE)
        return url.rstrip("/").removesuffix("/v1")
    try:
        info = json.loads(paths.server_file.read_text())
    except (OSError, ValueError):
        return None
    pid = info.get("pid")
    if isinstance(pid, int):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
    u = info.get("url")
    if not isinstance(u, str):
        return None
    pem = info.get("tls_cert_pem")
    if u.startswith("https://") and isinstance(pem, str):
        try:
            return ServerRoot(u.removesuffix("/v1"), pinned_context(pem))
        except ssl.SSLError as e:
            raise HearthError(f"the running server's recorded certificate is unusable: {e}") from e
    return u.removesuffix("/v1")


def require_server(paths: AppPaths, url: str | None) -> str:
    found = find_server(paths, url)
    if not found:
        raise HearthError(
            "no running Hearth server found (start one with `hearth serve`, or pass --url)"
        )
    return found


def ssl_context_of(base: str) -> ssl.SSLContext | None:
    """The context to open ``base`` with (None: urllib's default)."""
    return base.ssl_context if isinstance(base, ServerRoot) else None


def api(base: str, method: str, path: str, body: Any, key: str | None, timeout: float = 30) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=ssl_context_of(base)) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        try:
            msg = json.loads(e.read())["error"]["message"]
        except (ValueError, KeyError, TypeError):
            msg = f"HTTP {e.code}"
        raise HearthError(msg) from e
    except (urllib.error.URLError, OSError) as e:
        raise HearthError(f"cannot reach the Hearth server at {base}: {e}") from e


# -- formatting ---------------------------------------------------------------------------------
def human_bytes(n: int | None) -> str:
    if not n:
        return "-"
    size = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{n} B"


def size_range(size_range: tuple[int, int] | None) -> str:
    """``"1.2-7.7 GB"`` (ASCII for any terminal); one size when both ends match; ``-`` unknown."""
    if not size_range:
        return "-"
    lo, hi = human_bytes(size_range[0]), human_bytes(size_range[1])
    if lo == hi:
        return lo
    lo_num, _, lo_unit = lo.partition(" ")
    return f"{lo_num}-{hi}" if hi.endswith(" " + lo_unit) else f"{lo}-{hi}"


def human_count(n: int | None) -> str:
    if not n:
        return "-"
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.1f}{suffix}"
    return str(n)
