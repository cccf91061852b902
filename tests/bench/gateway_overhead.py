"""What the gateway costs: an engine that answers at once, asked directly, through `hearth serve`
through a bare aiohttp pass-through proxy (``floor``: tests/bench/passthrough_proxy.py, what
any aiohttp gateway pays) and (optionally) through LiteLLM's proxy (not collected by pytest).

Run:  python tests/bench/gateway_overhead.py [--seconds 5] [--clients 1,64] [--rounds 3]
      [--only direct,hearth] [--baseline DIR]
      HEARTH_BENCH_LITELLM=/path/to/venv/bin/litellm adds LiteLLM's proxy in front of the engine.

The engine (tests/support/instant_engine.py: raw asyncio, a fixed 1-token answer, streamed or
whole) and this load generator run on core 1 (`taskset -c 1`); each gateway runs alone on core 0.
Load: N clients (each one keep-alive connection, raw asyncio HTTP/1.1) send 1-token chats back to
back for --seconds; each cell reports requests/s and p50/p99 latency in ms, the median of
--rounds rounds that interleave the subjects (a busy spell on the machine hits each alike). For a gateway it also
reports the gateway process's CPU time per request (utime+stime from /proc/PID/stat, before and
after the load): that figure barely moves with other load on the machine, so it is the one to
optimise against when the machine is never quiet. Ratios: hearth/direct and hearth/litellm
(requests/s), and the median latency Hearth adds to one client. `--baseline DIR` also measures
`hearth serve` from another checkout (`git worktree add DIR main`) in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.e2e.engines import free_port, http_request  # noqa: E402

GATEWAY_CORE, LOAD_CORE = 0, 1
TICK = os.sysconf("SC_CLK_TCK")


def pinned(core: int, argv: list[str]) -> list[str]:
    return ["taskset", "-c", str(core), *argv]


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process, from /proc/PID/stat (fields after the command's name)."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    fields = raw[raw.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def wait_http(url: str, deadline_s: float = 180) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            if http_request(url, timeout=5).status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    sys.exit(f"{url} never answered")


# -- the load generator ----------------------------------------------------------------------------
async def _read_response(r: asyncio.StreamReader) -> bytes:
    head = await r.readuntil(b"\r\n\r\n")
    status = head[9:12]
    length, chunked = -1, False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
    if chunked:
        body = bytearray()
        while True:
            size = int((await r.readline()).split(b";")[0], 16)
            data = await r.readexactly(size + 2)
            if not size:
                break
            body += data[:-2]
        payload = bytes(body)
    else:
        payload = await r.readexactly(length) if length >= 0 else await r.read()
    if status != b"200":
        raise RuntimeError(f"{status.decode()}: {payload[:300]!r}")
    return payload


async def _client(
    host: str, port: int, request: bytes, stop_at: float, lat: list[float], stream: bool
) -> None:
    r, w = await asyncio.open_connection(host, port)
    try:
        while time.perf_counter() < stop_at:
            t0 = time.perf_counter()
            w.write(request)
            body = await _read_response(r)
            if stream and b"[DONE]" not in body or not stream and b'"Hi"' not in body:
                raise RuntimeError(f"unexpected answer: {body[:300]!r}")
            lat.append(time.perf_counter() - t0)
    finally:
        w.close()


def load(base: str, model: str, clients: int, seconds: float, stream: bool) -> dict[str, float]:
    """N keep-alive clients, back to back for ``seconds``: requests/s, p50 and p99 in ms."""
    u = urlsplit(base)
    body = json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": "Say hi"}],
            "max_tokens": 1,
            "stream": stream,
        }  # fmt: skip
    ).encode()
    request = (
        f"POST {u.path}/chat/completions HTTP/1.1\r\nHost: {u.netloc}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body

    async def run() -> tuple[list[float], float]:
        lat: list[float] = []
        t0 = time.perf_counter()
        stop_at = t0 + seconds
        jobs = [_client(u.hostname or "", u.port or 80, request, stop_at, lat, stream)
                for _ in range(clients)]  # fmt: skip
        await asyncio.gather(*jobs)
        return lat, time.perf_counter() - t0

    lat, wall = asyncio.run(run())
    lat.sort()
    return {
        "rps": len(lat) / wall,
        "p50": lat[len(lat) // 2] * 1000,
        "p99": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000,
        "n": len(lat),
    }


# -- the subjects ----------------------------------------------------------------------------------
def start_engine() -> tuple[subprocess.Popen[str], str]:
    argv = [sys.executable, "-m", "tests.support.instant_engine", "--port", "0"]
    p = subprocess.Popen(pinned(LOAD_CORE, argv), stdout=subprocess.PIPE, text=True, cwd=REPO)
    url = (p.stdout.readline() if p.stdout else "").strip()
    if not url.startswith("http://"):
        sys.exit(f"the instant engine did not start: {url!r}")
    return p, url


def start_hearth(engine_url: str, checkout: Path) -> tuple[subprocess.Popen[str], str, str]:
    home = Path(tempfile.mkdtemp(prefix="hearth-bench-"))
    env = {**os.environ, "HEARTH_HOME": str(home)}
    env.pop("HEARTH_API_KEY", None)
    add = [sys.executable, "-m", "app", "providers", "add", "inst", engine_url, "--kind", "vllm"]
    r = subprocess.run(add, env=env, cwd=checkout, capture_output=True, text=True, timeout=300)
    if r.returncode:
        sys.exit(f"providers add failed: {r.stderr}")
    argv = [sys.executable, "-m", "app", "serve", "--port", "0"]
    err = (home / "serve.stderr").open("w")
    p = subprocess.Popen(
        pinned(GATEWAY_CORE, argv), stdout=subprocess.PIPE, stderr=err, text=True, env=env,
        cwd=checkout,
    )  # fmt: skip
    url = (p.stdout.readline() if p.stdout else "").strip()
    if not url.startswith("http://"):
        p.kill()
        sys.exit(f"hearth serve did not start: {url!r}; see {home / 'serve.stderr'}")
    root = url.removesuffix("/v1")
    end = time.monotonic() + 180
    while time.monotonic() < end:
        models = http_request(root + "/v1/models", timeout=10).body
        if any(m.get("id") == "inst/instant" for m in (models or {}).get("data", [])):
            return p, root + "/v1", "inst/instant"
        time.sleep(0.2)
    p.kill()
    sys.exit("hearth never listed the engine's model")


def start_floor(engine_url: str) -> tuple[subprocess.Popen[str], str, str]:
    """The bare aiohttp pass-through proxy (tests/bench/passthrough_proxy.py) on the gateway's
    core: what any aiohttp gateway pays before doing anything."""
    argv = [sys.executable, str(REPO / "tests" / "bench" / "passthrough_proxy.py"), engine_url]
    p = subprocess.Popen(pinned(GATEWAY_CORE, argv), stdout=subprocess.PIPE, text=True, cwd=REPO)
    url = (p.stdout.readline() if p.stdout else "").strip()
    if not url.startswith("http://"):
        sys.exit(f"the pass-through proxy did not start: {url!r}")
    return p, url, "instant"


def start_litellm(exe: str, engine_url: str) -> tuple[subprocess.Popen[str], str, str]:
    cfg = Path(tempfile.mkdtemp(prefix="litellm-bench-")) / "config.yaml"
    cfg.write_text(
        "model_list:\n  - model_name: instant\n    litellm_params:\n"
        f"      model: openai/instant\n      api_base: {engine_url}\n      api_key: none\n"
    )
    port = free_port()
    argv = [
        exe,
        "--config",
        str(cfg),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--num_workers",
        "1",
    ]
    p = subprocess.Popen(
        pinned(GATEWAY_CORE, argv), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        # no key, as Hearth runs here (loopback): its proxy starts keyless only when told to
        env={**os.environ, "LITELLM_LOG": "ERROR",
             "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true"},
    )  # fmt: skip
    wait_http(f"http://127.0.0.1:{port}/health/liveliness")
    return p, f"http://127.0.0.1:{port}/v1", "instant"


def measure(
    name: str, base: str, model: str, pid: int | None, a: argparse.Namespace
) -> dict[str, dict[str, float]]:
    load(base, model, 4, 1.0, False)  # warm up: connections, imports, first-request paths
    out: dict[str, dict[str, float]] = {}
    for stream in (False, True):
        for clients in a.clients:
            before = cpu_seconds(pid) if pid else 0.0
            got = load(base, model, clients, a.seconds, stream)
            if pid:
                got["cpu_ms"] = (cpu_seconds(pid) - before) / got["n"] * 1000
            key = f"{'stream' if stream else 'whole'} x{clients}"
            out[key] = got
            cpu = f" cpu/req {got['cpu_ms']:.3f} ms" if pid else ""
            print(f"  {name:8} {key:10} {got['rps']:8.0f} req/s  p50 {got['p50']:6.2f} ms"
                  f"  p99 {got['p99']:6.2f} ms{cpu}", file=sys.stderr)  # fmt: skip
    return out


def _median(rounds: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    return {
        cell: {k: statistics.median(r[cell][k] for r in rounds) for k in rounds[0][cell]}
        for cell in rounds[0]
    }


def table(results: dict[str, dict[str, dict[str, float]]]) -> None:
    names = list(results)
    keys = list(next(iter(results.values())))
    print(f"{'load':12}" + "".join(f"{n:>34}" for n in names))
    for k in keys:
        cells = []
        for n in names:
            c = results[n][k]
            cpu = f" {c['cpu_ms']:.2f}cpu" if "cpu_ms" in c else ""
            cells.append(f"{c['rps']:7.0f}/s p50 {c['p50']:5.2f} p99 {c['p99']:6.2f}{cpu}")
        print(f"{k:12}" + "".join(f"{c:>34}" for c in cells))
    direct = results.get("direct")
    for n in names:
        if n == "direct" or direct is None:
            continue
        for k in keys:
            ratio = results[n][k]["rps"] / direct[k]["rps"]
            added = results[n][k]["p50"] - direct[k]["p50"]
            print(f"{n}/direct {k:12} req/s x{ratio:.2f}  p50 +{added:.2f} ms")
    if "hearth" in results and "floor" in results:
        for k in keys:
            h, f = results["hearth"][k], results["floor"][k]
            extra = f" cpu/req +{h['cpu_ms'] - f['cpu_ms']:.2f} ms" if "cpu_ms" in h else ""
            print(f"hearth/floor {k:12} req/s x{h['rps'] / f['rps']:.2f}{extra}")
    if "hearth" in results and "litellm" in results:
        for k in keys:
            ratio = results["hearth"][k]["rps"] / results["litellm"][k]["rps"]
            print(f"hearth/litellm {k:12} req/s x{ratio:.2f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--clients", type=lambda s: [int(x) for x in s.split(",")], default=[1, 64])
    ap.add_argument("--rounds", type=int, default=1, help="each cell: the median of the rounds")
    ap.add_argument(
        "--only", default="", help="comma-separated subset of direct,hearth,floor,litellm"
    )
    ap.add_argument("--baseline", type=Path, default=None, help="another checkout's `hearth serve`")
    a = ap.parse_args()
    os.sched_setaffinity(0, {LOAD_CORE})
    only = set(filter(None, a.only.split(",")))
    engine, engine_url = start_engine()
    procs: list[subprocess.Popen[Any]] = [engine]
    subjects: dict[str, tuple[str, str, int | None]] = {}  # name -> (base URL, model, pid)
    try:
        if not only or "direct" in only:
            subjects["direct"] = (engine_url, "instant", None)
        checkouts = [("hearth", REPO)] + ([("baseline", a.baseline)] if a.baseline else [])
        for name, checkout in checkouts:
            if not only or name in only or name == "baseline":
                p, base, model = start_hearth(engine_url, checkout)
                procs.append(p)
                subjects[name] = (base, model, p.pid)
        if not only or "floor" in only:
            p, base, model = start_floor(engine_url)
            procs.append(p)
            subjects["floor"] = (base, model, p.pid)
        litellm = os.environ.get("HEARTH_BENCH_LITELLM")
        if litellm and (not only or "litellm" in only):
            p, base, model = start_litellm(litellm, engine_url)
            procs.append(p)
            subjects["litellm"] = (base, model, p.pid)
        rounds: dict[str, list[dict[str, dict[str, float]]]] = {n: [] for n in subjects}
        for _ in range(a.rounds):  # interleaved: a busy spell hits every subject alike
            for name, (base, model, pid) in subjects.items():
                rounds[name].append(measure(name, base, model, pid, a))
        results = {n: _median(r) for n, r in rounds.items()}
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(10)
    table(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
