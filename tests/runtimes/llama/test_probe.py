"""The probe child: a file that kills llama.cpp kills a child, never Hearth; verdicts are
remembered per file; children never outlive their parent.

Files are the tiny real llama model of tests/support/gguf_corpus.py. The crashing ones are values the
Python check refuses too (tests/core/library/test_gguf_check.py): here they go straight to ``Prober``,
which shows what llama.cpp really does with them. Children are counted and held with the child's
gate hook (``HEARTH_PROBE_GATE``): each writes ``PID.running`` into the folder, then waits until
``open`` exists there.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from app.core.library.gguf import read_header
from app.core.library.index import ModelLibrary
from app.core.service import assemble
from app.core.types import LoadOptions
from app.errors import ModelLoadFailed
from app.runtimes.llama import probe as llama_probe
from app.runtimes.llama.backend import build_info
from app.runtimes.llama.probe import Prober
from app.runtimes.llama.probe_child import GATE_ENV
from app.runtimes.llama.runtime import LlamaCppRuntime
from tests.support.gguf_corpus import ARR, BOOL, F32, STR, U32, serialize, tiny_llama

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def tiny(tmp_path: Path, name: str = "tiny", spec: object = None) -> Path:
    p = tmp_path / f"{name}.gguf"
    p.write_bytes(serialize(spec or tiny_llama())[0])  # type: ignore[arg-type]
    return p


def run_check(prober: Prober, path: Path, options: LoadOptions | None = None) -> bool:
    h = read_header(path)
    return prober.check(
        [str(path)],
        name=path.stem,
        data_offset=h.data_offset,
        weight_type=h.quantization or "unknown",
        build_info=build_info(),
        options=options or LoadOptions(),
        embedding=h.is_embedding_model,
    )


@pytest.fixture
def gate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Children register here; open unless a test removes ``open``."""
    folder = tmp_path / "gate"
    folder.mkdir()
    (folder / "open").touch()
    monkeypatch.setenv(GATE_ENV, str(folder))
    monkeypatch.delenv(llama_probe.ENV_OVERRIDE, raising=False)
    monkeypatch.delenv(llama_probe.ENV_TIMEOUT, raising=False)
    return folder


def children(gate: Path) -> list[int]:
    return sorted(int(p.name.split(".")[0]) for p in gate.glob("*.running"))


def wait_for_child(gate: Path, deadline_s: float = 120) -> int:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        pids = children(gate)
        if pids:
            return pids[0]
        time.sleep(0.05)
    raise AssertionError("no probe child started")


def gone(pid: int) -> bool:
    """The process has exited (a zombie nobody reaped yet counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def wait_gone(pid: int, deadline_s: float = 60) -> bool:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if gone(pid):
            return True
        time.sleep(0.05)
    return False


def verdicts(probe_file: Path) -> dict[str, dict]:
    return json.loads(probe_file.read_text()) if probe_file.exists() else {}


def _dup_token() -> object:
    s = tiny_llama()
    t = list(s.get("tokenizer.ggml.tokens")[1])
    t[11] = t[10]
    return s.set("tokenizer.ggml.tokens", ARR, (STR, t))


def _norm_f16() -> object:
    s = tiny_llama()
    t = s.tensor("output_norm.weight")
    t.ggml_type, t.data = 1, bytes(2 * t.shape[0])
    return s


CRASHES = [  # (what, file, what the child was doing, llama.cpp's words)
    ("block_count 0", lambda: tiny_llama().set("llama.block_count", U32, 0), "while loading it",
     "GGML_ASSERT(hparams.n_layer_all > 0"),
    ("duplicate token", _dup_token, "while loading it",
     "GGML_ASSERT(id_to_token.size() == token_to_id.size())"),
    ("tokenizer none", lambda: tiny_llama().set("tokenizer.ggml.model", STR, "none"),
     # the engine reads every token's piece when it loads (the longest bounds a prompt)
     "while loading it", "GGML_ASSERT(type != LLAMA_VOCAB_TYPE_NONE)"),
    ("rms eps NaN", lambda: tiny_llama().set(
        "llama.attention.layer_norm_rms_epsilon", F32, float("nan")), "on its first request",
     "GGML_ASSERT(eps >= 0.0f)"),
    ("output_norm F16", _norm_f16, "on its first request", "unsupported types"),
    ("BOS added, none", lambda: tiny_llama().set("tokenizer.ggml.pre", STR, "chatglm-bpe").drop(
        "tokenizer.ggml.bos_token_id").set("tokenizer.ggml.add_bos_token", BOOL, True),
     "while tokenizing a prompt", "token_bos() != LLAMA_TOKEN_NULL"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("make", "where", "words"), [c[1:] for c in CRASHES], ids=[c[0] for c in CRASHES]
)
def test_a_file_that_kills_llama_cpp_kills_only_the_child_and_stays_refused(
    tmp_path: Path,
    gate: Path,
    make: object,
    where: str,
    words: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the extra-buffer question settled: one child per file (see the next test for both); "0",
    # since with them on, some CPUs (AMX Xeons) crash on any file's first request
    monkeypatch.setenv(llama_probe.ENV_OVERRIDE, "0")
    path = tiny(tmp_path, "bad", make())  # type: ignore[operator]
    probe_file = tmp_path / "cache" / "runtime-probe.json"
    with pytest.raises(ModelLoadFailed) as e:
        run_check(Prober(probe_file), path)
    msg = e.value.message
    assert "llama.cpp crashed on 'bad'" in msg and where in msg and words in msg, msg
    assert len(children(gate)) == 1
    (entry,) = [v for k, v in verdicts(probe_file).items() if k.startswith("file:")]
    assert entry["ok"] is False and words in entry["reason"]
    # remembered, across processes (a new Prober reads the cache folder): no second child
    with pytest.raises(ModelLoadFailed, match="remembered from an earlier check"):
        run_check(Prober(probe_file), path)
    assert len(children(gate)) == 1
    # the file changes: a new question, a new child (the base model loads and answers)
    path.write_bytes(serialize(tiny_llama())[0])
    assert run_check(Prober(probe_file), path) in (True, False)
    assert len(children(gate)) == 2


def test_a_crash_in_compute_is_checked_without_extra_buffers_before_blaming_the_file(
    tmp_path: Path, gate: Path
) -> None:
    """With the CPU's extra-buffer question open, a crash while computing could be the CPU's
    (AMX repacking): a second child without them decides. Both die here: the file is refused,
    and the CPU is not marked unsafe."""
    s = tiny_llama().set("llama.attention.layer_norm_rms_epsilon", F32, -1.0)
    probe_file = tmp_path / "runtime-probe.json"
    with pytest.raises(ModelLoadFailed, match="on its first request"):
        run_check(Prober(probe_file), tiny(tmp_path, "bad", s))
    assert len(children(gate)) == 2
    (key,) = verdicts(probe_file)
    assert key.startswith("file:")
    # a crash outside compute (tokenizing) needs no second child
    with pytest.raises(ModelLoadFailed, match="while tokenizing"):
        run_check(Prober(probe_file), tiny(tmp_path, "nobos", tiny_llama().set(
            "tokenizer.ggml.pre", STR, "chatglm-bpe").drop("tokenizer.ggml.bos_token_id").set(
            "tokenizer.ggml.add_bos_token", BOOL, True)))  # fmt: skip
    assert len(children(gate)) == 3


def test_one_child_answers_both_questions_and_a_known_file_pays_a_lookup(
    tmp_path: Path, gate: Path
) -> None:
    path = tiny(tmp_path)
    probe_file = tmp_path / "runtime-probe.json"
    prober = Prober(probe_file)
    t0 = time.perf_counter()
    bufts = run_check(prober, path)
    first = time.perf_counter() - t0
    # one child where the extra buffer types work; where they crash (an AMX Xeon) a second
    # one, without them, clears the file
    n = len(children(gate))
    assert n == (1 if bufts else 2)
    record = verdicts(probe_file)
    files = [v for k, v in record.items() if k.startswith("file:")]
    amx = [v for k, v in record.items() if not k.startswith("file:")]
    assert len(files) == 1 and files[0]["ok"] is True and files[0]["extra_bufts"] is bufts
    # the same child answered the extra-buffer-type question for this CPU, build and weights
    assert len(amx) == 1 and amx[0]["extra_bufts_ok"] is bufts
    t0 = time.perf_counter()
    assert run_check(Prober(probe_file), path) is bufts
    known = time.perf_counter() - t0
    assert len(children(gate)) == n, "a known file runs no child"
    print(f"\nprobe: unknown tiny file {first:.3f}s, known {known * 1000:.1f}ms")
    # other options that change llama.cpp's code path are another question (the CPU's is
    # answered: one child)
    run_check(prober, path, LoadOptions(rope_freq_base=20000.0))
    assert len(children(gate)) == n + 1


def test_the_extra_buffer_override_still_checks_the_file(
    tmp_path: Path, gate: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(llama_probe.ENV_OVERRIDE, "0")
    probe_file = tmp_path / "runtime-probe.json"
    assert run_check(Prober(probe_file), tiny(tmp_path)) is False
    assert len(children(gate)) == 1
    (entry,) = verdicts(probe_file).values()  # the file's verdict only: the CPU's was forced
    assert entry["ok"] is True and entry["extra_bufts"] is False
    # "1" is taken as said: extra buffer types on. Where they crash (what an unforced check
    # finds here), the file's check then crashes and the file is refused
    monkeypatch.delenv(llama_probe.ENV_OVERRIDE)
    safe = run_check(Prober(tmp_path / "unforced.json"), tiny(tmp_path, "unforced"))
    monkeypatch.setenv(llama_probe.ENV_OVERRIDE, "1")
    if safe:
        assert run_check(Prober(probe_file), tiny(tmp_path)) is True
    else:
        with pytest.raises(ModelLoadFailed, match="on its first request"):
            run_check(Prober(probe_file), tiny(tmp_path))


def test_a_check_past_its_time_is_killed_and_not_remembered(
    tmp_path: Path, gate: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (gate / "open").unlink()  # the child waits at the gate: it cannot finish in time
    monkeypatch.setenv(llama_probe.ENV_TIMEOUT, "2")
    probe_file = tmp_path / "runtime-probe.json"
    with pytest.raises(ModelLoadFailed) as e:
        run_check(Prober(probe_file), tiny(tmp_path))
    assert "did not finish (no answer within 2s" in e.value.message
    assert llama_probe.ENV_TIMEOUT in e.value.message
    (pid,) = children(gate)
    assert gone(pid)
    assert not [k for k in verdicts(probe_file) if k.startswith("file:")]


def test_closing_abandons_a_running_check_and_kills_its_child(tmp_path: Path, gate: Path) -> None:
    (gate / "open").unlink()
    rt = LlamaCppRuntime(probe_file=tmp_path / "runtime-probe.json")
    errors: list[BaseException] = []

    def load() -> None:
        try:
            run_check(rt.prober, tiny(tmp_path))
        except BaseException as e:  # noqa: BLE001 - checked below
            errors.append(e)

    t = threading.Thread(target=load)
    t.start()
    pid = wait_for_child(gate)
    rt.close()
    t.join(60)
    assert not t.is_alive() and wait_gone(pid)
    assert isinstance(errors[0], ModelLoadFailed) and "abandoned" in errors[0].message
    assert verdicts(tmp_path / "runtime-probe.json") == {}


async def test_closing_hearth_ends_a_load_still_being_checked(tmp_path: Path, gate: Path) -> None:
    (gate / "open").unlink()
    lib = ModelLibrary(tmp_path / "library.json", tmp_path / "models")
    rt = LlamaCppRuntime(probe_file=tmp_path / "runtime-probe.json")
    h = assemble(lib, {"gguf": rt}, load_defaults=lambda: LoadOptions(context_length=256))
    model, _ = h.models.import_path(tiny(tmp_path))
    load = asyncio.ensure_future(h.models.load(model.id))
    pid = await asyncio.to_thread(wait_for_child, gate)
    await h.close()
    with pytest.raises(ModelLoadFailed, match="abandoned"):
        await load
    assert wait_gone(pid)


PARENT = """
import os, sys, json, subprocess, time
spec = json.loads(sys.argv[1])
spec["ppid"] = os.getpid()
subprocess.Popen([sys.executable, "-m", "app.runtimes.llama.probe_child", json.dumps(spec)],
                 stdin=subprocess.PIPE)
time.sleep(600)
"""


@pytest.mark.parametrize("pdeathsig", [True, False], ids=["pdeathsig", "pipe-only"])
def test_a_child_dies_with_its_killed_parent(tmp_path: Path, gate: Path, pdeathsig: bool) -> None:
    """kill -9 of the parent, with the child surely running (held at the gate): each watch alone
    (the kernel's parent-death signal, the pipe that reaches EOF) ends the child."""
    (gate / "open").unlink()
    spec = {
        "path": str(tiny(tmp_path)),
        "extra_bufts": False,
        "embedding": False,
        "options": {"context_length": 256},
        "pdeathsig": pdeathsig,
    }
    parent = subprocess.Popen([sys.executable, "-c", PARENT, json.dumps(spec)])
    try:
        pid = wait_for_child(gate)
        assert not gone(pid)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(30)
        assert wait_gone(pid), "the probe child outlived its parent"
    finally:
        parent.kill()
        parent.wait()


def test_killing_hearth_serve_mid_probe_leaves_no_child(tmp_path: Path, gate: Path) -> None:
    """The tester's case: ``hearth serve`` dies (kill -9) while a probe child loads a model."""
    (gate / "open").unlink()
    env = {**os.environ, "HEARTH_HOME": str(tmp_path / "home")}
    env.pop("HEARTH_API_KEY", None)
    serve = subprocess.Popen(
        [sys.executable, "-m", "app", "serve", "--port", "0", "--model", str(tiny(tmp_path))],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        pid = wait_for_child(gate)
        os.kill(serve.pid, signal.SIGKILL)
        serve.wait(30)
        assert wait_gone(pid), "the probe child outlived hearth serve"
    finally:
        serve.kill()
        serve.wait()
