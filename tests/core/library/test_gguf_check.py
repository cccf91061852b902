"""What llama.cpp would abort on is refused in Python, with a reason, before llama.cpp sees it.

Each case is a value that aborted a real llama.cpp process (tests/support/gguf_corpus.py and the bench
found them; the test of the probe shows the abort itself). Files are the tiny real llama model
of tests/support/gguf_corpus.py with one value changed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from app.core.library.gguf import read_header
from app.core.library.gguf_check import check_for_llama_cpp
from app.core.library.index import ModelLibrary
from app.errors import InvalidModel
from tests.support.gguf_corpus import ARR, BOOL, F32, I32, STR, U32, Spec, serialize, tiny_llama


def write(tmp_path: Path, spec: Spec, name: str = "m.gguf") -> Path:
    p = tmp_path / name
    p.write_bytes(serialize(spec)[0])
    return p


def check(p: Path) -> None:
    check_for_llama_cpp(read_header(p), p)


def _tokens(s: Spec) -> list[str]:
    return list(s.get("tokenizer.ggml.tokens")[1])


def _dup(s: Spec) -> Spec:
    t = _tokens(s)
    t[11] = t[10]
    return s.set("tokenizer.ggml.tokens", ARR, (STR, t))


def _empty_collides(s: Spec) -> Spec:
    t = _tokens(s)
    t[7], t[8] = "", "[EMPTY_7]"  # llama.cpp renames an empty token 7 to "[EMPTY_7]"
    return s.set("tokenizer.ggml.tokens", ARR, (STR, t))


def _retype(name: str, ggml_type: int, width: int) -> Callable[[Spec], Spec]:
    def f(s: Spec) -> Spec:
        t = s.tensor(name)
        t.ggml_type = ggml_type
        t.data = bytes(t.shape[0] * width)
        return s

    return f


REFUSED: list[tuple[str, Callable[[Spec], Spec], str]] = [
    ("block_count 0", lambda s: s.set("llama.block_count", U32, 0), "block_count is 0"),
    ("block_count 513", lambda s: s.set("llama.block_count", U32, 513), "1 to 512 layers"),
    ("nextn > layers", lambda s: s.set("llama.nextn_predict_layers", U32, 3), "nextn_predict"),
    ("experts, none used", lambda s: s.set("llama.expert_count", U32, 8), "expert_used_count is 0"),
    (
        "used > experts",
        lambda s: s.set("llama.expert_used_count", U32, 2),
        "more than expert_count",
    ),
    ("groups, no experts", lambda s: s.set("llama.expert_group_count", U32, 2), "without experts"),
    (
        "eps -1",
        lambda s: s.set("llama.attention.layer_norm_rms_epsilon", F32, -1.0),
        "norm epsilon must be 0 or more",
    ),
    (
        "eps NaN",
        lambda s: s.set("llama.attention.layer_norm_rms_epsilon", F32, float("nan")),
        "is nan",
    ),
    (
        "kv heads do not divide (per layer)",
        lambda s: s.set("llama.attention.head_count_kv", ARR, (U32, [2, 3])),
        "layer 1 has 4 attention heads for 3 KV heads",
    ),
    (
        "key != value head size",
        lambda s: s.set("llama.attention.key_length", U32, 8),
        "equal key, value and rope head sizes",
    ),
    ("rope scaling", lambda s: s.set("llama.rope.scaling.type", STR, "bogus"), "rope.scaling.type"),
    ("pooling", lambda s: s.set("llama.pooling_type", U32, 7), "pooling_type 7"),
    ("no tokenizer", lambda s: s.set("tokenizer.ggml.model", STR, "none"), "has no tokenizer"),
    ("no_vocab", lambda s: s.set("tokenizer.ggml.model", STR, "no_vocab"), "has no tokenizer"),
    ("duplicate token", _dup, "token 11 duplicates an earlier token"),
    ("empty token renamed onto another", _empty_collides, "token 8 duplicates"),
    (
        "SPM without byte tokens",
        lambda s: s.set("tokenizer.ggml.model", STR, "llama"),
        "no token for byte 0x00",
    ),
    ("RWKV without bytes", lambda s: s.set("tokenizer.ggml.model", STR, "rwkv"), "RWKV"),
    (
        "WordPiece byte tokens",
        lambda s: s.set("tokenizer.ggml.model", STR, "bert").set(
            "tokenizer.ggml.token_type", ARR, (I32, [6] * len(_tokens(s)))
        ),
        "WordPiece",
    ),
    (
        "BOS added but absent",  # this pre-tokenizer has no BOS unless the file names one
        lambda s: (
            s.set("tokenizer.ggml.pre", STR, "chatglm-bpe")
            .drop("tokenizer.ggml.bos_token_id")
            .set("tokenizer.ggml.add_bos_token", BOOL, True)
        ),
        "adds BOS",
    ),
    ("output_norm F16", _retype("output_norm.weight", 1, 2), "norm weights and biases in F32"),
    (
        "attn_norm BF16",
        _retype("blk.0.attn_norm.weight", 30, 2),
        "'blk.0.attn_norm.weight' is BF16",
    ),
    ("I32 weights", _retype("blk.0.attn_norm.weight", 26, 4), "integer or f64"),
]


@pytest.mark.parametrize(
    ("mutate", "reason"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED]
)
def test_what_llama_cpp_aborts_on_is_refused_with_the_reason(
    tmp_path: Path, mutate: Callable[[Spec], Spec], reason: str
) -> None:
    p = write(tmp_path, mutate(tiny_llama()))
    read_header(p)  # the bounds-checked header reader alone accepts every one of these
    with pytest.raises(InvalidModel) as e:
        check(p)
    assert reason in e.value.message and p.name in e.value.message


ACCEPTED: list[tuple[str, Callable[[Spec], Spec]]] = [
    ("the base model", lambda s: s),
    ("eps 0 and inf (ggml asserts eps >= 0 only)", lambda s: s.set(
        "llama.attention.layer_norm_rms_epsilon", F32, float("inf"))),
    ("a block count of the wrong type (llama.cpp refuses it cleanly)",
     lambda s: s.set("llama.block_count", STR, "2")),
    ("experts used as configured", lambda s: s.set("llama.expert_count", U32, 4).set(
        "llama.expert_used_count", U32, 2)),
    ("per-layer heads that divide", lambda s: s.set(
        "llama.attention.head_count_kv", ARR, (U32, [2, 1]))),
    ("an empty token (renamed, unique)", lambda s: s.set(
        "tokenizer.ggml.tokens", ARR, (STR, ["", *_tokens(s)[1:]]))),
    ("add_bos with a BOS token", lambda s: s.set("tokenizer.ggml.add_bos_token", BOOL, True)),
    ("known rope scaling", lambda s: s.set("llama.rope.scaling.type", STR, "yarn")),
]  # fmt: skip


@pytest.mark.parametrize("mutate", [a[1] for a in ACCEPTED], ids=[a[0] for a in ACCEPTED])
def test_files_llama_cpp_handles_pass(tmp_path: Path, mutate: Callable[[Spec], Spec]) -> None:
    check(write(tmp_path, mutate(tiny_llama())))


def test_real_models_pass_and_the_vocabulary_pass_is_cheap(
    smollm2_path: Path, embedding_gguf: Path
) -> None:
    check(embedding_gguf)
    header = read_header(smollm2_path)
    assert header.array_offsets["tokenizer.ggml.tokens"][0] == STR
    t0 = time.perf_counter()
    check_for_llama_cpp(header, smollm2_path)  # streams 49,152 tokens
    secs = time.perf_counter() - t0
    assert secs < 5.0, f"checking SmolLM2's header took {secs:.2f}s"


def test_import_refuses_what_would_abort(tmp_path: Path) -> None:
    lib = ModelLibrary(tmp_path / "library.json", tmp_path / "models")
    bad = write(tmp_path, tiny_llama().set("llama.block_count", U32, 0), "bad.gguf")
    with pytest.raises(InvalidModel, match="block_count is 0"):
        lib.import_path(bad)
    assert lib.list() == []
    good, _ = lib.import_path(write(tmp_path, tiny_llama(), "good.gguf"))
    assert good.architecture == "llama"
    # a bad file dropped into the models folder is skipped, not listed
    (tmp_path / "models").mkdir()
    write(tmp_path / "models", _dup(tiny_llama()), "dup.gguf")
    assert [m.id for m in lib.list()] == [good.id]
