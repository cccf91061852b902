"""llama.cpp's grammar code on the real SmolLM2 vocabulary: the measure at its edge agrees with
its parser, the threads that compile grammars have the stack the depth bound is chosen for, and
converting and compiling run on a compile thread: never on the model's worker (its streams
would stall) nor on the event loop."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.core.types import LoadOptions, LocalModel
from app.errors import InvalidRequest
from app.runtimes.grammar.gbnf import MAX_GRAMMAR_DEPTH, GrammarError, measure
from tests.support import probes

pytestmark = pytest.mark.model
L = pytest.importorskip("llama_cpp")


@pytest.fixture(scope="module")
def vocab(smollm2_path: Path) -> Iterator[object]:
    from app.runtimes.llama.backend import ensure_backend

    ensure_backend()
    mp = L.llama_model_default_params()
    mp.vocab_only = True
    model = L.llama_model_load_from_file(str(smollm2_path).encode(), mp)
    assert model
    yield L.llama_model_get_vocab(model)
    L.llama_model_free(model)


def llama_accepts(vocab: object, grammar: str) -> bool:
    smp = L.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
    if smp:
        L.llama_sampler_free(smp)
    return bool(smp)


# small grammars (nothing deep: llama.cpp parses them safely in this process)
GRAMMARS = [
    "root ::= [a\\-]",
    'root ::= "\\-"',
    "root ::= [\\d]",
    'root ::= "\\/"',
    'root ::= "\\d"',
    "root ::= [a-z\\]\\-]",
    'root ::= "a"{2} "b"{1,} "c"{0,3}',
    'root ::= ""',
    'root ::= x\nx ::= "a"\nx ::= "b"',
    'root ::= "a" # c\n',
    'root ::= (\n "a"\n | "b"\n)',
    'root ::=\n  "a"',
    'root ::= "a"\n\n\nfoo ::= "b"',
    'root ::= "a" |\n "b"',
    'root ::= "a"\n | "b"',
    'root ::= "\\u00e9" "\\x41" "\\U0001F600"',
    "root ::= [^\\n]",
    'root ::= a_b\na_b ::= "x"',
    'root ::= "a"{ 2 , 3 }',
    'root ::= "a"**',
    'root ::= "a"?+',
    'root ::= !"a"',
    "root ::= . [^] []",
    'root ::= root "a" | "b"',
    "root ::= other",
    'root ::= ("a"',
    'root ::= "a")',
    'root ::= "abc',
]


def test_the_measure_reads_grammars_as_llama_cpp_does(vocab: object) -> None:
    """Where llama.cpp refuses a grammar, so does the measure (and llama.cpp never prints it);
    where it takes one, so does the measure."""
    from llama_cpp.llama_grammar import JSON_GBNF

    disagree = []
    for g in [*GRAMMARS, str(JSON_GBNF)]:
        try:
            measure(g)
            ours = True
        except GrammarError:
            ours = False
        if ours != llama_accepts(vocab, g):
            disagree.append(g)
    assert disagree == []


def test_the_converter_output_for_real_schemas_compiles(vocab: object) -> None:
    from app.core.inference.tools import Tool, tool_call_constraint
    from app.runtimes.llama.grammar import grammar_for
    from tests.core.inference.test_constraints import AGENT_TOOLS

    tools = [Tool(f"tool_{i}", "", s) for i, s in enumerate(AGENT_TOOLS)]
    for constraint in [
        tool_call_constraint(tools, parallel=True),
        tool_call_constraint(tools[6:], parallel=False),  # one tool, with $defs and $ref
        *(("json_schema", json.dumps(s)) for s in AGENT_TOOLS),
    ]:
        grammar = grammar_for(constraint)
        assert grammar is not None and llama_accepts(vocab, grammar), constraint


PROBE = textwrap.dedent(
    """
    import sys, threading
    import llama_cpp as L
    from app.runtimes.worker import start_thread
    quiet = L.llama_log_callback(lambda *a: None)  # kept: llama.cpp holds the pointer
    L.llama_log_set(quiet, None)
    L.llama_backend_init()
    mp = L.llama_model_default_params(); mp.vocab_only = True
    vocab = L.llama_model_get_vocab(L.llama_model_load_from_file(sys.argv[1].encode(), mp))
    depth = int(sys.argv[3])
    grammar = ("root ::= " + '("a" ' * depth + ")?" * depth).encode()
    def compile():
        smp = L.llama_sampler_init_grammar(vocab, grammar, b"root")
        if smp:
            L.llama_sampler_free(smp)
    if sys.argv[2] == "worker":
        t = start_thread(compile, name="probe")
    else:
        threading.stack_size(512 * 1024)  # macOS's default for native threads
        t = threading.Thread(target=compile)
        t.start()
    t.join()
    print("survived")
    """
)


def test_worker_threads_hold_twenty_times_the_depth_bound(smollm2_path: Path) -> None:
    depth = 20 * MAX_GRAMMAR_DEPTH  # 30,000 nested groups: llama.cpp's parser recurses each
    run = [sys.executable, "-c", PROBE, str(smollm2_path)]
    worker = subprocess.run(
        [*run, "worker", str(depth)], capture_output=True, text=True, timeout=300
    )
    assert worker.returncode == 0 and "survived" in worker.stdout, worker.returncode
    # the same grammar on a 512 KiB thread stack: the overflow the known stack size prevents
    small = subprocess.run([*run, "small", str(depth)], capture_output=True, text=True, timeout=300)
    assert small.returncode != 0 and "survived" not in small.stdout


def largest_accepted_schema() -> dict[str, object]:
    """256 optional properties at the root: the most one object may have, and close to the
    conversion cost bound (app/core/inference/constraints.py)."""
    from app.core.inference.constraints import MAX_OPTIONAL_PROPERTIES, check_schema

    schema = {
        "type": "object",
        "properties": {f"field_{i}": {"type": "string"} for i in range(MAX_OPTIONAL_PROPERTIES)},
    }
    check_schema(schema, param="response_format")  # accepted by the request bounds
    return schema


async def test_constraints_convert_off_the_worker_thread_and_the_event_loop(
    tmp_path: Path, smollm2_path: Path
) -> None:
    import threading

    from app.core.types import Constraint, GenerationRequest, SamplingParams
    from app.runtimes.grammar.compile_pool import COMPILE_POOL
    from app.runtimes.llama.runtime import LlamaCppRuntime

    model = LocalModel(
        id="smollm2", path=str(smollm2_path), format="gguf", size_bytes=0, owned=False
    )
    rt = LlamaCppRuntime(probe_file=probes.shared())
    lm = await asyncio.to_thread(rt.load, model, LoadOptions(context_length=512))
    try:
        # the worker is busy until the test opens the gate: the largest accepted schema
        # converts and compiles all the same, so none of it ran on the worker
        gate = threading.Event()
        held = lm.worker.run(lambda _cancelled: gate.wait())
        big = Constraint("json_schema", json.dumps(largest_accepted_schema()))
        check = asyncio.ensure_future(lm.check_constraint(big))
        try:
            await asyncio.wait_for(asyncio.shield(check), 120)
        finally:
            gate.set()
        await asyncio.wait_for(held, 60)

        # and the other way round: with every compile thread held, a stream runs to its end
        pool_gate = threading.Event()
        holds = [
            asyncio.ensure_future(COMPILE_POOL.run(lambda _stop: pool_gate.wait()))
            for _ in range(COMPILE_POOL.max_threads)
        ]
        other = Constraint(
            "json_schema", json.dumps({"type": "array", "items": {"type": "integer"}})
        )
        pending = asyncio.ensure_future(lm.check_constraint(other))
        tokens = lm.tokenize("Count to twenty:", add_special=True, parse_special=True)
        stream = lm.submit(
            GenerationRequest(
                prompt_tokens=tuple(tokens), max_tokens=8, sampling=SamplingParams(temperature=0)
            )
        )
        pieces = [d async for d in stream]
        assert sum(1 for d in pieces if d.text) >= 1 and not pending.done()
        pool_gate.set()
        await asyncio.wait_for(asyncio.gather(*holds), 60)
        await asyncio.wait_for(pending, 120)

        bad = ("json_schema", json.dumps({"type": "string", "pattern": r"^\d+$"}))
        with pytest.raises(InvalidRequest) as ei:
            await asyncio.wait_for(lm.check_constraint(bad), 120)
        assert ei.value.param == "response_format" and "unknown escape" in ei.value.message
    finally:
        await asyncio.to_thread(lm.close)
