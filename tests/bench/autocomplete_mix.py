"""Editor autocomplete beside an agent and chats, Hearth against llama-server (not collected by
pytest).

Run:  python tests/bench/autocomplete_mix.py [--seconds 90] [--baseline DIR] [--model PATH]
      [--only-hearth]

Each engine runs alone, one after the other, for --seconds under the same mixed load:
- an agent: a conversation that grows from ~1,500 to ~3,000 prompt tokens (each turn adds its
  answer and a ~150-token tool result, then starts over), one turn after another (64 tokens);
- two chat streams, one request after another each (128-token greedy stories);
- an editor's completion every 0.7 s: /v1/completions of a ~400-token code prefix that grows
  a few characters a keystroke, 16 tokens, streamed; sent on time whether or not the last one
  ended (an editor does not wait).
Engines: llama-server with its defaults (`-m`, `-t` the physical cores and `--no-repack`: its
own context, sequences and unified cache), `hearth serve` of this checkout with its defaults (context
8,192), and with --baseline DIR the same `hearth serve` of another checkout (`git worktree add
DIR main`: "today" measured in the same run). Prints per engine: the completions' TTFT p50
and p95, the agent's turns and p50 turn time, the chat tokens a second per stream; then the
ratios Hearth / llama-server and Hearth / baseline.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from app.runtimes.llama.backend import physical_cores  # noqa: E402
from tests.bench.vs_llama_server import default_model, sse_objects, stream  # noqa: E402
from tests.e2e.engines import LLAMA_SERVER_HOWTO, free_port, llama_server_binary  # noqa: E402
from tests.e2e.serveproc import start_serve  # noqa: E402

CTX = 8192
TOOL = (
    "Tool result: the build log shows the compiler ran over src/parser.c, src/lexer.c and "
    "src/main.c; two warnings about unused variables in lexer.c line {n}; the tests passed "
    "in 3.2 seconds; coverage 81 percent; the linker reported no errors. "
)
CODE = '''import math
from dataclasses import dataclass


@dataclass
class Point:
    """A point in the plane."""

    x: float
    y: float

    def distance(self, other: "Point") -> float:
        """The straight-line distance to another point."""
        return math.hypot(self.x - other.x, self.y - other.y)

    def moved(self, dx: float, dy: float) -> "Point":
        return Point(self.x + dx, self.y + dy)


@dataclass
class Rectangle:
    """An axis-aligned rectangle from its lower-left corner."""

    corner: Point
    width: float
    height: float

    def area(self) -> float:
        return self.width * self.height

    def perimeter(self) -> float:
        return 2 * (self.width + self.height)

    def contains(self, p: Point) -> bool:
        return (
            self.corner.x <= p.x <= self.corner.x + self.width
            and self.corner.y <= p.y <= self.corner.y + self.height
        )


def bounding_box(points: list[Point]) -> Rectangle:
    """The smallest rectangle holding every point."""
    xs = [p.x for p in points]
    ys = [p.y for p in points]
'''
TYPED = "    low = Point(min(xs), min(ys))\n    return Rectangle(low, max(xs) - low.x, max(ys) - low.y)\n"


def completion_ttft(root: str, model: str, prompt: str) -> float | None:
    """Seconds to the first streamed text of a 16-token completion (None: no text came)."""
    u = urlsplit(root)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    body = {"model": model, "prompt": prompt, "max_tokens": 16, "temperature": 0,
            "stream": True}  # fmt: skip
    t0 = time.perf_counter()
    try:
        conn.request(
            "POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"}
        )
        for obj in sse_objects(conn.getresponse()):
            if obj.get("choices") and obj["choices"][0].get("text"):
                return time.perf_counter() - t0
    finally:
        conn.close()
    return None


def mix(root: str, model: str, seconds: float) -> dict[str, float]:
    """Run the mixed load on one engine for ``seconds``; its numbers."""
    stream(root, model, [{"role": "user", "content": "warm up"}], 4)
    end = time.monotonic() + seconds
    ttfts: list[float] = []
    turns: list[float] = []
    chat: list[tuple[int, float]] = [(0, 0.0), (0, 0.0)]
    lock = threading.Lock()

    def agent() -> None:
        base = [{"role": "system", "content": "You are a build assistant. " + TOOL.format(n=0) * 9}]
        msgs = list(base)
        n = 0
        while time.monotonic() < end:
            n += 1
            msgs.append({"role": "user", "content": TOOL.format(n=n) + " What next?"})
            _, _, took, text = stream(root, model, msgs, 64)
            with lock:
                turns.append(took)
            msgs.append({"role": "assistant", "content": text})
            if sum(len(m["content"]) for m in msgs) > 3000 * 4:  # ~3,000 tokens: start over
                msgs = list(base)

    def chatter(i: int) -> None:
        topics = ("a lighthouse", "a dragon", "the sea", "a city")
        k = 0
        while time.monotonic() < end:
            topic = topics[(2 * k + i) % len(topics)]
            msgs = [{"role": "user", "content": f"Write a long story about {topic}."}]
            n, _, took, _ = stream(root, model, msgs, 128)
            with lock:
                done, spent = chat[i]
                chat[i] = (done + n, spent + took)
            k += 1

    def keystroke(j: int) -> None:
        prompt = CODE + TYPED[: 3 * (j % (len(TYPED) // 3))]
        t = completion_ttft(root, model, prompt)
        if t is not None:
            with lock:
                ttfts.append(t)

    workers = [threading.Thread(target=agent), *(threading.Thread(target=chatter, args=(i,))
                                                   for i in range(2))]  # fmt: skip
    for w in workers:
        w.start()
    keys: list[threading.Thread] = []
    j = 0
    next_at = time.monotonic()
    while next_at < end:
        time.sleep(max(0.0, next_at - time.monotonic()))
        k = threading.Thread(target=keystroke, args=(j,))
        k.start()
        keys.append(k)
        j += 1
        next_at += 0.7
    for t in [*workers, *keys]:
        t.join()
    q = statistics.quantiles(ttfts, n=20) if len(ttfts) > 1 else [float("nan")] * 19
    return {
        "completion TTFT p50 s": statistics.median(ttfts) if ttfts else float("nan"),
        "completion TTFT p95 s": q[18],
        "agent turns": float(len(turns)),
        "agent turn p50 s": statistics.median(turns) if turns else float("nan"),
        "chat tok/s per stream": statistics.mean(n / s for n, s in chat if s > 0),
    }


def llama_server(
    exe: Path, model: Path, extra: tuple[str, ...] = ()
) -> tuple[subprocess.Popen[Any], str]:
    """A ready llama-server with its defaults (its context, sequences and unified cache), the
    physical cores' threads, and no repacked weights (they crash llama.cpp on these Xeons)."""
    port = free_port()
    t = str(physical_cores())
    argv = [str(exe), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-t", t,
            "-tb", t, "--alias", "m", "--no-repack", *extra]  # fmt: skip
    env = {**os.environ, "LD_LIBRARY_PATH": str(exe.parent)}
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and p.poll() is None:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return p, f"http://127.0.0.1:{port}"
        except OSError:
            pass
        time.sleep(0.2)
    p.kill()
    sys.exit("llama-server never got ready")


def hearth(model: Path, seconds: float, tree: Path | None) -> dict[str, float]:
    home = Path(tempfile.mkdtemp(prefix="hearth-mix-"))
    s = start_serve(home, model, settings={"load": {"context_length": CTX}}, cwd=tree)
    try:
        return mix(s.root, next(iter(s.models.values())), seconds)
    finally:
        s.stop()
        shutil.rmtree(home, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seconds", type=float, default=90.0)
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--baseline", type=Path, default=None, help="another checkout's root")
    ap.add_argument("--only-hearth", action="store_true")
    a = ap.parse_args()
    model = a.model or default_model()
    cols: dict[str, dict[str, float]] = {}
    if not a.only_hearth:
        exe = llama_server_binary()
        if exe is None:
            sys.exit(LLAMA_SERVER_HOWTO)
        p, root = llama_server(exe, model)
        try:
            cols["llama-server"] = mix(root, "m", a.seconds)
        finally:
            p.kill()
    cols["Hearth"] = hearth(model, a.seconds, None)
    if a.baseline is not None:
        cols["baseline"] = hearth(model, a.seconds, a.baseline)
    rows = list(cols["Hearth"])
    print(f"{'':26}" + "".join(f"{c:>14}" for c in cols))
    for r in rows:
        print(f"{r:26}" + "".join(f"{cols[c][r]:>14.3f}" for c in cols))
    for other in ("llama-server", "baseline"):
        if other in cols:
            print(f"\nHearth / {other}")
            for r in rows:
                print(f"  {r:24}{cols['Hearth'][r] / cols[other][r]:>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
