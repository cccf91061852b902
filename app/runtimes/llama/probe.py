"""Before llama.cpp loads a file in Hearth's process, a child process loads it and serves it once.

llama.cpp aborts the whole process (GGML_ASSERT, an uncaught exception) on some malformed
files that pass every header check, and, on some CPUs (seen: Xeons with AMX), on the first
decode with its extra buffer types. Neither may take Hearth down, so an unknown file is first
loaded and given a first request in a child (``app.runtimes.llama.probe_child``). The verdict
is remembered in ``cache/runtime-probe.json`` under a cheap key of the file (size, mtime, a hash
of its header and a few sampled blocks, the llama.cpp build, the CPU, the load options that
change llama.cpp's code path), so a known file pays a lookup, not a child.

- The child survives: the file loads in process. The verdict on the extra buffer types is
  remembered as before, per CPU, llama.cpp build and weight type, so one child answers both.
- The child dies with the extra buffer types on and that question was open: a second child
  without them tells the CPU's problem (load without them here) from the file's (refuse it).
- The child dies: the file is refused with what llama.cpp said, and stays refused until it
  changes. A clean refusal (llama.cpp returned an error) is reported, not remembered.
- The child runs past its time (``timeout_for``: a minute plus 30 s per GiB, or
  ``HEARTH_PROBE_TIMEOUT_S``): it is killed and this load is refused; nothing is remembered, as
  a slow disk or machine is not the file's fault. The next load checks again.

Children never outlive Hearth: each dies with its parent (PR_SET_PDEATHSIG on Linux, and a pipe
it watches everywhere), and ``Prober.close()`` (and interpreter exit) kills the live ones.

``HEARTH_LLAMA_EXTRA_BUFTS=0|1`` forces the extra buffer types off or on (the file check stays).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from app.core.library.gguf import read_header, shard_siblings
from app.core.library.gguf_check import check_for_llama_cpp
from app.core.types import LoadOptions, LocalModel
from app.core.util.fsutil import atomic_write_json, file_lock, read_json
from app.errors import ModelLoadFailed

log = logging.getLogger(__name__)

ENV_OVERRIDE = "HEARTH_LLAMA_EXTRA_BUFTS"
ENV_TIMEOUT = "HEARTH_PROBE_TIMEOUT_S"
PROBE_CONTEXT = 256
MAX_FILE_VERDICTS = 500
HEAD_CAP = 64 << 20  # bytes of a header hashed at most
SAMPLES, SAMPLE_BYTES = 16, 64 << 10
# load options that change which llama.cpp code runs: a verdict holds for these values only
_PATH_OPTIONS = (
    "use_mmap",
    "gpu_layers",
    "kv_type",
    "flash_attention",
    "rope_scaling",
    "rope_freq_base",
    "rope_freq_scale",
)
# stages where the extra buffer types are in play (weights repacked at load, used in compute);
# a crash while reading the vocabulary or tokenizing is the file's alone
_COMPUTE = frozenset({"load", "generate", "embed"})
_STAGES = {  # what the child was doing, as the end of "llama.cpp crashed ..."
    "start": "before loading it",
    "load": "while loading it",
    "vocab": "while reading its vocabulary",
    "tokenize": "while tokenizing a prompt",
    "generate": "on its first request",
    "embed": "on its first embedding",
}


def _cpu_signature() -> str:
    parts = [platform.machine(), platform.processor()]
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "flags", "Features")):
                parts.append(line)
                if line.startswith(("flags", "Features")):
                    break
    return "\n".join(parts)


def probe_key(build_info: str, weight_type: str) -> str:
    """What the extra-buffer-type verdict depends on: the CPU, the llama.cpp build, the weights."""
    raw = "\n".join([_cpu_signature(), build_info, weight_type])
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


def file_key(paths: list[str], *, data_offset: int, context: str) -> str:
    """A cheap key of a model's content: sizes, mtimes, its header and sampled data blocks.

    ``paths`` are the file (or a split model's shards); ``context`` is what else the verdict
    depends on (build, CPU, options). Reads the header (already in the page cache: it was just
    validated) and ``SAMPLES`` blocks of ``SAMPLE_BYTES`` spread over the data, never the whole.
    """
    h = hashlib.blake2b(digest_size=16)
    h.update(context.encode())
    for p in paths:
        with contextlib.suppress(OSError):
            st = os.stat(p)
            h.update(f"\n{Path(p).name}:{st.st_size}:{st.st_mtime_ns}".encode())
    first = paths[0]
    size = os.stat(first).st_size
    with open(first, "rb") as f:
        left = min(size, max(data_offset, 4096), HEAD_CAP)
        while left > 0:
            chunk = f.read(min(left, 1 << 20))
            if not chunk:
                break
            h.update(chunk)
            left -= len(chunk)
        span = max(0, size - data_offset - SAMPLE_BYTES)
        for i in range(SAMPLES):
            f.seek(data_offset + span * i // (SAMPLES - 1))
            h.update(f.read(SAMPLE_BYTES))
    return "file:" + h.hexdigest()


def timeout_for(size_bytes: int) -> float:
    """How long a child may take: a minute plus 30 s per GiB (reading a big file off a slow disk)."""
    forced = os.environ.get(ENV_TIMEOUT)
    if forced:
        with contextlib.suppress(ValueError):
            return max(1.0, float(forced))
    return 60.0 + 30.0 * size_bytes / (1 << 30)


@dataclass(frozen=True, slots=True)
class ChildResult:
    """What one child run showed.

    outcome: ``ok`` (loaded and answered), ``refused`` (llama.cpp returned an error),
    ``crashed`` (the child died), ``timeout``, ``abandoned`` (killed by ``close()``), ``error``
    (the check itself could not run).
    """

    outcome: str
    stage: str
    detail: str
    seconds: float


_ALL_LIVE: weakref.WeakSet[subprocess.Popen[bytes]] = weakref.WeakSet()


@atexit.register
def _kill_all_live() -> None:
    for proc in list(_ALL_LIVE):
        with contextlib.suppress(OSError):
            proc.kill()


def _signal_name(rc: int) -> str:
    if rc < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-rc).name}"
        return f"signal {-rc}"
    return f"exit code {rc}"


_ABORT_LINE = re.compile(r"^(?P<file>\S+\.(?:c|cc|cpp|h|cu|m|mm)):(?P<line>\d+): (?P<msg>.*)$")


def _crash_line(stderr: str) -> str:
    """llama.cpp's own words for the crash: its ``file:line: message`` abort line, an uncaught
    exception, or the last line."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for ln in reversed(lines):
        m = _ABORT_LINE.match(ln)
        if m:  # the build path is noise: keep the source file's name
            return f"{Path(m['file']).name}:{m['line']}: {m['msg']}"[:400]
    for key in ("terminate called", "what():"):
        for ln in reversed(lines):
            if key in ln:
                return ln[-400:]
    return lines[-1][-400:] if lines else ""


class Prober:
    """Runs probe children for one runtime; ``close()`` kills the live ones."""

    def __init__(self, probe_file: Path | None) -> None:
        self.probe_file = probe_file
        self._live: dict[subprocess.Popen[bytes], bool] = {}  # child -> abandoned
        self._lock = threading.Lock()

    # -- the verdict store --------------------------------------------------------------------
    def _known(self) -> dict[str, Any]:
        if self.probe_file is None:
            return {}
        try:
            data = read_json(self.probe_file, {})
        except (ValueError, OSError):
            return {}
        return data if isinstance(data, dict) else {}

    def _remember(self, updates: dict[str, dict[str, Any]]) -> None:
        if self.probe_file is None:
            return
        try:
            with file_lock(self.probe_file):
                known = self._known()
                known.update(updates)
                files = sorted(
                    (k for k in known if k.startswith("file:")),
                    key=lambda k: float(known[k].get("at", 0)) if isinstance(known[k], dict) else 0,
                )
                for k in files[: max(0, len(files) - MAX_FILE_VERDICTS)]:
                    del known[k]
                atomic_write_json(self.probe_file, known)
        except (OSError, ValueError):
            log.exception("could not record a probe verdict in %s", self.probe_file)

    # -- the check ------------------------------------------------------------------------------
    def check_model(self, model: LocalModel, options: LoadOptions, *, build_info: str) -> bool:
        """Everything before llama.cpp loads ``model`` here: the bounds-checked header, what
        llama.cpp would assert on, then ``check``. Returns whether to use the extra buffer types.

        Raises:
            InvalidModel: the header is malformed or holds a value llama.cpp aborts on.
            ModelLoadFailed: see ``check``.
        """
        header = read_header(model.path)
        check_for_llama_cpp(header, model.path)
        return self.check(
            [str(p) for p in shard_siblings(Path(model.path))],
            name=model.id,
            data_offset=header.data_offset,
            weight_type=header.quantization or "unknown",
            build_info=build_info,
            options=options,
            embedding=bool(model.extra.get("embedding")),
        )

    def check(
        self,
        paths: list[str],
        *,
        name: str,
        data_offset: int,
        weight_type: str,
        build_info: str,
        options: LoadOptions,
        embedding: bool,
    ) -> bool:
        """Make sure llama.cpp survives ``paths`` here. Returns whether to use the extra buffer
        types.

        Raises:
            ModelLoadFailed: a child crashed on the file (now or before: remembered), llama.cpp
                refused it, the check timed out or was abandoned, or could not run.
        """
        forced = os.environ.get(ENV_OVERRIDE)
        amx_key = probe_key(build_info, weight_type)
        known = self._known()
        amx: bool | None = None
        if forced in ("0", "1"):
            amx = forced == "1"
        elif isinstance(known.get(amx_key), dict):
            amx = bool(known[amx_key].get("extra_bufts_ok"))
        sig = "|".join(str(getattr(options, f)) for f in _PATH_OPTIONS)
        fkey = file_key(
            paths, data_offset=data_offset, context=f"{_cpu_signature()}\n{build_info}\n{sig}"
        )
        entry = known.get(fkey)
        if isinstance(entry, dict):
            if entry.get("ok"):
                return amx if amx is not None else bool(entry.get("extra_bufts"))
            raise ModelLoadFailed(
                f"{entry.get('reason') or 'llama.cpp crashed on this file'} (remembered from "
                f"an earlier check; refused until the file changes)",
                param="model",
            )
        bufts = True if amx is None else amx
        size = _total_size(paths)
        res = self._run(paths[0], bufts, options, embedding, size=size, name=name)
        if res.outcome == "crashed" and bufts and amx is None and res.stage in _COMPUTE:
            again = self._run(paths[0], False, options, embedding, size=size, name=name)
            if again.outcome == "ok":
                log.warning(
                    "llama.cpp crashed in a probe with its extra buffer types (%s); Hearth "
                    "turns them off on this CPU for %s weights (remembered)",
                    res.detail,
                    weight_type,
                )
                self._remember(
                    {
                        amx_key: _amx_entry(False, res.detail, weight_type),
                        fkey: _file_entry(True, "", False, name),
                    }
                )
                return False
            if again.outcome != "crashed":
                res = again
        if res.outcome == "ok":
            updates = {fkey: _file_entry(True, "", bufts, name)}
            if amx is None:
                updates[amx_key] = _amx_entry(True, "decoded fine", weight_type)
            self._remember(updates)
            log.info("probe: '%s' loaded and answered in a child (%.2fs)", name, res.seconds)
            return bufts
        reason = _refusal(res, name)
        if res.outcome == "crashed":
            self._remember({fkey: _file_entry(False, reason, bufts, name)})
        log.warning("probe refused %s: %s", name, reason)
        raise ModelLoadFailed(reason, param="model")

    def _run(
        self,
        path: str,
        extra_bufts: bool,
        options: LoadOptions,
        embedding: bool,
        *,
        size: int,
        name: str = "probe",
    ) -> ChildResult:
        opts = dataclasses.replace(
            options,
            context_length=min(options.context_length or PROBE_CONTEXT, PROBE_CONTEXT),
            batch_size=min(options.batch_size, PROBE_CONTEXT),
            ubatch_size=min(options.ubatch_size, PROBE_CONTEXT),
            parallel=1,
            use_mlock=False,
        )
        spec = {
            "name": name,
            "path": path,
            "extra_bufts": extra_bufts,
            "embedding": embedding,
            "options": dataclasses.asdict(opts),
            "ppid": os.getpid(),
        }
        cmd = [sys.executable, "-m", "app.runtimes.llama.probe_child", json.dumps(spec)]
        env = {**os.environ, "GGML_NO_BACKTRACE": "1"}
        limit = timeout_for(size)
        t0 = time.perf_counter()
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            try:
                proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=out, stderr=err, env=env)
            except OSError as e:
                return ChildResult("error", "start", f"could not start a check process: {e}", 0.0)
            with self._lock:
                self._live[proc] = False
                _ALL_LIVE.add(proc)
            timed_out = False
            try:
                proc.wait(limit)
            except subprocess.TimeoutExpired:
                timed_out = True
                proc.kill()
                proc.wait()
            finally:
                with self._lock:
                    abandoned = self._live.pop(proc, False)
                _ALL_LIVE.discard(proc)
                _close(proc.stdin)
            secs = time.perf_counter() - t0
            stdout, stderr = _read(out), _read(err)
        stage, result = "start", None
        for line in stdout.splitlines():
            if line.startswith("HEARTH-PROBE "):
                with contextlib.suppress(ValueError):
                    item = json.loads(line[len("HEARTH-PROBE ") :])
                    stage = item.get("stage", stage)
                    if "result" in item:
                        result = item
        if abandoned:
            return ChildResult("abandoned", stage, "the load was abandoned", secs)
        if timed_out:
            return ChildResult("timeout", stage, f"no answer within {limit:.0f}s", secs)
        if result is not None and result.get("result") in ("ok", "refused", "error"):
            detail = str(result.get("reason") or "")
            return ChildResult(str(result["result"]), stage, detail, secs)
        crash = _crash_line(stderr)
        detail = _signal_name(proc.returncode) + (f": {crash}" if crash else "")
        return ChildResult("crashed", stage, detail, secs)

    def close(self) -> None:
        """Kill the live children: the loads waiting on them fail as abandoned."""
        with self._lock:
            live = list(self._live)
            for proc in live:
                self._live[proc] = True
        for proc in live:
            with contextlib.suppress(OSError):
                proc.kill()


def _refusal(res: ChildResult, name: str) -> str:
    where = _STAGES.get(res.stage, "while checking it")
    if res.outcome == "crashed":
        return (
            f"llama.cpp crashed on '{name}' {where}, in a check process ({res.detail}); "
            "Hearth does not load this file in its own process"
        )
    if res.outcome == "refused":
        return f"llama.cpp cannot use '{name}' ({where}): {res.detail}"
    if res.outcome == "timeout":
        return (
            f"the check of '{name}' in a child process did not finish ({res.detail}, "
            f"{where}); the machine or disk may be slow: try again, or raise {ENV_TIMEOUT}"
        )
    if res.outcome == "abandoned":
        return f"loading '{name}' was abandoned (Hearth is closing)"
    return f"the check of '{name}' in a child process could not run: {res.detail}"


def _file_entry(ok: bool, reason: str, extra_bufts: bool, name: str) -> dict[str, Any]:
    return {"ok": ok, "reason": reason, "extra_bufts": extra_bufts, "name": name, "at": time.time()}


def _amx_entry(ok: bool, detail: str, weight_type: str) -> dict[str, Any]:
    return {"extra_bufts_ok": ok, "detail": detail, "at": time.time(), "weight_type": weight_type}


def _total_size(paths: list[str]) -> int:
    total = 0
    for p in paths:
        with contextlib.suppress(OSError):
            total += os.stat(p).st_size
    return total


def _close(f: IO[bytes] | None) -> None:
    if f is not None:
        with contextlib.suppress(OSError):
            f.close()


def _read(f: IO[bytes], cap: int = 1 << 20) -> str:
    f.seek(0, os.SEEK_END)
    size = f.tell()
    f.seek(max(0, size - cap))
    return f.read().decode("utf-8", errors="replace")
