"""Prompt scoring throughput in process (not collected by pytest): a multiple-choice list (one
question, several answers) scored as one request's list and one prompt per request, in the
shared cache and with a cache per sequence.

Run:  python tests/bench/scoring.py [--model PATH] [--questions 5] [--answers 4] [--rounds 2]

In a shared cache each prompt is read whole and alone (llama.cpp's shared-cache attention moves
rows otherwise: tests/bench/attention_paths.py); with a cache per sequence a list is read in
waves of shared decodes, each question once. It prints, per layout and way, prompts scored per
second and the prompt tokens decoded (fewer is the shared prefix read once).
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
from app.core.service import assemble  # noqa: E402
from app.core.types import LoadOptions  # noqa: E402
from app.runtimes.llama.runtime import LlamaCppRuntime  # noqa: E402
from tests.bench.vs_llama_server import default_model  # noqa: E402

ANSWERS = [" the sea", " a forest of tall trees", " the moon at night", " a busy city street"]


async def measure(model: Path, layout: str, questions: int, answers: int) -> dict[str, tuple]:
    home = Path(tempfile.mkdtemp(prefix="hearth-score-"))
    lib = ModelLibrary(home / "library.json", home / "models")
    opts = LoadOptions(context_length=2048, kv_layout=layout)
    h = assemble(
        lib, {"gguf": LlamaCppRuntime(probe_file=home / "probe.json")}, load_defaults=lambda: opts
    )
    try:
        mid, _ = h.models.import_path(model)
        lm = await h.models.load(mid.id)

        def tok(text: str, special: bool = False) -> list[int]:
            return lm.tokenize(text, add_special=special, parse_special=False)

        out = {}
        for way, salt in (("one list", "A"), ("one per request", "B")):
            prompts = [
                tok(f"Question {salt}{q}: where would you most like to be right now? Answer:", True)
                + tok(a)
                for q in range(questions)
                for a in ANSWERS[:answers]
            ]
            t0 = time.perf_counter()
            if way == "one list":
                scored = await lm.score_prompts(prompts, 1)  # type: ignore[attr-defined]
            else:
                scored = [(await lm.score_prompts([p], 1))[0] for p in prompts]  # type: ignore[attr-defined]
            dt = time.perf_counter() - t0
            out[way] = (len(prompts) / dt, sum(s.decoded for s in scored), sum(map(len, prompts)))
        return out
    finally:
        await h.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--questions", type=int, default=5)
    ap.add_argument("--answers", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    model = args.model or default_model()
    for r in range(args.rounds):
        for layout in ("shared", "per-sequence"):
            res = asyncio.run(measure(model, layout, args.questions, args.answers))
            for way, (rate, decoded, total) in res.items():
                print(
                    f"round {r + 1}  {layout:12}  {way:16}  {rate:7.1f} prompts/s  "
                    f"decoded {decoded}/{total} prompt tokens"
                )


if __name__ == "__main__":
    main()
