"""lm-evaluation-harness, the real CLI, against a real Hearth server: a multiple-choice task
scored through ``local-completions`` (echo + logprobs, the tokenizer read from the server, no
Hugging Face download) matches the log-likelihoods computed in process, and a generation task
runs through ``local-chat-completions``."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Served, serving

pytest.importorskip("lm_eval")
llama_cpp = pytest.importorskip("llama_cpp")

QUESTIONS = [
    {
        "question": "The capital of France is",
        "choices": [" Paris", " London", " a banana"],
        "answer": 0,
    },
    {
        "question": "Two plus two equals",
        "choices": [" four", " seven hundred", " blue"],
        "answer": 0,
    },
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path):  # type: ignore[no-untyped-def]
    with serving(tmp_path_factory.mktemp("lmeval"), smollm2_path) as s:
        yield s


def _task(folder: Path, name: str, body: str, rows: list[dict]) -> None:
    data = folder / f"{name}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / f"{name}.yaml").write_text(
        f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {data}\ntest_split: test\n{body}"
    )


def _run_lm_eval(tmp: Path, args: list[str]) -> list[dict]:
    """The lm_eval CLI, offline (a Hugging Face download would fail), its logged samples."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(tmp / "hf"))
    out = tmp / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "lm_eval",
            *args,
            "--include_path",
            str(tmp),
            "--output_path",
            str(out),
            "--log_samples",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    files = sorted(out.rglob("samples_*.jsonl"))
    assert files, proc.stderr[-3000:]
    return [json.loads(line) for line in files[0].read_text().splitlines() if line.strip()]


def _in_process(model_path: Path, context: str, continuation: str) -> tuple[float, int]:
    """The continuation's log-likelihood after the context, from llama-cpp-python's own logits,
    tokenized as lm-eval does (the whole text, then split at the context's length)."""
    llm = _llama(model_path)
    whole = llm.tokenize((context + continuation).encode(), add_bos=False, special=True)
    ctx = llm.tokenize(context.encode(), add_bos=False, special=True)
    cont = whole[len(ctx) :]
    llm.reset()
    llm.eval(whole)
    total = 0.0
    for i, tok in enumerate(cont):
        row = llm.scores[len(ctx) + i - 1]
        m = float(max(row))
        lse = m + math.log(sum(math.exp(float(x) - m) for x in row))
        total += float(row[tok]) - lse
    return total, len(cont)


_LLMS: dict[Path, object] = {}


def _llama(path: Path):  # type: ignore[no-untyped-def]
    if path not in _LLMS:
        _LLMS[path] = llama_cpp.Llama(
            model_path=str(path),
            logits_all=True,
            n_ctx=512,
            n_threads=1,
            verbose=False,
        )
    return _LLMS[path]


def test_multiple_choice_loglikelihoods_match_in_process(
    server: Served, smollm2_path: Path, tmp_path: Path
) -> None:
    _task(
        tmp_path,
        "hearth_mc",
        'output_type: multiple_choice\ndoc_to_text: "{{question}}"\n'
        'doc_to_choice: "{{choices}}"\ndoc_to_target: "{{answer}}"\n'
        "metric_list:\n  - metric: acc\n",
        QUESTIONS,
    )
    samples = _run_lm_eval(
        tmp_path,
        [
            "--model",
            "local-completions",
            "--model_args",
            f"base_url={server.root}/v1/completions,model={server.model_id},"
            "num_concurrent=1,max_retries=1",
            "--tasks",
            "hearth_mc",
        ],
    )
    assert len(samples) == len(QUESTIONS)
    for s in samples:
        pairs = [(a["arg_0"], a["arg_1"]) for a in s["arguments"].values()]
        for (context, continuation), resp in zip(pairs, s["resps"], strict=True):
            got = float(resp[0][0])
            want, n = _in_process(smollm2_path, context, continuation)
            assert got == pytest.approx(want, abs=1e-3 * n), (context, continuation)


def test_generation_through_chat_completions(server: Served, tmp_path: Path) -> None:
    _task(
        tmp_path,
        "hearth_gen",
        'output_type: generate_until\ndoc_to_text: "{{q}}"\ndoc_to_target: "{{a}}"\n'
        "generation_kwargs:\n  until: []\n  max_gen_toks: 8\n"
        "metric_list:\n  - metric: exact_match\n",
        [{"q": "Say hello.", "a": "hello"}, {"q": "Name a colour.", "a": "red"}],
    )
    samples = _run_lm_eval(
        tmp_path,
        [
            "--model",
            "local-chat-completions",
            "--model_args",
            f"base_url={server.root}/v1/chat/completions,model={server.model_id},"
            "num_concurrent=1,max_retries=1",
            "--apply_chat_template",
            "--tasks",
            "hearth_gen",
        ],
    )
    assert len(samples) == 2
    assert all(isinstance(s["resps"][0][0], str) and s["resps"][0][0].strip() for s in samples)
