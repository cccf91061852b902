"""Speculative decoding by prompt lookup: decode speed with `speculative` "ngram" vs "off", in
process, on a "repeat/edit this document" workload and on prose (not collected by pytest).

Run:  python tests/bench/speculative.py [--model PATH] [--rounds 3] [--tokens 200]
      [--llama-server]

Each workload is a greedy chat answer on a fresh load of each setting (prompt cache off, so
every round reads its prompt); the rounds interleave the settings. Prints, per workload, the
median decode tok/s (timings.predicted_n / predicted_ms) of each, their ratio, the share of
drafted tokens kept, and whether the answers were the same text. With --llama-server, also
llama.cpp's llama-server with `--spec-type ngram-mod` and without (its /v1/chat/completions,
greedy, its prompt cache off; decode tok/s from its `timings`), and Hearth's ngram / its
ngram-mod.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from app.core.library.index import ModelLibrary  # noqa: E402
from app.core.service import assemble  # noqa: E402
from app.core.types import ChatMessage, LoadOptions, SamplingParams  # noqa: E402
from app.runtimes.llama.runtime import LlamaCppRuntime  # noqa: E402
from tests.bench.autocomplete_mix import llama_server  # noqa: E402
from tests.conftest import smollm2_file, transcript  # noqa: E402
from tests.e2e.engines import LLAMA_SERVER_HOWTO, llama_server_binary  # noqa: E402
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


def ls_answer(root: str, prompt: str, tokens: int) -> tuple[str, float]:
    """llama-server's greedy chat answer and its decode tok/s."""
    u = urlsplit(root)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    body = {"model": "m", "messages": [{"role": "user", "content": prompt}], "temperature": 0,
            "max_tokens": tokens, "cache_prompt": False}  # fmt: skip
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body),
                     {"Content-Type": "application/json"})  # fmt: skip
        out = json.loads(conn.getresponse().read())
    finally:
        conn.close()
    t = out["timings"]
    return out["choices"][0]["message"]["content"], float(t["predicted_per_second"])


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", type=Path, default=smollm2_file())
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--llama-server", action="store_true")
    args = ap.parse_args()
    servers: dict[str, tuple[Any, str]] = {}
    if args.llama_server:
        exe = llama_server_binary()
        if exe is None:
            sys.exit(LLAMA_SERVER_HOWTO)
        servers["none"] = llama_server(exe, args.model)
        servers["ngram-mod"] = llama_server(exe, args.model, ("--spec-type", "ngram-mod"))
    print(f"{args.model.name}, greedy, up to {args.tokens} tokens, medians of {args.rounds}")
    head = "| workload | answer | off tok/s | ngram tok/s | ngram / off | drafts kept | same text |"
    if servers:
        head += " llama-server tok/s | with ngram-mod | Hearth ngram / ngram-mod |"
    print(head)
    print("|---" * head.count(" | ") + "|")
    try:
        for name, prompt in WORKLOADS.items():
            off, on, kept, same, n = [], [], [], True, 0
            ls: dict[str, list[float]] = {k: [] for k in servers}
            for _ in range(args.rounds):
                a = await answer(args.model, "off", prompt, args.tokens)
                b = await answer(args.model, "ngram", prompt, args.tokens)
                off.append(a[1])
                on.append(b[1])
                kept.append(b[3] / b[2] if b[2] else 0.0)
                same = same and a[0] == b[0]
                n = len(a[0])
                for k, (_, root) in servers.items():
                    ls[k].append(ls_answer(root, prompt, args.tokens)[1])
            o, g = statistics.median(off), statistics.median(on)
            row = (f"| {name} | {n} chars | {o:.1f} | {g:.1f} | {g / o:.2f} | "
                   f"{statistics.median(kept):.0%} | {'yes' if same else 'NO'} |")  # fmt: skip
            if servers:
                plain, mod = statistics.median(ls["none"]), statistics.median(ls["ngram-mod"])
                row += f" {plain:.1f} | {mod:.1f} | {g / mod:.2f} |"
            print(row)
    finally:
        for p, _ in servers.values():
            p.kill()


if __name__ == "__main__":
    asyncio.run(main())
