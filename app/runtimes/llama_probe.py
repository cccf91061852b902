"""A one-time check, in a child process, that llama.cpp's extra buffer types decode safely here.

Some CPUs (seen: Xeons with AMX) crash on the first decode when llama.cpp repacks weights into
its AMX buffer type. We never find that out in the app's own process: a child loads the model
with the default (fast) settings and decodes a few tokens. If the child dies, loads here turn the
extra buffer types off. The verdict is remembered per CPU, llama.cpp build and weight type, so
machines without the problem keep the fast path and pay the check once.

``HEARTH_LLAMA_EXTRA_BUFTS=0|1`` forces the choice without a probe.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from app.core.fsutil import atomic_write_json, file_lock, read_json

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 180
ENV_OVERRIDE = "HEARTH_LLAMA_EXTRA_BUFTS"


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
    """What the verdict depends on: the CPU, the llama.cpp build and the weights' type."""
    raw = "\n".join([_cpu_signature(), build_info, weight_type])
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


def extra_bufts_safe(
    model_path: str, *, build_info: str, weight_type: str, probe_file: Path | None
) -> bool:
    """True when loading ``model_path`` with llama.cpp's extra buffer types is known to be safe."""
    forced = os.environ.get(ENV_OVERRIDE)
    if forced in ("0", "1"):
        return forced == "1"
    key = probe_key(build_info, weight_type)
    if probe_file is not None:
        with contextlib.suppress(ValueError, OSError):
            known = read_json(probe_file, {})
            if isinstance(known, dict) and isinstance(known.get(key), dict):
                return bool(known[key].get("extra_bufts_ok"))
    ok, detail = _run_probe(model_path)
    if ok is None:  # the probe could not decide (the model itself failed): be safe, don't remember
        log.warning("llama.cpp probe inconclusive (%s); loading without extra buffer types", detail)
        return False
    if not ok:
        log.warning(
            "llama.cpp crashed in a probe with its extra buffer types (%s); Hearth turns them off "
            "on this CPU (remembered)",
            detail,
        )
    if probe_file is not None:
        try:
            with file_lock(probe_file):
                known = read_json(probe_file, {})
                known = known if isinstance(known, dict) else {}
                known[key] = {
                    "extra_bufts_ok": ok,
                    "detail": detail,
                    "at": time.time(),
                    "weight_type": weight_type,
                }
                atomic_write_json(probe_file, known)
        except (OSError, ValueError):
            log.exception("could not record the probe result in %s", probe_file)
    return ok


def _run_probe(model_path: str) -> tuple[bool | None, str]:
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "app.runtimes.llama_probe", model_path],
            capture_output=True,
            timeout=PROBE_TIMEOUT_S,
            env={**os.environ, ENV_OVERRIDE: ""},
        )
    except subprocess.TimeoutExpired:
        return False, f"probe timed out after {PROBE_TIMEOUT_S}s"
    except OSError as e:
        return None, f"probe could not start: {e}"
    if proc.returncode == 0:
        return True, "decoded fine"
    if proc.returncode < 0:
        return False, f"child died with signal {-proc.returncode}"
    if proc.returncode == 3:  # the model failed to load even with defaults: not our question
        return None, proc.stderr.decode(errors="replace")[-300:]
    return False, f"child exited with {proc.returncode}"


def _child(model_path: str) -> int:
    """Load with default params, decode a prompt and two tokens. Exit 0 = fine, 3 = load failed."""
    import llama_cpp as L

    silent = L.llama_log_callback(lambda level, text, data: None)
    L.llama_log_set(silent, None)
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    model = L.llama_model_load_from_file(model_path.encode(), mp)
    if not model:
        return 3
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = 256, 64, 64
    ctx = L.llama_init_from_model(model, cp)
    if not ctx:
        return 3
    vocab = L.llama_model_get_vocab(model)
    text = b"The quick brown fox jumps over the lazy dog because"
    toks = (L.llama_token * 64)()
    n = L.llama_tokenize(vocab, text, len(text), toks, 64, True, False)
    if n <= 0 or L.llama_decode(ctx, L.llama_batch_get_one(toks, n)) != 0:
        return 3
    one = (L.llama_token * 1)()
    for _ in range(2):
        logits = L.llama_get_logits_ith(ctx, -1)
        n_vocab = L.llama_vocab_n_tokens(vocab)
        one[0] = max(range(n_vocab), key=lambda i: logits[i])
        if L.llama_decode(ctx, L.llama_batch_get_one(one, 1)) != 0:
            return 4
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1]))
