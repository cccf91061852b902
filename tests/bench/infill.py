"""Fill-in-the-middle alone: llama-server's `/infill` against Hearth's on the same model and
body (not collected by pytest).

Run:  python tests/bench/infill.py [--rounds 5] [--tokens 64] [--model PATH]

The model is SmolLM2 with FIM token keys added (tests/support/fim_gguf.py), the one the parity
test uses. Each round sends llama.vscode's request shape (prefix, suffix, one other file, the
cursor line) to each engine in turn, streamed, greedy, with a prefix of its own (a new first
line), so each engine reads the whole prompt every round. Prints per engine the medians of the
time to the first content and of the decode speed (`timings.predicted_per_second`, which both
report), and the ratios Hearth / llama-server.
"""

from __future__ import annotations

import argparse
import http.client
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.autocomplete_mix import CODE, llama_server  # noqa: E402
from tests.bench.vs_llama_server import default_model, sse_objects  # noqa: E402
from tests.e2e.engines import LLAMA_SERVER_HOWTO, llama_server_binary  # noqa: E402
from tests.e2e.serveproc import start_serve  # noqa: E402
from tests.support.fim_gguf import write_fim_copy  # noqa: E402

SUFFIX = "\n\ndef main() -> None:\n    print(bounding_box([Point(0, 0), Point(2, 3)]))\n"
EXTRA = [
    {"filename": "geometry_test.py", "text": "from geometry import Point\n\nP = Point(1, 2)\n"}
]


def infill(root: str, model: str | None, k: int, tokens: int) -> tuple[float, float]:
    """(seconds to the first content, decode tok/s) of one streamed /infill."""
    body: dict[str, Any] = {
        "input_prefix": f"# round {k}\n" + CODE,
        "input_suffix": SUFFIX,
        "input_extra": EXTRA,
        "prompt": "    low = Point(",
        "n_predict": tokens,
        "temperature": 0,
        "stream": True,
        "cache_prompt": True,
    }
    if model is not None:
        body["model"] = model
    u = urlsplit(root)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    t0 = time.perf_counter()
    first: float | None = None
    speed = 0.0
    try:
        conn.request("POST", "/infill", json.dumps(body), {"Content-Type": "application/json"})
        for obj in sse_objects(conn.getresponse()):
            if obj.get("content") and first is None:
                first = time.perf_counter() - t0
            if obj.get("stop"):
                t = obj.get("timings") or {}
                speed = float(t.get("predicted_per_second") or 0.0) or (
                    1000.0 * t.get("predicted_n", 0) / max(t.get("predicted_ms", 0.0), 1e-9)
                )
    finally:
        conn.close()
    return (first if first is not None else float("nan")), speed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--model", type=Path, default=None)
    a = ap.parse_args()
    exe = llama_server_binary()
    if exe is None:
        sys.exit(LLAMA_SERVER_HOWTO)
    tmp = Path(tempfile.mkdtemp(prefix="hearth-infill-"))
    model = write_fim_copy(a.model or default_model(), tmp / "smollm2-fim.gguf", "keys")
    p, ls_root = llama_server(exe, model)
    s = start_serve(tmp / "home", model, settings={"load": {"context_length": 8192}})
    hearth_model = next(iter(s.models.values()))
    got: dict[str, list[tuple[float, float]]] = {"llama-server": [], "Hearth": []}
    try:
        infill(ls_root, None, -1, 4)  # warm both up
        infill(s.root, hearth_model, -1, 4)
        for k in range(a.rounds):
            got["llama-server"].append(infill(ls_root, None, k, a.tokens))
            got["Hearth"].append(infill(s.root, hearth_model, k, a.tokens))
    finally:
        p.kill()
        s.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    med = {
        name: (statistics.median(t for t, _ in rows), statistics.median(v for _, v in rows))
        for name, rows in got.items()
    }
    print(f"{'':22}{'TTFT s':>10}{'tok/s':>10}")
    for name, (ttft, speed) in med.items():
        print(f"{name:22}{ttft:>10.3f}{speed:>10.1f}")
    (lt, lv), (ht, hv) = med["llama-server"], med["Hearth"]
    print(f"\nHearth / llama-server: TTFT {ht / lt:.2f}, tok/s {hv / lv:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
