"""Flash attention on vs off on this machine, in process (not collected by pytest): how long a
prompt takes to read and how fast one stream then decodes, by prompt length.

Run:  python tests/bench/flash_attention.py [--model PATH] [--sizes 0,250,1000,3000]
          [--rounds 2] [--tokens 64]

llama.cpp's CPU flash-attention kernel costs each decoded token every cached cell, at a price
that depends on the CPU (Hearth's `auto` is off on CPU-only builds; see the README's
`flash_attention`). Each round loads the model once per setting (the same context, threads and
greedy sampling) and, for each size, reads a prompt of about that many tokens and decodes
--tokens tokens. It prints, per setting: prompt tokens, prompt ms, and decode tok/s.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from app.core.library.index import ModelLibrary  # noqa: E402
from app.core.service import assemble  # noqa: E402
from app.core.types import ChatMessage, LoadOptions, SamplingParams  # noqa: E402
from app.runtimes.llama.runtime import LlamaCppRuntime  # noqa: E402
from tests.bench.vs_llama_server import FILLER, default_model  # noqa: E402
from tests.support.service_calls import chat  # noqa: E402

GREEDY = SamplingParams(temperature=0)


async def measure(
    model: Path, fa: str, sizes: list[int], tokens: int, ctx: int
) -> list[tuple[int, float, float]]:
    home = Path(tempfile.mkdtemp(prefix="hearth-fa-"))
    lib = ModelLibrary(home / "library.json", home / "models")
    opts = LoadOptions(flash_attention=fa, speculative="off", context_length=ctx)
    h = assemble(
        lib, {"gguf": LlamaCppRuntime(probe_file=home / "probe.json")}, load_defaults=lambda: opts
    )
    m, _ = h.models.import_path(model)
    out = []
    try:
        await h.models.load(m.id)
        for n in sizes:
            text = ("Meeting notes. " + FILLER * (n // 16 + 1))[: n * 4]
            msg = [ChatMessage("user", f"{text} Write story number {n}.")]
            gen = await chat(h, m.id, msg, sampling=GREEDY, max_tokens=tokens)
            tm = (await gen.collect()).final.timings
            out.append((tm.prompt_n, tm.prompt_ms, tm.predicted_per_second))
    finally:
        await h.close()
    return out


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--sizes", default="0,250,1000,3000")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--ctx", type=int, default=8192)
    a = ap.parse_args()
    model = a.model or default_model()
    sizes = [int(s) for s in a.sizes.split(",")]
    for r in range(a.rounds):
        for fa in ("on", "off"):
            rows = await measure(model, fa, sizes, a.tokens, a.ctx)
            cells = ", ".join(f"{n} tok: {ms:.0f} ms, {tps:.1f} tok/s" for n, ms, tps in rows)
            print(f"round {r + 1} flash attention {fa:3}: {cells}", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
