"""Child process for the memory-estimate test: load with mmap off, fill the context, report RSS.

Usage: python -m tests.runtimes.memory_probe FORMAT PATH CONTEXT HOME [PARALLEL [CACHE_MODE [FILL]]]
FILL: how many sequences fill the context (default PARALLEL).
Prints one JSON line: {"estimate": bytes, "measured": bytes, ...}.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path


async def main(
    fmt: str,
    path: str,
    ctx: int,
    home: str,
    parallel: int = 1,
    mode: str = "exact",
    fill: int = 0,
) -> None:
    from app.core.library import fit, formats
    from app.core.library.index import ModelLibrary
    from app.core.requests import CompletionRequest, EmbeddingRequest
    from app.core.service import assemble
    from app.core.types import LoadOptions, SamplingParams

    runtimes: dict = {}
    if fmt == "gguf":
        from app.runtimes.llama.backend import build_info
        from app.runtimes.llama.runtime import LlamaCppRuntime

        build_info()  # initialize the backend before the baseline
        runtimes["gguf"] = LlamaCppRuntime(probe_file=Path(home) / "probe.json")
    else:
        from app.runtimes.mlx.runtime import MlxRuntime, _import_mlx

        _import_mlx()
        runtimes["mlx"] = MlxRuntime()
    lib = ModelLibrary(Path(home) / "lib.json", Path(home) / "models")
    model, _ = lib.import_path(path)
    # mode: a prompt-cache mode, or "per-sequence" (reuse, a cache stream per sequence)
    layout = "per-sequence" if mode == "per-sequence" else "shared"
    cache = "reuse" if mode == "per-sequence" else mode
    options = LoadOptions(
        context_length=ctx, use_mmap=False, parallel=parallel, prompt_cache=cache, kv_layout=layout
    )
    h = assemble(lib, runtimes, load_defaults=lambda: options, budget_bytes=lambda: 1 << 40)
    estimate = formats.estimate_model(model, options)
    if fmt == "gguf":  # the probe child runs once, outside this measurement
        from app.core.library.gguf import read_header

        header = read_header(path)
        runtimes["gguf"].prober.check(
            [path],
            name=model.id,
            data_offset=header.data_offset,
            weight_type=header.quantization or "",
            build_info=build_info(),
            options=options,
            embedding=bool(model.extra.get("embedding")),
        )
    before = fit.current_rss()
    lm = await h.models.load(model.id)
    after_load = fit.current_rss()
    if "embeddings" in lm.capabilities:
        n = lm.context_length - 2
        await h.embed(EmbeddingRequest(model.id, (tuple(100 + (i % 1000) for i in range(n)),)))
    else:
        words = "the lighthouse keeper watched the sea "
        # separate caches: each sequence fills its own; a shared one: they fill it together
        fill = fill or parallel
        share = 1 if fit.separate_caches(cache, layout) else fill
        tokens = lm.tokenize(words * 2000, add_special=True, parse_special=False)[
            : lm.context_length // share - 2
        ]

        async def one(i: int) -> None:  # a different prompt per sequence: one cache stream each
            choices = await h.complete(
                CompletionRequest(
                    model.id,
                    ((tokens[0], 100 + i, *tokens[2:]),),
                    sampling=SamplingParams(temperature=0),
                    max_tokens=1,
                )
            )
            gen = choices.first
            await gen.collect()

        await asyncio.gather(*(one(i) for i in range(fill)))
        if estimate.prompt_ram:  # other conversations fill it again: the first go to host memory
            await asyncio.gather(*(one(fill + i) for i in range(fill)))
    after = fit.current_rss()
    print(
        json.dumps(
            {
                "estimate": estimate.total,
                "parts": estimate.as_dict(),
                "measured": after - before,
                "measured_after_load": after_load - before,
                "context": lm.context_length,
            }
        )
    )
    await h.close()


if __name__ == "__main__":
    par = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    mode = sys.argv[6] if len(sys.argv) > 6 else "exact"
    n_fill = int(sys.argv[7]) if len(sys.argv) > 7 else 0
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], par, mode, n_fill))
    # measured and closed: leave without the interpreter's teardown, where MLX's CPU build may
    # abort ("terminate called without an active exception", seen once in the suite, after the
    # result was printed; ml-explore/mlx#1473 is the same class of exit crash)
    sys.stdout.flush()
    os._exit(0)
