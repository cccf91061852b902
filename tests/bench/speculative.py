"""Speculative decoding by prompt lookup: decode speed with `speculative` "ngram" vs "off", in
process, on a "repeat/edit this document" workload and on prose (not collected by pytest).

Run:  python tests/bench/speculative.py [--model PATH] [--rounds 3] [--tokens 200]

Each workload is a greedy chat answer on a fresh load of each setting (prompt cache off, so
every round reads its prompt); the rounds interleave the settings. Prints, per workload, the
median decode tok/s (timings.predicted_n / predicted_ms) of each, their ratio, the share of
drafted tokens kept, and whether the answers were the same text.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from app.core.library.index import ModelLibrary  # noqa: E402
from app.core.service import assemble  # noqa: E402
from app.core.types import ChatMessage, LoadOptions, SamplingParams  # noqa: E402
from app.runtimes.llama.runtime import LlamaCppRuntime  # noqa: E402
from tests.conftest import smollm2_file, transcript  # noqa: E402
from tests.support.service_calls import chat  # noqa: E402

DOC = (
    "The lighthouse stood on the rocks at the edge of the bay. Every night the keeper climbed "
    "the hundred steps, trimmed the wick and lit the great lamp, and every morning he wrote "
    "the weather in his book: the wind, the clouds, the ships that passed. "
)
CODE = '''def area(width, height):
    """The area of a rectangle."""
    return width * height


def perimeter(width, height):
    """The perimeter of a rectangle."""
    return 2 * (width + height)


def describe(width, height):
    return f"{width} x {height}: area {area(width, height)}, perimeter {perimeter(width, height)}"
'''
WORKLOADS = {
    "repeat a document": "Repeat this text exactly:\n\n" + DOC * 3,
    "edit code (rename)": "Rewrite this code with the function `area` renamed to "
    "`rectangle_area`. Reply with the whole code only.\n\n```python\n" + CODE + "```",
    "prose (no repeats)": "Write a short poem about the sea.",
}


async def answer(model: Path, speculative: str, prompt: str, tokens: int) -> tuple:
    tmp = Path(tempfile.mkdtemp())
    lib = ModelLibrary(tmp / "library.json", tmp / "models")
    opts = LoadOptions(context_length=4096, prompt_cache="off", speculative=speculative)
    h = assemble(lib, {"gguf": LlamaCppRuntime(probe_file=tmp / "probe.json")},
               load_defaults=lambda: opts)  # fmt: skip
    try:
        m, _ = lib.import_path(model)
        await h.models.load(m.id)
        gen = await chat(h, m.id, [ChatMessage("user", prompt)],
                         sampling=SamplingParams(temperature=0), max_tokens=tokens)  # fmt: skip
        text, _, final = await transcript(gen)
        t = final.timings
        return text, t.predicted_n / t.predicted_ms * 1000, t.draft_n, t.draft_n_accepted
    finally:
        await h.close()


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", type=Path, default=smollm2_file())
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=200)
    args = ap.parse_args()
    print(f"{args.model.name}, greedy, up to {args.tokens} tokens, medians of {args.rounds}")
    print("| workload | answer | off tok/s | ngram tok/s | ngram / off | drafts kept | same text |")
    print("|---|---|---|---|---|---|---|")
    for name, prompt in WORKLOADS.items():
        off, on, kept, same, n = [], [], [], True, 0
        for _ in range(args.rounds):
            a = await answer(args.model, "off", prompt, args.tokens)
            b = await answer(args.model, "ngram", prompt, args.tokens)
            off.append(a[1])
            on.append(b[1])
            kept.append(b[3] / b[2] if b[2] else 0.0)
            same = same and a[0] == b[0]
            n = len(a[0])
        o, g = statistics.median(off), statistics.median(on)
        print(f"| {name} | {n} chars | {o:.1f} | {g:.1f} | {g / o:.2f} | "
              f"{statistics.median(kept):.0%} | {'yes' if same else 'NO'} |")  # fmt: skip


if __name__ == "__main__":
    asyncio.run(main())
