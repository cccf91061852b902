"""Semantic lookup latency of the response cache's stores by entries stored (not collected by
pytest).

Run:  python tests/bench/shared_cache.py [--sizes 100,1000,10000] [--lookups 50] [--dim 384]
                                          [--url redis://...]

For each size, that many entries (random unit vectors of ``--dim`` floats, MiniLM's width, and
a short answer) are put in a fresh SQLite store and a fresh Redis store, first all under one
semantic key, then spread over many (100 entries per key); then ``--lookups`` semantic lookups
of one key with a random vector (no hit: every candidate is compared) are timed. Prints the
median milliseconds per lookup. The SQLite store compares every stored entry of the key; the
Redis store at most ``SEMANTIC_CANDIDATES``. Without ``--url`` a redis-server is started on a
free loopback port (Debian's ``redis-server`` on PATH).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from app.core.gateway.cache.store import AnswerStore, CachedAnswer, CacheStore  # noqa: E402
from app.core.types import Delta, Usage  # noqa: E402
from app.redis_state.cache import SEMANTIC_CANDIDATES, RedisCacheStore  # noqa: E402
from app.redis_state.connection import SharedState  # noqa: E402

PER_KEY_SPREAD = 100  # entries per semantic key when spread
ANSWER = CachedAnswer(
    "m", ((Delta(text="Four."), Delta(finish_reason="stop", usage=Usage(12, 3))),)
)


def unit(rng: random.Random, dim: int) -> list[float]:
    v = [rng.gauss(0, 1) for _ in range(dim)]
    n = sum(x * x for x in v) ** 0.5
    return [x / n for x in v]


def fill(store: AnswerStore, size: int, spread: bool, dim: int, rng: random.Random) -> str:
    """``size`` entries; returns the semantic key the lookups read."""
    now = time.time()
    for i in range(size):
        skey = f"s{i // PER_KEY_SPREAD}" if spread else "s0"
        store.put(
            f"k{i}",
            ANSWER,
            now,
            max_entries=size + 1,
            ttl_s=3600,
            skey=skey,
            vector=unit(rng, dim),
        )
    return "s0"


def lookups(store: AnswerStore, skey: str, n: int, dim: int, rng: random.Random) -> float:
    """Median milliseconds per lookup."""
    times = []
    for _ in range(n):
        v = unit(rng, dim)
        t0 = time.perf_counter()
        got = store.nearest(skey, v, 0.99, time.time(), 3600)
        times.append((time.perf_counter() - t0) * 1000)
        assert got is None  # random vectors of this width are never that close
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="100,1000,10000")
    ap.add_argument("--lookups", type=int, default=50)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--url", default=None, help="a Redis to use (its hearth:cache: keys cleared)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    server = None
    url = args.url
    if url is None:
        from tests.support.redis_server import RedisServer

        server = RedisServer(Path(tempfile.mkdtemp(prefix="hearth-bench-redis-"))).start()
        url = server.url
    shared = SharedState(url)
    shared.sync.ping()
    shared.succeeded()
    rng = random.Random(7)
    rows = []
    try:
        for spread in (False, True):
            for size in sizes:
                folder = Path(tempfile.mkdtemp(prefix="hearth-bench-cache-"))
                sqlite = CacheStore(folder / "response_cache.sqlite")
                red = RedisCacheStore(shared)
                red.clear()
                row = [("spread" if spread else "one key"), size]
                for store in (sqlite, red):
                    skey = fill(store, size, spread, args.dim, rng)
                    row.append(lookups(store, skey, args.lookups, args.dim, rng))
                sqlite.close()
                red.clear()
                rows.append(row)
                print(".", end="", file=sys.stderr, flush=True)
    finally:
        shared.sync.close()
        if server is not None:
            server.close()
    print(file=sys.stderr)
    print(
        f"semantic lookup, median ms of {args.lookups} (dim {args.dim}, no hit; "
        f"Redis keeps {SEMANTIC_CANDIDATES} candidates per key, spread: "
        f"{PER_KEY_SPREAD} entries per key)"
    )
    print(f"{'layout':<8} {'entries':>8} {'sqlite ms':>10} {'redis ms':>10}")
    for layout, size, a, b in rows:
        print(f"{layout:<8} {size:>8} {a:>10.2f} {b:>10.2f}")


if __name__ == "__main__":
    main()
