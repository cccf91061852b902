"""Bench: malformed GGUF files against Hearth's import, load and first request (not collected).

Runs the whole mutation corpus of tests/support/gguf_corpus.py (every semantic case and N seeded
byte-level mutations of the tiny model; optionally M of SmolLM2 itself) through
``python -m tests.support.gguf_corpus`` in a subprocess, and prints the outcome counts, the time, and
any file that was neither refused with a reason nor worked. Then it measures what the probe costs
a real model: the first load of an unknown SmolLM2 (a child loads it and serves one request)
against the load of a known one (a verdict lookup).

    python tests/bench/gguf_fuzz.py [--seed 1] [--random 1000] [--smollm2 0] [--no-timing]
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def run_corpus(cases: list, work: Path) -> dict:  # type: ignore[type-arg]
    files = work / "files"
    files.mkdir(parents=True)
    for c in cases:
        (files / f"{c.name}.gguf").write_bytes(c.data)
    report = work / "report.jsonl"
    t0 = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.support.gguf_corpus",
            str(files),
            str(work / "home"),
            str(report),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    secs = time.perf_counter() - t0
    rows = [json.loads(line) for line in report.read_text().splitlines()]
    started = [r["file"] for r in rows if r.get("at") == "start"]
    results = [r for r in rows if "outcome" in r]
    return {
        "rc": proc.returncode,
        "died_on": started[-1] if proc.returncode else None,
        "stderr": proc.stderr[-1500:] if proc.returncode else "",
        "seconds": secs,
        "results": results,
    }


def summarize(label: str, out: dict) -> None:  # type: ignore[type-arg]
    res = out["results"]
    counts = collections.Counter(f"{r['outcome']}@{r['stage']}" for r in res)
    probe_crashes = [r for r in res if "llama.cpp crashed" in (r.get("message") or "")]
    odd = [
        r
        for r in res
        if r["outcome"] not in ("works", "refused")
        or (r["outcome"] == "refused" and not r.get("message"))
    ]
    print(f"\n== {label}: {len(res)} files in {out['seconds']:.0f}s (exit {out['rc']})")
    for k, v in sorted(counts.items()):
        print(f"   {k:20s} {v}")
    print(f"   caught only by the probe child (llama.cpp crashed there): {len(probe_crashes)}")
    for r in probe_crashes[:10]:
        print(f"     {r['file']}: {r['message'][:200]}")
    if out["died_on"]:
        print(f"   HEARTH DIED on {out['died_on']}:\n{out['stderr']}")
    for r in odd[:20]:
        print(f"   NEITHER REFUSED NOR WORKING: {r}")


def timing(smollm2: Path, reps: int) -> None:
    import asyncio

    from app.core.library.index import ModelLibrary
    from app.core.service import assemble
    from app.core.types import LoadOptions
    from app.runtimes.llama.runtime import LlamaCppRuntime

    async def load_once(home: Path) -> float:
        lib = ModelLibrary(home / "library.json", home / "models")
        rt = LlamaCppRuntime(probe_file=home / "runtime-probe.json")
        h = assemble(lib, {"gguf": rt}, load_defaults=lambda: LoadOptions(context_length=2048))
        model, _ = h.models.import_path(smollm2)
        t0 = time.perf_counter()
        await h.models.load(model.id)
        secs = time.perf_counter() - t0
        await h.close()
        return secs

    unknown, known = [], []
    for _ in range(reps):
        with tempfile.TemporaryDirectory() as d:
            unknown.append(asyncio.run(load_once(Path(d))))  # a fresh cache: a child runs
            known.append(asyncio.run(load_once(Path(d))))  # the same cache: a lookup
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    print(f"\n== SmolLM2 ({smollm2.stat().st_size / 1e6:.0f} MB) load, median of {reps}:")
    print(
        f"   unknown file (probe child + load): {med(unknown):.2f}s  {[round(x, 2) for x in unknown]}"
    )
    print(
        f"   known file (verdict lookup + load): {med(known):.2f}s  {[round(x, 2) for x in known]}"
    )
    print(f"   the probe's extra time on a first load: {med(unknown) - med(known):.2f}s")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--random", type=int, default=1000, help="byte-level mutations of the tiny model"
    )
    ap.add_argument("--smollm2", type=int, default=0, help="byte-level mutations of SmolLM2 itself")
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()

    from tests.conftest import smollm2_file
    from tests.support.gguf_corpus import byte_cases, corpus, spec_from_file

    with tempfile.TemporaryDirectory() as d:
        out = run_corpus(corpus(args.seed, args.random), Path(d) / "tiny")
        summarize(f"tiny llama corpus (seed {args.seed})", out)
    smollm2 = smollm2_file()
    if args.smollm2 and smollm2 is not None:
        base = spec_from_file(smollm2)
        cases = list(byte_cases(base, random.Random(args.seed), args.smollm2))
        with tempfile.TemporaryDirectory() as d:
            summarize(
                f"SmolLM2 header mutations (seed {args.seed})", run_corpus(cases, Path(d) / "s")
            )
    if not args.no_timing and smollm2 is not None:
        timing(smollm2, args.reps)


if __name__ == "__main__":
    main()
