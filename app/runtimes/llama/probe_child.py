"""The probe child: load a GGUF file with llama.cpp and serve it one first request, then exit.

Started by ``app.runtimes.llama.probe`` as ``python -m app.runtimes.llama.probe_child SPEC``
(SPEC is JSON). It builds the same engine Hearth builds in process (``LlamaEngine`` and
``LlamaCppModel`` with the caller's load options and a small context) and does what a first
request does: the special tokens' pieces, tokenizing a chat prompt with special tokens, prompt
decode, sampling (penalties, top-k/p, min-p, logprobs) and token pieces; for an embedding model,
one embedding. Progress goes to stdout as ``HEARTH-PROBE {json}`` lines (the stage about to
run, then the result), so when llama.cpp aborts the parent knows where.

The child never outlives its parent: on Linux it asks the kernel for SIGKILL when the parent
dies (PR_SET_PDEATHSIG), and everywhere a thread exits when its stdin (a pipe the parent holds
open and never writes) reaches end of file.
Tested by tests/runtimes/llama/test_runtime.py and tests/runtimes/llama/test_probe.py.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

MARK = "HEARTH-PROBE "
EXIT_ORPHAN = 71  # the parent went away: nobody wants the answer
# test hook: the child waits, after its death watches are set, while DIR/open does not exist
GATE_ENV = "HEARTH_PROBE_GATE"
PROMPT_TEXT = "Hello! Write one short sentence about the sea, with a number: 42.\nÉté, 東京 🌊"


def report(**item: Any) -> None:
    sys.stdout.write(MARK + json.dumps(item) + "\n")
    sys.stdout.flush()


def die_with_parent(ppid: int, *, pdeathsig: bool = True) -> None:
    """Exit when the parent dies, whichever way it dies (``pdeathsig`` False leaves only the
    portable pipe watch, which a test checks on its own)."""
    if pdeathsig and sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            pr_set_pdeathsig = 1
            libc.prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):
            pass  # the pipe below still ends us
    if os.getppid() != ppid:  # the parent died before the kernel was told to tell us
        os._exit(EXIT_ORPHAN)

    def watch() -> None:
        try:
            while os.read(0, 4096):
                pass
        except OSError:
            pass
        os._exit(EXIT_ORPHAN)

    threading.Thread(target=watch, name="hearth-probe-parent-watch", daemon=True).start()


def _gate() -> None:
    gate = os.environ.get(GATE_ENV)
    if not gate:
        return
    folder = Path(gate)
    (folder / f"{os.getpid()}.running").write_text(str(os.getppid()))
    while not (folder / "open").exists():
        time.sleep(0.02)


class _NativeErrors(logging.Handler):
    """Keeps llama.cpp's warnings and errors, to name what went wrong in a refusal."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        self.lines.append(msg)
        del self.lines[:-40]
        sys.stderr.write(msg + "\n")

    def reason(self) -> str:
        """The most telling line: llama.cpp's "error loading model: ...", or the GGUF parser's
        own complaint behind a generic one, or the last error."""
        for i in range(len(self.lines) - 1, -1, -1):
            line = self.lines[i]
            if "error loading model" not in line:
                continue
            what = line.split("error loading model", 1)[1].lstrip(" :").strip()
            if "failed to load model from" in what:  # the parser said why, earlier
                for earlier in self.lines[:i]:
                    if earlier.startswith("gguf_") and ": " in earlier:
                        return earlier.split(": ", 1)[1].strip()
            return what
        for line in reversed(self.lines):
            low = line.lower()
            if ("error" in low or "failed" in low) and "failed to load model" not in low:
                return line.strip()
        return ""


def _prompt(lm: Any) -> str:
    sp = lm.special_tokens
    return (
        f"{sp['bos']}<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n{PROMPT_TEXT}"
        f"<|im_end|>\n<|im_start|>assistant\n{sp['eos']}[INST] <s></s><|eot_id|><start_of_turn>"
    )


async def _first_request(lm: Any, tokens: list[int]) -> None:
    from app.core.types import GenerationRequest, SamplingParams

    sampled = GenerationRequest(
        prompt_tokens=tuple(tokens),
        max_tokens=4,
        sampling=SamplingParams(
            temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.1, seed=7
        ),
        logprobs=2,
    )
    greedy = GenerationRequest(prompt_tokens=tuple(tokens[-8:]), max_tokens=2)
    for req in (sampled, greedy):
        async for d in lm.submit(req):
            if d.error:
                raise RuntimeError(d.error)


def run(spec: dict[str, Any]) -> None:
    """Load and exercise ``spec['path']``; reports each stage and the result on stdout."""
    from app.core.types import LoadOptions, LocalModel
    from app.errors import HearthError
    from app.runtimes.llama.engine import LlamaEngine
    from app.runtimes.llama.runtime import LlamaCppModel

    native = _NativeErrors()
    logging.getLogger("llama_cpp.native").addHandler(native)
    logging.getLogger("llama_cpp.native").propagate = False
    model = LocalModel(
        id=str(spec.get("name") or "probe"),
        path=spec["path"],
        format="gguf",
        size_bytes=0,
        owned=False,
        extra={"embedding": bool(spec.get("embedding"))},
    )
    options = LoadOptions(**spec["options"])
    stage = "load"
    try:
        report(stage=stage)
        engine = LlamaEngine(model, options, extra_bufts=bool(spec["extra_bufts"]))
        stage = "vocab"
        report(stage=stage)
        lm = LlamaCppModel(model, engine, queue_size=4)
        try:
            stage = "tokenize"
            report(stage=stage)
            lm.tokenize(PROMPT_TEXT, add_special=False, parse_special=False)
            tokens = lm.tokenize(_prompt(lm), add_special=True, parse_special=True)
            if not tokens:
                tokens = lm.tokenize("Hello", add_special=True, parse_special=False)
            lm.detokenize(tokens)
            lm.token_pieces(sorted(set(tokens)))
            tokens = tokens[: max(1, engine.n_ctx // 2)]
            if engine.is_embedding:
                stage = "embed"
                report(stage=stage)
                asyncio.run(lm.embed([tokens]))
            else:
                stage = "generate"
                report(stage=stage)
                asyncio.run(_first_request(lm, tokens))
        finally:
            lm.close()
    except Exception as e:  # noqa: BLE001 - a failure of the file, told to the parent
        msg = e.message if isinstance(e, HearthError) else str(e) or type(e).__name__
        # a failed load says only "could not load": llama.cpp's log says why
        reason = (native.reason() or msg) if stage == "load" else msg
        report(result="refused", stage=stage, reason=reason)
        return
    report(result="ok", stage="done")


def main(argv: list[str]) -> int:
    spec = json.loads(argv[1])
    die_with_parent(int(spec["ppid"]), pdeathsig=bool(spec.get("pdeathsig", True)))
    _gate()
    try:
        run(spec)
    except BaseException:  # noqa: BLE001 - the check itself could not run: say so, not a verdict
        report(result="error", reason=traceback.format_exc()[-2000:])
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
