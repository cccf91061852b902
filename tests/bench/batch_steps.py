"""Aggregate decode speed of N concurrent streams in process (no HTTP), by cache layout and by
how full the cache is of idle conversations (not collected by pytest).

Run:  python tests/bench/batch_steps.py [--streams 8] [--tokens 128] [--ctx 4096] [--idle 16]

For each load (the shared cache with `parallel` = N, and `--kv-layout per-sequence`) it runs
N greedy chat streams on a fresh cache, then answers --idle other conversations one by one
(their caches stay, as a server's do) and runs the N streams again. It prints tok/s for each,
and the mean decode-step time, so a cost that grows with the cache's used cells shows.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from app.core.library.index import ModelLibrary  # noqa: E402
from app.core.service import Hearth, assemble  # noqa: E402
from app.core.types import ChatMessage, LoadOptions, SamplingParams  # noqa: E402
from app.runtimes.llama.runtime import LlamaCppRuntime  # noqa: E402
from tests.bench.vs_llama_server import TOPICS, default_model  # noqa: E402
from tests.support.service_calls import chat  # noqa: E402

GREEDY = SamplingParams(temperature=0)


async def streams(h: Hearth, mid: str, n: int, tokens: int, tag: str) -> float:
    async def one(i: int) -> int:
        msg = f"{tag} Write a long story about {TOPICS[i % len(TOPICS)]}."
        gen = await chat(h, mid, [ChatMessage("user", msg)], sampling=GREEDY, max_tokens=tokens)
        final = (await gen.collect()).final
        return final.usage.completion_tokens

    t0 = time.perf_counter()
    total = sum(await asyncio.gather(*(one(i) for i in range(n))))
    return total / (time.perf_counter() - t0)


async def run(model: Path, opts: LoadOptions, a: argparse.Namespace) -> dict[str, float]:
    home = Path(tempfile.mkdtemp(prefix="hearth-steps-"))
    lib = ModelLibrary(home / "library.json", home / "models")
    rt = LlamaCppRuntime(probe_file=home / "probe.json")
    h = assemble(lib, {"gguf": rt}, load_defaults=lambda: opts)
    m, _ = h.models.import_path(model)
    try:
        lm = await h.models.load(m.id)
        engine = lm.engine  # type: ignore[attr-defined]
        steps: list[float] = []
        real = engine._decode_step

        def timed(decoded: list, riders: list | None = None) -> int:
            t0 = time.perf_counter()
            rc = real(decoded, riders)
            if len(decoded) == a.streams and not riders:
                steps.append(time.perf_counter() - t0)
            return rc

        engine._decode_step = timed
        await streams(h, m.id, a.streams, 8, "Warm up.")
        steps.clear()
        out = {"fresh tok/s": await streams(h, m.id, a.streams, a.tokens, "Round one.")}
        out["fresh step ms"] = 1000 * sum(steps) / max(1, len(steps))
        for i in range(a.idle):  # other conversations, answered one by one; their caches stay
            await streams(h, m.id, 1, 48, f"Conversation {i} about {TOPICS[i % 8]}.")
        steps.clear()
        out["with idle caches tok/s"] = await streams(h, m.id, a.streams, a.tokens, "Round two.")
        out["with idle caches step ms"] = 1000 * sum(steps) / max(1, len(steps))
        return out
    finally:
        await h.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--idle", type=int, default=16)
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--only", choices=("shared", "per-sequence"), default=None)
    a = ap.parse_args()
    model = a.model or default_model()
    loads = {
        "shared": LoadOptions(context_length=a.ctx, parallel=a.streams),
        "per-sequence": LoadOptions(
            context_length=max(512, a.ctx // a.streams * 2),
            parallel=a.streams,
            kv_layout="per-sequence",
        ),
    }
    for label, opts in loads.items():
        if a.only and label != a.only:
            continue
        res = asyncio.run(run(model, opts, a))
        print(label, " ".join(f"{k}={v:.1f}" for k, v in res.items()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
