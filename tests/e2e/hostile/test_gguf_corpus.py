"""No GGUF file takes Hearth down: a mutation corpus through import, load and a first request,
and header-only mutations of SmolLM2 served by ``hearth serve``.

Both run Hearth in a subprocess, so a native abort shows as a test failure naming the file,
not as a dead test run.
"""

from __future__ import annotations

import collections
import http.client
import json
import os
import signal
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from app.core.library.gguf import read_header
from tests.support.gguf_corpus import QUICK, corpus
from tests.support.gguf_rewrite import patch_copy, tensor_type_offset, token_offsets, value_offset

N_RANDOM = 80  # the bench (tests/bench/gguf_fuzz.py) runs thousands


def _leftover_children(marker: str) -> list[int]:
    """Probe children (of any parent) whose command line names ``marker``."""
    pids = []
    for p in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (p / "cmdline").read_bytes()
            state = (p / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if b"llama.probe_child" in cmd and marker.encode() in cmd and state not in "ZX":
            pids.append(int(p.name))
    return pids


@pytest.mark.timeout(900)
def test_every_mutated_file_is_refused_with_a_reason_or_works(tmp_path: Path) -> None:
    files = tmp_path / "files"
    files.mkdir()
    cases = corpus(seed=0, n_random=N_RANDOM, quick=True)
    for c in cases:
        (files / f"{c.name}.gguf").write_bytes(c.data)
    report = tmp_path / "report.jsonl"
    t0 = time.perf_counter()
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.support.gguf_corpus",
            str(files),
            str(tmp_path / "h"),
            str(report),
        ],
        capture_output=True,
        text=True,
        timeout=840,
    )
    secs = time.perf_counter() - t0
    rows = [json.loads(line) for line in report.read_text().splitlines()]
    started = [x["file"] for x in rows if x.get("at") == "start"]
    results = {x["file"]: x for x in rows if "outcome" in x}
    assert r.returncode == 0, (
        f"Hearth died (exit {r.returncode}) on {started[-1] if started else '?'}: "
        f"{r.stderr[-2000:]}"
    )
    assert set(results) == {f"{c.name}.gguf" for c in cases}
    bad = [x for x in results.values() if x["outcome"] not in ("works", "refused")]
    assert not bad, bad[:5]
    silent = [x for x in results.values() if x["outcome"] == "refused" and not x["message"]]
    assert not silent, silent[:5]
    counts = collections.Counter((x["outcome"], x["stage"]) for x in results.values())
    print(f"\ncorpus: {len(results)} files in {secs:.0f}s: {dict(counts)}")
    # each abort the tester reported is refused, saying what is wrong
    expect = {
        "base": None,
        "block_count-0": "block_count is 0",
        "block_count-513": "block_count is 513",
        "token-dup-10-11": "duplicates an earlier token",
        "attention.layer_norm_rms_epsilon--1.0": "norm epsilon",
        "attention.layer_norm_rms_epsilon-nan": "is nan",
        "tokenizer_model-none": "has no tokenizer",
        "type-output_norm.weight-1": "norm weights and biases in F32",
    }
    assert set(expect) <= QUICK
    for name, words in expect.items():
        res = results[f"{name}.gguf"]
        if words is None:
            assert res["outcome"] == "works", res
        else:
            assert res["outcome"] == "refused" and words in res["message"], res
    # every stage refuses something, and mutations that llama.cpp handles still answer
    assert counts[("refused", "import")] > 50 and counts[("refused", "load")] > 10
    assert counts[("works", "request")] > 20
    assert _leftover_children(str(files)) == []


# -- the real model: header-only mutations of SmolLM2, served ---------------------------------


def _post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=300) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")
    except (urllib.error.URLError, ConnectionError, http.client.HTTPException) as e:
        return 0, {"error": {"message": f"no answer (the server died?): {e!r}", "code": None}}


def _health(base: str) -> int:
    try:
        with urllib.request.urlopen(f"{base}/health", timeout=60) as resp:
            return resp.status
    except urllib.error.URLError:
        return 0


def _mutations(src: Path) -> list[tuple[str, list[tuple[int, bytes]], str]]:
    """(what, same-size edits to the header, what the refusal must say)."""
    tokens = token_offsets(src, 2000)
    a, b = next(
        (x, y) for x in tokens for y in tokens if x[0] < y[0] and len(x[1]) == len(y[1]) > 2
    )
    model_at = value_offset(src, "tokenizer.ggml.model") + 8  # after the string's length
    return [
        ("block_count 0", [(value_offset(src, "llama.block_count"), struct.pack("<I", 0))],
         "block_count is 0"),
        ("block_count 513", [(value_offset(src, "llama.block_count"), struct.pack("<I", 513))],
         "block_count is 513"),
        ("rms eps -1", [(value_offset(src, "llama.attention.layer_norm_rms_epsilon"),
                         struct.pack("<f", -1.0))], "norm epsilon"),
        ("rms eps NaN", [(value_offset(src, "llama.attention.layer_norm_rms_epsilon"),
                          struct.pack("<f", float("nan")))], "is nan"),
        ("tokenizer none", [(model_at, b"none")], "has no tokenizer"),
        ("duplicate token", [(b[0], a[1])], "duplicates an earlier token"),
        ("output_norm F16", [(tensor_type_offset(src, "output_norm.weight"), struct.pack("<I", 1))],
         "norm weights and biases in F32"),
    ]  # fmt: skip


@pytest.mark.model
@pytest.mark.timeout(600)
def test_hearth_serve_refuses_mutated_smollm2_and_keeps_serving(
    tmp_path: Path, smollm2_path: Path
) -> None:
    """Each file was imported while valid, then its header changed (as a file replaced on disk,
    or one indexed before this check existed): the request that would load it gets the reason,
    and the server and the good model carry on."""
    home = tmp_path / "h"
    env = {**os.environ, "HEARTH_HOME": str(home)}
    env.pop("HEARTH_API_KEY", None)
    good = tmp_path / "good.gguf"
    bad = tmp_path / "bad.gguf"
    patch_copy(smollm2_path, good, [])
    patch_copy(smollm2_path, bad, [])
    for p in (good, bad):
        r = subprocess.run(
            [sys.executable, "-m", "app", "import", str(p)], capture_output=True, text=True, env=env
        )
        assert r.returncode == 0, r.stderr
    (home / "config").mkdir(parents=True, exist_ok=True)
    (home / "config" / "settings.json").write_text(json.dumps({"load": {"context_length": 1024}}))
    original = bad.read_bytes()[: read_header(bad).data_offset]
    serve = subprocess.Popen(
        [sys.executable, "-m", "app", "serve", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        base = serve.stdout.readline().strip().removesuffix("/v1")  # type: ignore[union-attr]
        assert base.startswith("http://127.0.0.1:")
        for what, edits, words in _mutations(bad):
            with bad.open("r+b") as f:
                for at, raw in edits:
                    f.seek(at)
                    f.write(raw)
            status, body = _post(
                f"{base}/v1/chat/completions",
                {"model": "bad", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
            )
            assert status == 400 and words in body["error"]["message"], (what, status, body)
            assert body["error"]["code"] == "invalid_model"
            assert _health(base) == 200, f"the server died on {what}"
            with bad.open("r+b") as f:  # back to the original header
                f.write(original)
        status, body = _post(
            f"{base}/v1/chat/completions",
            {"model": "good", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
        )
        assert status == 200 and body["choices"][0]["message"]["content"] is not None, body
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.communicate(timeout=120)
    assert serve.returncode == 0
