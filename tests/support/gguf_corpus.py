"""A tiny real llama GGUF that llama.cpp loads and decodes, and a seeded corpus of mutations of it.

``tiny_llama()`` is a structured description (metadata and tensors) of a 2-layer model with a
byte-level BPE vocabulary of ~300 tokens (SmolLM2's tokenizer setup, ChatML specials); it
serializes to ~300 KB. ``corpus(seed, n_random)`` yields named mutations: deterministic ones of
the values llama.cpp asserts on (counts, norms, heads, vocab, tensor types, shapes) and seeded
random ones of the serialized bytes (header counts, string lengths, value types, tensor offsets
and types, bit flips, truncations).

``python -m tests.support.gguf_corpus DIR HOME REPORT`` runs every ``*.gguf`` in DIR through Hearth's
import, load and first request (one JSON line per file in REPORT, written before and after each
file, so a crash names the file that caused it). The suite's test and tests/bench/gguf_fuzz.py
drive it in a subprocess.
"""

from __future__ import annotations

import copy
import math
import random
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import gguf
import numpy as np

# GGUF value types (the spec's numbering)
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
_FMT = {
    U8: "<B",
    I8: "<b",
    U16: "<H",
    I16: "<h",
    U32: "<I",
    I32: "<i",
    F32: "<f",
    BOOL: "<?",
    U64: "<Q",
    I64: "<q",
    F64: "<d",
}
# ggml tensor types used here
T_F32, T_F16, T_Q4_0, T_Q8_0, T_Q4_K, T_Q6_K = 0, 1, 2, 8, 12, 14

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@dataclass
class TensorSpec:
    name: str
    shape: tuple[int, ...]  # ggml order: ne0 (the row) first
    ggml_type: int
    data: bytes


@dataclass
class Spec:
    """A GGUF file as data: metadata (key, value type, value) and tensors, in file order."""

    kvs: list[tuple[str, int, Any]]
    tensors: list[TensorSpec]
    alignment: int = 32

    def index(self, key: str) -> int:
        return next(i for i, (k, _, _) in enumerate(self.kvs) if k == key)

    def get(self, key: str) -> Any:
        return self.kvs[self.index(key)][2]

    def set(self, key: str, vtype: int, value: Any) -> Spec:
        try:
            self.kvs[self.index(key)] = (key, vtype, value)
        except StopIteration:
            self.kvs.append((key, vtype, value))
        return self

    def drop(self, key: str) -> Spec:
        self.kvs = [kv for kv in self.kvs if kv[0] != key]
        return self

    def tensor(self, name: str) -> TensorSpec:
        return next(t for t in self.tensors if t.name == name)

    def copy(self) -> Spec:
        return copy.deepcopy(self)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (byte-level BPE token texts)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs), strict=True))


_PAIRS = [
    ("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("e", "r"), ("a", "n"), ("o", "n"),
    ("Ġ", "a"), ("r", "e"), ("o", "u"), ("Ġ", "s"), ("Ġ", "w"), ("i", "s"), ("e", "n"),
    ("Ġ", "b"), ("Ġ", "c"), ("Ġ", "o"), ("a", "t"), ("e", "d"), ("n", "d"), ("Ġa", "nd"),
    ("Ġ", "f"), ("l", "l"), ("o", "r"), ("Ġ", "h"), ("Ġ", "m"), ("i", "t"), ("Ġ", "i"),
    ("a", "r"), ("Ġ", "p"), ("Ġ", "d"), ("e", "s"), ("Ġw", "or"), ("l", "d"), ("Ġwor", "ld"),
    ("H", "e"), ("He", "ll"), ("Hell", "o"), ("Ċ", "Ċ"), ("Ġ", "Ġ"),
]  # fmt: skip
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _vocab() -> tuple[list[str], list[int], list[str]]:
    tokens = list(SPECIALS)
    types = [3, 3, 3]  # control
    table = _bytes_to_unicode()
    tokens += [table[b] for b in range(256)]
    types += [1] * 256
    merges = []
    for a, b in _PAIRS:
        merges.append(f"{a} {b}")
        if a + b not in tokens:
            tokens.append(a + b)
            types.append(1)
    return tokens, types, merges


def _weights(rng: np.random.Generator, shape: tuple[int, ...], ggml_type: int) -> bytes:
    """Random weights of ``shape`` (ggml order) stored as ``ggml_type``."""
    arr = (rng.standard_normal(tuple(reversed(shape))) * 0.05).astype(np.float32)
    if ggml_type == T_F32:
        return arr.tobytes()
    if ggml_type == T_F16:
        return arr.astype(np.float16).tobytes()
    if ggml_type in (T_Q4_K, T_Q6_K):  # no quantizer in gguf-py: random blocks, small scales
        blk, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(ggml_type)]
        blocks = rng.integers(0, 256, (arr.size // blk, size), dtype=np.uint8)
        scale = np.frombuffer(np.float16(0.002).tobytes(), np.uint8)
        for at in (0, 2) if ggml_type == T_Q4_K else (size - 2,):
            blocks[:, at : at + 2] = scale
        return blocks.tobytes()
    q = gguf.quants.quantize(arr, gguf.GGMLQuantizationType(ggml_type))
    return bytes(q.tobytes())


N_EMBD, N_HEAD, N_HEAD_KV, N_FF, N_LAYER, N_CTX = 64, 4, 2, 256, 2, 256


def tiny_llama(seed: int = 0) -> Spec:
    """The base model: llama architecture, 2 layers, n_embd 64, 4 heads (2 KV), n_ff 256."""
    rng = np.random.default_rng(seed)
    tokens, types, merges = _vocab()
    n_vocab = len(tokens)
    head = N_EMBD // N_HEAD
    kvs: list[tuple[str, int, Any]] = [
        ("general.architecture", STR, "llama"),
        ("general.name", STR, "Tiny Corpus"),
        ("general.file_type", U32, 1),
        ("llama.context_length", U32, N_CTX),
        ("llama.embedding_length", U32, N_EMBD),
        ("llama.block_count", U32, N_LAYER),
        ("llama.feed_forward_length", U32, N_FF),
        ("llama.attention.head_count", U32, N_HEAD),
        ("llama.attention.head_count_kv", U32, N_HEAD_KV),
        ("llama.attention.layer_norm_rms_epsilon", F32, 1e-5),
        ("llama.rope.freq_base", F32, 10000.0),
        ("llama.rope.dimension_count", U32, head),
        ("llama.vocab_size", U32, n_vocab),
        ("tokenizer.ggml.model", STR, "gpt2"),
        ("tokenizer.ggml.pre", STR, "smollm"),
        ("tokenizer.ggml.tokens", ARR, (STR, tokens)),
        ("tokenizer.ggml.token_type", ARR, (I32, types)),
        ("tokenizer.ggml.merges", ARR, (STR, merges)),
        ("tokenizer.ggml.bos_token_id", U32, 1),
        ("tokenizer.ggml.eos_token_id", U32, 2),
        ("tokenizer.ggml.padding_token_id", U32, 0),
        ("tokenizer.ggml.add_bos_token", BOOL, False),
        ("tokenizer.chat_template", STR, CHATML),
        ("general.quantization_version", U32, 2),
    ]
    t: list[TensorSpec] = []

    def add(name: str, shape: tuple[int, ...], ggml_type: int) -> None:
        t.append(TensorSpec(name, shape, ggml_type, _weights(rng, shape, ggml_type)))

    add("token_embd.weight", (N_EMBD, n_vocab), T_Q8_0)
    for i in range(N_LAYER):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", (N_EMBD,), T_F32)
        add(p + "attn_q.weight", (N_EMBD, N_EMBD), T_F16)
        add(p + "attn_k.weight", (N_EMBD, head * N_HEAD_KV), T_F16)
        add(p + "attn_v.weight", (N_EMBD, head * N_HEAD_KV), T_Q8_0)
        add(p + "attn_output.weight", (N_EMBD, N_EMBD), T_Q4_0)
        add(p + "ffn_norm.weight", (N_EMBD,), T_F32)
        add(p + "ffn_gate.weight", (N_EMBD, N_FF), T_Q8_0)
        add(p + "ffn_up.weight", (N_EMBD, N_FF), T_F16)
        add(p + "ffn_down.weight", (N_FF, N_EMBD), T_Q4_K if i == 0 else T_Q6_K)
    add("output_norm.weight", (N_EMBD,), T_F32)
    for x in t:  # norms near 1, as trained models have them
        if x.name.endswith("norm.weight"):
            x.data = (
                np.ones(x.shape[0], np.float32)
                + rng.standard_normal(x.shape[0]).astype(np.float32) * 0.01
            ).tobytes()
    return Spec(kvs, t)


def spec_from_file(path: Any) -> Spec:
    """A real GGUF file as a Spec (for mutations of a real model; reads every tensor)."""
    r = gguf.GGUFReader(path)
    kvs: list[tuple[str, int, Any]] = []
    for name, f in r.fields.items():
        if name.startswith("GGUF."):
            continue
        vtype = int(f.types[0])
        kvs.append(
            (name, vtype, (int(f.types[1]), list(f.contents())) if vtype == ARR else f.contents())
        )
    tensors = [
        TensorSpec(t.name, tuple(int(d) for d in t.shape), int(t.tensor_type), t.data.tobytes())
        for t in r.tensors
    ]
    return Spec(kvs, tensors, alignment=r.alignment)


# -- serialization ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Slot:
    """A fixed-width field of the serialized file: where it is and what it holds."""

    offset: int
    width: int  # bytes
    kind: str  # count | strlen | vtype | etype | value | dims | dim | ttype | toffset
    label: str


def _pack(vtype: int, v: Any) -> bytes:
    if vtype == STR:
        b = v.encode() if isinstance(v, str) else bytes(v)
        return struct.pack("<Q", len(b)) + b
    return struct.pack(_FMT[vtype], v)


@dataclass
class _Out:
    buf: bytearray = field(default_factory=bytearray)
    slots: list[Slot] = field(default_factory=list)

    def put(self, raw: bytes, kind: str | None = None, label: str = "") -> None:
        if kind is not None:
            self.slots.append(Slot(len(self.buf), len(raw), kind, label))
        self.buf += raw

    def string(self, s: str | bytes, label: str) -> None:
        b = s.encode() if isinstance(s, str) else bytes(s)
        self.put(struct.pack("<Q", len(b)), "strlen", label)
        self.buf += b


def serialize(spec: Spec) -> tuple[bytes, list[Slot]]:
    """The file's bytes, and the fixed-width fields in it (for byte-level mutations)."""
    o = _Out()
    o.buf += b"GGUF"
    o.put(struct.pack("<I", 3), "value", "version")
    o.put(struct.pack("<Q", len(spec.tensors)), "count", "tensor count")
    o.put(struct.pack("<Q", len(spec.kvs)), "count", "metadata count")
    for key, vtype, v in spec.kvs:
        o.string(key, f"key {key}")
        o.put(struct.pack("<I", vtype), "vtype", key)
        if vtype == ARR:
            etype, items = v
            o.put(struct.pack("<I", etype), "etype", key)
            o.put(struct.pack("<Q", len(items)), "count", f"{key} length")
            for j, item in enumerate(items):
                if etype == STR:
                    # a few of a long array's strings are enough to aim at
                    o.string(item, f"{key}[{j}]") if j < 8 or j % 97 == 0 else o.put(
                        _pack(STR, item)
                    )
                else:
                    o.put(_pack(etype, item), "value" if j < 4 else None, f"{key}[{j}]")
        elif vtype == STR:
            o.string(v, key)
        else:
            o.put(_pack(vtype, v), "value", key)
    offsets = []
    pos = 0
    for t in spec.tensors:
        pos = (pos + spec.alignment - 1) // spec.alignment * spec.alignment
        offsets.append(pos)
        pos += len(t.data)
    for t, off in zip(spec.tensors, offsets, strict=True):
        o.string(t.name, f"tensor {t.name}")
        o.put(struct.pack("<I", len(t.shape)), "dims", t.name)
        for d in t.shape:
            o.put(struct.pack("<Q", d), "dim", t.name)
        o.put(struct.pack("<I", t.ggml_type), "ttype", t.name)
        o.put(struct.pack("<Q", off), "toffset", t.name)
    o.buf += b"\0" * (-len(o.buf) % spec.alignment)
    start = len(o.buf)
    for t, off in zip(spec.tensors, offsets, strict=True):
        o.buf += b"\0" * (start + off - len(o.buf))
        o.buf += t.data
    o.buf += b"\0" * (-len(o.buf) % spec.alignment)
    return bytes(o.buf), o.slots


# -- the corpus -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    name: str  # what was changed: a file name stem, [a-z0-9._-]
    data: bytes


def _name(*parts: object) -> str:
    raw = "-".join(str(p) for p in parts).lower()
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in raw)[:120]


def _retype(t: TensorSpec, ggml_type: int) -> None:
    """Change a tensor's type and re-encode its data the way a converter would."""
    blk, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(ggml_type)]
    n = math.prod(t.shape)
    if t.shape[0] % blk:
        t.ggml_type = ggml_type  # not representable: the header check must refuse it
        return
    try:
        arr = np.ones(tuple(reversed(t.shape)), np.float32)
        t.data = (
            _weights(np.random.default_rng(1), t.shape, ggml_type)
            if ggml_type in (T_F32, T_F16, T_Q4_0, T_Q8_0)
            else bytes(gguf.quants.quantize(arr, gguf.GGMLQuantizationType(ggml_type)).tobytes())
        )
    except (NotImplementedError, gguf.quants.QuantError, ValueError):
        t.data = bytes(n // blk * size)  # zeros of the right size (no quantizer for this type)
    t.ggml_type = ggml_type


def semantic_cases(base: Spec) -> Iterator[Case]:
    """Deterministic mutations of the values llama.cpp asserts or aborts on."""

    def case(name: str, spec: Spec) -> Case:
        return Case(name, serialize(spec)[0])

    yield case("base", base)
    arch = "llama"
    u32_values = [0, 1, 3, 7, 512, 513, 4096, 0xFFFFFFFF]
    for key in (
        "block_count",
        "embedding_length",
        "feed_forward_length",
        "attention.head_count",
        "attention.head_count_kv",
        "context_length",
        "rope.dimension_count",
        "vocab_size",
    ):
        for v in u32_values:
            yield case(_name(key, v), base.copy().set(f"{arch}.{key}", U32, v))
    for key in ("attention.key_length", "attention.value_length", "expert_count",
                "expert_used_count", "nextn_predict_layers", "expert_group_count"):  # fmt: skip
        for v in (0, 8, 32, 513):
            yield case(_name(key, v), base.copy().set(f"{arch}.{key}", U32, v))
    for key in ("attention.layer_norm_rms_epsilon", "rope.freq_base", "rope.scaling.factor",
                "attention.layer_norm_epsilon", "rope.scaling.attn_factor"):  # fmt: skip
        for v in (-1.0, 0.0, float("nan"), float("inf"), -float("inf"), 1e30, 1e-45):
            yield case(_name(key, v), base.copy().set(f"{arch}.{key}", F32, v))
    # a value of the wrong type, or missing
    for key in ("block_count", "embedding_length", "attention.head_count", "context_length"):
        yield case(_name(key, "as-i32"), base.copy().set(f"{arch}.{key}", I32, 2))
        yield case(_name(key, "as-f32"), base.copy().set(f"{arch}.{key}", F32, 2.0))
        yield case(_name(key, "as-str"), base.copy().set(f"{arch}.{key}", STR, "2"))
        yield case(_name(key, "missing"), base.copy().drop(f"{arch}.{key}"))
    yield case("eps-missing", base.copy().drop(f"{arch}.attention.layer_norm_rms_epsilon"))
    yield case("eps-as-f64", base.copy().set(f"{arch}.attention.layer_norm_rms_epsilon", F64, 1e-5))
    # per-layer arrays
    yield case(
        "head_count-array", base.copy().set(f"{arch}.attention.head_count", ARR, (U32, [4, 4]))
    )
    yield case(
        "head_count-array-short", base.copy().set(f"{arch}.attention.head_count", ARR, (U32, [4]))
    )
    yield case(
        "head_count-array-zero", base.copy().set(f"{arch}.attention.head_count", ARR, (U32, [4, 0]))
    )
    yield case(
        "head_count_kv-array-3",
        base.copy().set(f"{arch}.attention.head_count_kv", ARR, (U32, [2, 3])),
    )
    yield case(
        "ff-array-mixed", base.copy().set(f"{arch}.feed_forward_length", ARR, (U32, [256, 128]))
    )
    yield case(
        "rope_scaling-type-bogus", base.copy().set(f"{arch}.rope.scaling.type", STR, "bogus")
    )
    yield case("rope_scaling-type-yarn", base.copy().set(f"{arch}.rope.scaling.type", STR, "yarn"))
    yield case(
        "rope_scaling-type-longrope", base.copy().set(f"{arch}.rope.scaling.type", STR, "longrope")
    )
    yield case("pooling_type-7", base.copy().set(f"{arch}.pooling_type", U32, 7))
    yield case("pooling_type-1", base.copy().set(f"{arch}.pooling_type", U32, 1))
    yield case("causal-false", base.copy().set(f"{arch}.attention.causal", BOOL, False))
    # architecture
    for a in (
        "",
        "none",
        "bert",
        "gpt2",
        "qwen2",
        "mamba",
        "rwkv6",
        "t5",
        "clip",
        "llama4",
        "gemma3",
        "phi3",
        "bogus",
    ):
        yield case(_name("arch", a or "empty"), base.copy().set("general.architecture", STR, a))
    yield case("arch-missing", base.copy().drop("general.architecture"))
    yield case("alignment-64", base.copy().set("general.alignment", U32, 64))
    yield case("file_type-999", base.copy().set("general.file_type", U32, 999))
    # tokenizer
    for m in ("none", "no_vocab", "llama", "bert", "t5", "rwkv", "plamo2", "gemma4", "test",
              "whitespace", "hybriddna", "bogus", ""):  # fmt: skip
        yield case(
            _name("tokenizer_model", m or "empty"), base.copy().set("tokenizer.ggml.model", STR, m)
        )
    yield case("tokenizer_model-missing", base.copy().drop("tokenizer.ggml.model"))
    for p in ("default", "llama3", "qwen2", "bogus", ""):
        yield case(
            _name("tokenizer_pre", p or "empty"), base.copy().set("tokenizer.ggml.pre", STR, p)
        )
    tokens = list(base.get("tokenizer.ggml.tokens")[1])
    types = list(base.get("tokenizer.ggml.token_type")[1])
    for i, j in ((10, 11), (3, 200), (0, 1), (1, 2), (5, len(tokens) - 1)):
        t = tokens[:]
        t[j] = t[i]
        yield case(
            _name("token-dup", i, j), base.copy().set("tokenizer.ggml.tokens", ARR, (STR, t))
        )
    t = tokens[:]
    t[7] = ""
    yield case("token-empty", base.copy().set("tokenizer.ggml.tokens", ARR, (STR, t)))
    t = tokens[:]
    t[7], t[8] = "", "[EMPTY_7]"
    yield case("token-empty-collides", base.copy().set("tokenizer.ggml.tokens", ARR, (STR, t)))
    yield case("tokens-missing", base.copy().drop("tokenizer.ggml.tokens"))
    yield case("tokens-empty", base.copy().set("tokenizer.ggml.tokens", ARR, (STR, [])))
    yield case("tokens-one", base.copy().set("tokenizer.ggml.tokens", ARR, (STR, tokens[:1])))
    yield case("tokens-short", base.copy().set("tokenizer.ggml.tokens", ARR, (STR, tokens[:-5])))
    yield case(
        "tokens-long",
        base.copy().set("tokenizer.ggml.tokens", ARR, (STR, tokens + ["extra1", "extra2"])),
    )
    yield case(
        "tokens-as-u32",
        base.copy().set("tokenizer.ggml.tokens", ARR, (U32, list(range(len(tokens))))),
    )
    yield case(
        "token_type-short", base.copy().set("tokenizer.ggml.token_type", ARR, (I32, types[:-3]))
    )
    yield case("token_type-as-u32", base.copy().set("tokenizer.ggml.token_type", ARR, (U32, types)))
    for tt in (0, 2, 4, 5, 6, 99, -1):
        yield case(
            _name("token_type-all", tt),
            base.copy().set("tokenizer.ggml.token_type", ARR, (I32, [tt] * len(types))),
        )
        t2 = types[:]
        t2[3:259] = [tt] * 256
        yield case(
            _name("token_type-bytes", tt),
            base.copy().set("tokenizer.ggml.token_type", ARR, (I32, t2)),
        )
    yield case("token_type-missing", base.copy().drop("tokenizer.ggml.token_type"))
    yield case(
        "scores-short",
        base.copy().set("tokenizer.ggml.scores", ARR, (F32, [0.0] * (len(tokens) - 1))),
    )
    yield case(
        "scores-nan",
        base.copy().set("tokenizer.ggml.scores", ARR, (F32, [float("nan")] * len(tokens))),
    )
    yield case(
        "scores-as-str", base.copy().set("tokenizer.ggml.scores", ARR, (STR, ["0"] * len(tokens)))
    )
    merges = list(base.get("tokenizer.ggml.merges")[1])
    yield case("merges-missing", base.copy().drop("tokenizer.ggml.merges"))
    yield case("merges-empty", base.copy().set("tokenizer.ggml.merges", ARR, (STR, [])))
    yield case(
        "merges-no-space",
        base.copy().set("tokenizer.ggml.merges", ARR, (STR, [m.replace(" ", "") for m in merges])),
    )
    yield case(
        "merges-leading-space",
        base.copy().set("tokenizer.ggml.merges", ARR, (STR, [" " + m for m in merges])),
    )
    yield case(
        "merges-unknown",
        base.copy().set("tokenizer.ggml.merges", ARR, (STR, ["zz qq", "q z"] + merges)),
    )
    yield case("merges-as-u32", base.copy().set("tokenizer.ggml.merges", ARR, (U32, [1, 2])))
    n = len(tokens)
    for key in ("bos_token_id", "eos_token_id", "unknown_token_id", "seperator_token_id",
                "padding_token_id", "eot_token_id", "eom_token_id", "mask_token_id",
                "fim_pre_token_id"):  # fmt: skip
        for v in (n, n + 1000, 0xFFFFFFFF, 0):
            yield case(_name(key, v), base.copy().set(f"tokenizer.ggml.{key}", U32, v))
        yield case(_name(key, "as-i32-neg"), base.copy().set(f"tokenizer.ggml.{key}", I32, -1))
    for flag in ("add_bos_token", "add_eos_token", "add_sep_token", "add_space_prefix"):
        yield case(_name(flag, "true"), base.copy().set(f"tokenizer.ggml.{flag}", BOOL, True))
    yield case(
        "add_bos-no-bos",
        base.copy()
        .set("tokenizer.ggml.add_bos_token", BOOL, True)
        .set("tokenizer.ggml.bos_token_id", U32, n + 5),
    )
    yield case(
        "add_eos-no-eos",
        base.copy()
        .set("tokenizer.ggml.add_eos_token", BOOL, True)
        .set("tokenizer.ggml.eos_token_id", U32, n + 5),
    )
    yield case(
        "spm-add-bos-none",
        base.copy()
        .set("tokenizer.ggml.model", STR, "llama")
        .set("tokenizer.ggml.add_bos_token", BOOL, True)
        .set("tokenizer.ggml.bos_token_id", U32, n + 5),
    )
    yield case(
        "bert-vocab-bytes",
        base.copy()
        .set("tokenizer.ggml.model", STR, "bert")
        .set("tokenizer.ggml.token_type", ARR, (I32, [6] * n)),
    )
    yield case(
        "suppress-tokens",
        base.copy().set("tokenizer.ggml.suppress_tokens", ARR, (I32, [-5, 3, n + 9])),
    )
    yield case(
        "chat_template-huge-loop",
        base.copy().set("tokenizer.chat_template", STR, "{% for i in range(10**9) %}x{% endfor %}"),
    )
    yield case("chat_template-bad", base.copy().set("tokenizer.chat_template", STR, "{% for %}"))
    # tensors: types, shapes, presence
    for tname in ("output_norm.weight", "blk.0.attn_norm.weight", "blk.1.ffn_norm.weight"):
        for tt in (T_F16, T_Q8_0, T_Q4_0, 30, 24, 26, 28):  # 30 BF16, 24 I8, 26 I32, 28 F64
            s = base.copy()
            _retype(s.tensor(tname), tt)
            yield case(_name("type", tname, tt), s)
    for tname in ("token_embd.weight", "blk.0.attn_q.weight", "blk.0.attn_k.weight",
                  "blk.1.ffn_down.weight", "blk.0.ffn_gate.weight"):  # fmt: skip
        for tt in (T_F32, T_F16, T_Q4_0, T_Q8_0, T_Q4_K, T_Q6_K, 30, 24, 26, 27, 28, 20, 39, 34):
            s = base.copy()
            _retype(s.tensor(tname), tt)
            yield case(_name("type", tname, tt), s)
    for tname in (
        "output_norm.weight",
        "blk.0.attn_q.weight",
        "token_embd.weight",
        "blk.1.ffn_up.weight",
    ):
        s = base.copy()
        s.tensors = [t for t in s.tensors if t.name != tname]
        yield case(_name("missing", tname), s)
        s = base.copy()
        t = s.tensor(tname)
        t.shape = tuple(reversed(t.shape)) if len(t.shape) > 1 else (t.shape[0] * 2,)
        if len(t.shape) == 1:
            t.data = t.data * 2
        yield case(_name("shape", tname), s)
    s = base.copy()
    s.tensors.append(TensorSpec("blk.9.attn_norm.weight", (N_EMBD,), T_F32, bytes(4 * N_EMBD)))
    yield case("tensor-extra-layer", s)
    s = base.copy()
    s.tensors.append(TensorSpec("output.weight", (N_EMBD, n), T_F16, bytes(2 * N_EMBD * n)))
    yield case("tensor-output-untied", s)
    s = base.copy()
    s.tensors.append(
        TensorSpec("output.weight", (N_EMBD, n + 1), T_F16, bytes(2 * N_EMBD * (n + 1)))
    )
    yield case("tensor-output-wrong", s)
    s = base.copy()
    nan = np.full(N_EMBD, np.nan, np.float32).tobytes()
    s.tensor("output_norm.weight").data = nan
    yield case("weights-nan-norm", s)
    s = base.copy()
    s.tensor("token_embd.weight").data = bytes(len(s.tensor("token_embd.weight").data))
    yield case("weights-zero-embd", s)
    s = base.copy()
    s.tensors[0], s.tensors[1] = s.tensors[1], s.tensors[0]
    yield case("tensor-order", s)


def byte_cases(base: Spec, rng: random.Random, n: int) -> Iterator[Case]:
    """``n`` seeded mutations of the serialized bytes."""
    data, slots = serialize(base)
    header_end = max(s.offset + s.width for s in slots)
    specials = {
        "count": [0, 1, 2, 1 << 20, (1 << 64) - 1, 1 << 63],
        "strlen": [0, 1, 1 << 32, (1 << 64) - 1, 1 << 30],
        "vtype": list(range(14)) + [255, 0xFFFFFFFF],
        "etype": list(range(14)) + [0xFFFFFFFF],
        "dims": [0, 1, 2, 3, 4, 5, 0xFFFFFFFF],
        "dim": [0, 1, 2, 31, 32, 64, 256, 1 << 31, 1 << 62],
        "ttype": list(range(42)) + [0xFFFFFFFF],
        "toffset": [0, 32, 1 << 20, (1 << 64) - 32],
        "value": [0, 1, 2, 0xFF, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF, 0x7FC00000, 0xBF800000],
    }
    kinds = ["flip", "flip", "flip", "truncate", "slot", "slot", "slot", "slot", "slot", "bytes"]
    for i in range(n):
        kind = rng.choice(kinds)
        buf = bytearray(data)
        if kind == "flip":  # one to eight bit flips in the header
            k = rng.randint(1, 8)
            where = []
            for _ in range(k):
                at = rng.randrange(4, header_end)
                buf[at] ^= 1 << rng.randrange(8)
                where.append(at)
            name = _name("flip", i, *where[:3])
        elif kind == "truncate":
            cut = rng.choice([rng.randrange(1, header_end), rng.randrange(header_end, len(data))])
            buf = buf[:cut]
            name = _name("truncate", i, cut)
        elif kind == "bytes":  # a run of random bytes somewhere in the header
            at = rng.randrange(24, header_end - 8)
            width = rng.randint(1, 16)
            buf[at : at + width] = bytes(rng.randrange(256) for _ in range(width))
            name = _name("bytes", i, at, width)
        else:
            s = rng.choice(slots)
            choices = specials.get(s.kind, [0]) + ["+1", "-1", "rand"]
            v = rng.choice(choices)
            old = int.from_bytes(buf[s.offset : s.offset + s.width], "little")
            mask = (1 << (8 * s.width)) - 1
            if v == "+1":
                new = (old + 1) & mask
            elif v == "-1":
                new = (old - 1) & mask
            elif v == "rand":
                new = rng.getrandbits(8 * s.width)
            else:
                new = int(v) & mask
            buf[s.offset : s.offset + s.width] = new.to_bytes(s.width, "little")
            name = _name("slot", i, s.kind, s.label, v)
        yield Case(name, bytes(buf))


# the semantic cases the suite runs (the bench runs all): each crash the tester reported, one
# of each kind of refusal, and a few that load and answer
QUICK = frozenset(
    """
    base block_count-0 block_count-513 block_count-1 block_count-as-str embedding_length-0
    feed_forward_length-4294967295 attention.head_count-3 attention.head_count_kv-0
    attention.head_count_kv-7 context_length-0 context_length-4294967295 rope.dimension_count-7
    vocab_size-0 attention.key_length-8 expert_count-8 expert_used_count-8
    nextn_predict_layers-8 expert_group_count-8 attention.layer_norm_rms_epsilon--1.0
    attention.layer_norm_rms_epsilon-nan attention.layer_norm_rms_epsilon-inf
    rope.freq_base-nan attention.head_count-missing head_count-array-short head_count_kv-array-3
    rope_scaling-type-bogus pooling_type-7 arch-bogus arch-bert tokenizer_model-none
    tokenizer_model-llama tokenizer_model-bert tokenizer_model-t5 tokenizer_model-rwkv
    tokenizer_model-bogus tokenizer_pre-bogus token-dup-10-11 token-dup-0-1 token-empty-collides
    tokens-short token_type-bytes-6 token_type-all-99 scores-short merges-no-space
    bos_token_id-1299 add_bos-no-bos spm-add-bos-none bert-vocab-bytes
    type-output_norm.weight-1 type-blk.0.attn_norm.weight-8 type-token_embd.weight-26
    type-blk.0.attn_q.weight-28 type-blk.0.attn_q.weight-12 type-blk.1.ffn_down.weight-8
    missing-output_norm.weight shape-token_embd.weight tensor-extra-layer tensor-output-untied
    weights-nan-norm
    """.split()
)


def corpus(seed: int = 0, n_random: int = 200, *, quick: bool = False) -> list[Case]:
    """The semantic cases (``QUICK`` ones only when ``quick``), then ``n_random`` seeded
    byte-level ones. Names are unique."""
    base = tiny_llama()
    semantic = [c for c in semantic_cases(base) if not quick or c.name in QUICK]
    out = semantic + list(byte_cases(base, random.Random(seed), n_random))
    seen: set[str] = set()
    for c in out:
        if c.name in seen:
            raise ValueError(f"duplicate case name {c.name}")
        seen.add(c.name)
    if quick and len(semantic) != len(QUICK):
        raise ValueError(f"QUICK names no case: {sorted(QUICK - {c.name for c in semantic})}")
    return out


# -- the driver (runs in a subprocess: a crash must not take the test process down) -----------


async def _try_file(h: Any, path: Any) -> dict[str, Any]:
    from app.core.requests import ChatRequest, EmbeddingRequest
    from app.core.types import ChatMessage, SamplingParams
    from app.errors import HearthError

    stage = "import"
    try:
        model, _ = h.models.import_path(path)
        stage = "load"
        lm = await h.models.load(model.id)
        stage = "request"
        if "embeddings" in lm.capabilities:
            emb = await h.embed(EmbeddingRequest(model.id, ("Hello world",)))
            answer = f"{len(emb.vectors[0])} dims"
        else:
            choices = await h.chat(
                ChatRequest(
                    model.id,
                    (ChatMessage("user", "Hello! Say something."),),
                    sampling=SamplingParams(temperature=0.7, top_k=20, seed=1),
                    max_tokens=4,
                )
            )
            gen = choices.first
            _c = await gen.collect()
            _text, final = _c.text, _c.final
            if final.error:
                raise RuntimeError(final.error)
            answer = f"{final.usage.completion_tokens if final.usage else 0} tokens"
        await h.models.unload(model.id)
        return {"outcome": "works", "stage": stage, "answer": answer}
    except HearthError as e:
        return {
            "outcome": "refused",
            "stage": stage,
            "error": type(e).__name__,
            "message": e.message,
        }
    except Exception as e:  # noqa: BLE001 - reported: the test fails on it
        return {"outcome": "error", "stage": stage, "error": type(e).__name__, "message": str(e)}


async def _run_all(folder: Any, home: Any, report: Any) -> None:
    import json
    import time
    from pathlib import Path

    from app.core.library.index import ModelLibrary
    from app.core.service import assemble
    from app.core.types import LoadOptions
    from app.runtimes.llama.runtime import LlamaCppRuntime

    home = Path(home)
    lib = ModelLibrary(home / "library.json", home / "models")
    rt = LlamaCppRuntime(probe_file=home / "cache" / "runtime-probe.json")
    h = assemble(
        lib,
        {"gguf": rt},
        load_defaults=lambda: LoadOptions(context_length=256, threads=1),
        budget_bytes=lambda: 1 << 40,
    )
    with Path(report).open("a") as out:
        for path in sorted(Path(folder).glob("*.gguf")):
            out.write(json.dumps({"file": path.name, "at": "start"}) + "\n")
            out.flush()
            t0 = time.perf_counter()
            res = await _try_file(h, path)
            res.update(file=path.name, seconds=round(time.perf_counter() - t0, 3))
            out.write(json.dumps(res) + "\n")
            out.flush()
    await h.close()


if __name__ == "__main__":
    import asyncio
    import logging
    import sys

    logging.basicConfig(level=logging.ERROR)
    asyncio.run(_run_all(sys.argv[1], sys.argv[2], sys.argv[3]))
