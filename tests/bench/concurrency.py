"""Aggregate decode throughput under concurrent load: `parallel` 1 vs N (not collected).

Run:  python tests/bench/concurrency.py [--clients 4] [--tokens 128] [--runs 3] [--model PATH]

One `hearth serve` process; the model is loaded over the native API with `parallel` 1, then N,
alternately, `--runs` times each. Each round sends `--clients` streaming chat requests at once
(different prompts, greedy, the same number of tokens) and measures the whole round: all tokens
received / wall time from the first request sent to the last token. It also checks that every
answer equals the same prompt's answer with `parallel` 1 (batching must not change answers).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import signal
import statistics
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from throughput import default_model, start_serve, threads  # noqa: E402

TOPICS = ("a cat", "a lighthouse", "a dragon", "a robot", "the sea", "a city", "a forest", "rain")


def post(base: str, path: str, body: dict) -> dict:
    req = urllib.request.Request(
        base + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read() or b"{}")


def stream_chat(base: str, model_id: str, topic: str, n_tokens: int) -> tuple[str, int, float]:
    body = json.dumps(
        {
            "model": model_id,
            "messages": [{"role": "user", "content": f"Write a long story about {topic}."}],
            "max_tokens": n_tokens,
            "temperature": 0,
            "stream": True,
        }
    ).encode()
    req = urllib.request.Request(
        base + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
    )
    text, n, last = [], 0, 0.0
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            obj = json.loads(line[6:])
            if obj["choices"] and obj["choices"][0]["delta"].get("content"):
                text.append(obj["choices"][0]["delta"]["content"])
                n += 1
                last = time.perf_counter()
    return "".join(text), n, last


def round_trip(base: str, model_id: str, clients: int, n_tokens: int) -> tuple[float, list[str]]:
    topics = [TOPICS[i % len(TOPICS)] for i in range(clients)]
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as ex:
        out = list(ex.map(lambda t: stream_chat(base, model_id, t, n_tokens), topics))
    tokens = sum(n for _, n, _ in out)
    return tokens / (max(last for *_, last in out) - t0), [t for t, _, _ in out]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--ctx", type=int, default=2048)
    args = ap.parse_args()
    model = args.model or default_model()
    n_threads = threads()
    proc = start_serve(model, args.ctx, n_threads)
    try:
        assert proc.stdout is not None
        base = proc.stdout.readline().strip().removesuffix("/v1")
        model_id = ""
        for _ in range(600):  # `serve --model PATH` imports and loads it after listening
            with urllib.request.urlopen(base + "/api/v1/models", timeout=60) as r:
                ms = json.loads(r.read())["models"]
            if ms and ms[0]["state"] == "loaded":
                model_id = ms[0]["id"]
                break
            time.sleep(0.1)
        print(
            f"model {model.name}, {n_threads} threads, ctx {args.ctx} per sequence, "
            f"{args.clients} clients x {args.tokens} tokens"
        )
        results: dict[int, list[float]] = {1: [], args.clients: []}
        reference: list[str] | None = None
        same = True
        for _ in range(args.runs):
            for par in (1, args.clients):
                post(base, "/api/v1/models/unload", {"model": model_id})
                post(base, "/api/v1/models/load", {"model": model_id, "options": {"parallel": par}})
                round_trip(base, model_id, 1, 4)  # warm up
                tps, texts = round_trip(base, model_id, args.clients, args.tokens)
                results[par].append(tps)
                if reference is None:
                    reference = texts
                same = same and texts == reference
                print(f"  parallel {par}: {tps:.1f} tok/s in total")
        a, b = statistics.median(results[1]), statistics.median(results[args.clients])
        print(
            f"median: parallel 1 {a:.1f} tok/s, parallel {args.clients} {b:.1f} tok/s "
            f"(x{b / a:.2f}); answers identical: {same}"
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


if __name__ == "__main__":
    main()
