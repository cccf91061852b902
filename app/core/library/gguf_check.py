"""What llama.cpp would abort on, checked in Python before it ever sees the file.

llama.cpp turns most malformed values into a clean load error, but some reach a GGML_ASSERT,
GGML_ABORT or an uncaught C++ exception, and those end the whole process. The checks here follow
the llama.cpp that llama-cpp-python 0.3.36 vendors (the source line is named at each check);
each raises InvalidModel saying what is wrong. Values of the wrong type or missing keys are left
alone: llama.cpp refuses those cleanly. What these checks cannot see (each architecture's graph,
each kernel) a child process finds out first (``app.runtimes.llama.probe``).

The token list is read in one streaming pass over the file (raw bytes, no decoding): duplicates
abort llama.cpp's vocabulary load, and an SPM vocabulary without byte tokens aborts on the first
character it cannot spell.
"""

from __future__ import annotations

import array
import math
import mmap
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from app.core.library.gguf import GGML_TYPES, GGUFHeader
from app.errors import InvalidModel

LLAMA_MAX_LAYERS = 512  # llama-hparams.h
LLAMA_MAX_EXPERTS = 1024
ROPE_SCALING_TYPES = frozenset({"none", "linear", "yarn", "longrope"})  # llama-model.cpp:1034
POOLING_TYPES = range(0, 5)  # none, mean, cls, last, rank (llama.h)
# llama-vocab.cpp:1948: a model without a tokenizer, and every tokenize call asserts
NO_VOCAB = frozenset({"none", "no_vocab"})
# ggml has no CPU kernels that multiply or look up integer or f64 weights (abort or SIGSEGV)
NON_FLOAT_TYPES = frozenset({24, 25, 26, 27, 28})  # I8 I16 I32 I64 F64
# architectures whose graph asserts head size k == v == n_rot (src/models/*.cpp)
SAME_HEAD_DIMS = frozenset(
    "apertus arcee arctic baichuan chameleon codeshell cogvlm cohere2moe dbrx deci deepseek "
    "dots1 dream ernie4_5 ernie4_5-moe exaone falcon granite granite_swa graniteswitch grok "
    "grovemoe hunyuan-moe hunyuan_vl hy_v3 internlm2 jais2 llada llada-moe llama llama4 "
    "maincoder mellum minimax-01 minimax-m2 mistral3 nemotron olmo olmo2 olmoe orion paddleocr "
    "plamo pockettts qwen2 qwen2moe qwen2vl qwen3 qwen3moe qwen3vl qwen3vlmoe rnd1 seed_oss "
    "smallthinker smollm3 starcoder2 xverse".split()
)
# BPE pre-tokenizers that turn add_bos on or the BOS token off (llama-vocab.cpp:2170-2340)
BPE_ADD_BOS = frozenset(
    "llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano tekken "
    "chameleon gemma4".split()
)
BPE_NO_BOS = frozenset({"chatglm-bpe", "glm4", "glm5"})
MAX_TOKEN_BYTES = 1 << 20  # the header reader bounds strings; a token this long is absurd

_U32, _I32, _F32, _BOOL, _STR, _ARR = 4, 5, 6, 7, 8, 9
# every byte a valid UTF-8 text can contain (requests are UTF-8: 0xC0, 0xC1, 0xF5+ never occur)
_TEXT_BYTES = [*range(0x00, 0xC0), *range(0xC2, 0xF5)]


def check_for_llama_cpp(header: GGUFHeader, path: str | Path) -> None:
    """Refuse what would make llama.cpp abort the process on load or on the first request.

    Raises:
        InvalidModel: a value llama.cpp asserts on, with what is wrong.
    """
    name = Path(path).name
    arch = header.architecture
    if arch is None:
        raise InvalidModel(f"{name} has no general.architecture: not a model llama.cpp can load")
    v = _Values(header, path)
    n_layer = v.u32(f"{arch}.block_count")
    if n_layer is not None and not 1 <= n_layer <= LLAMA_MAX_LAYERS:
        # llama-model.cpp:1328
        raise InvalidModel(
            f"{name}: {arch}.block_count is {n_layer}; llama.cpp needs 1 to {LLAMA_MAX_LAYERS} "
            "layers (it aborts on any other count)"
        )
    if n_layer is not None:
        _check_layers(v, name, arch, n_layer)
    _check_floats(header, name, arch)
    rope = v.string(f"{arch}.rope.scaling.type")
    if rope is not None and rope not in ROPE_SCALING_TYPES:  # llama-model.cpp:1420
        raise InvalidModel(
            f"{name}: unknown {arch}.rope.scaling.type {rope!r} (llama.cpp knows "
            f"{', '.join(sorted(ROPE_SCALING_TYPES))})"
        )
    pooling = v.u32(f"{arch}.pooling_type")
    if pooling is not None and pooling not in POOLING_TYPES:  # llama-graph.cpp: GGML_ABORT
        raise InvalidModel(f"{name}: unknown {arch}.pooling_type {pooling}")
    _check_tensors(header, name)
    _check_vocab(v, name)


class _Values:
    """Metadata read the way llama.cpp reads it: a value counts only with the type it expects."""

    def __init__(self, header: GGUFHeader, path: str | Path) -> None:
        self.h = header
        self.path = Path(path)

    def typed(self, key: str, vtype: int) -> Any:
        return self.h.metadata.get(key) if self.h.value_types.get(key) == vtype else None

    def u32(self, key: str) -> int | None:
        val = self.typed(key, _U32)
        return val if isinstance(val, int) else None

    def string(self, key: str) -> str | None:
        val = self.typed(key, _STR)
        return val if isinstance(val, str) else None

    def flag(self, key: str) -> bool | None:
        val = self.typed(key, _BOOL)
        return val if isinstance(val, bool) else None

    def per_layer(self, key: str, n_layer: int) -> list[int] | None:
        """A u32 scalar repeated per layer, or an array of one integer per layer
        (llama-model-loader.cpp get_key_or_arr); None when llama.cpp would refuse it cleanly."""
        if self.h.value_types.get(key) == _U32:
            val = self.h.metadata.get(key)
            return [int(val)] * n_layer if isinstance(val, int) else None
        at = self.h.array_offsets.get(key)
        if self.h.value_types.get(key) != _ARR or at is None:
            return None
        etype, offset = at
        if etype not in (_U32, _I32, _BOOL) or self.h.array_lengths.get(key) != n_layer:
            return None
        fmt = {_U32: "I", _I32: "i", _BOOL: "b"}[etype]
        width = struct.calcsize(fmt)
        with self.path.open("rb") as f:
            f.seek(offset)
            raw = f.read(width * n_layer)
        if len(raw) != width * n_layer:
            return None
        vals = list(struct.unpack(f"<{n_layer}{fmt}", raw))
        return [int(x != 0) for x in vals] if etype == _BOOL else [x & 0xFFFFFFFF for x in vals]


def _check_layers(v: _Values, name: str, arch: str, n_layer: int) -> None:
    nextn = v.u32(f"{arch}.nextn_predict_layers") or 0
    if nextn > n_layer:  # llama-model.cpp:1330
        raise InvalidModel(
            f"{name}: {arch}.nextn_predict_layers ({nextn}) exceeds block_count ({n_layer})"
        )
    if arch == "wavtokenizer-dec":  # llama-model.cpp:1354
        for part in ("posnet", "convnext"):
            n = v.u32(f"{arch}.{part}.block_count") or 0
            if n > n_layer:
                raise InvalidModel(f"{name}: {arch}.{part}.block_count ({n}) exceeds {n_layer}")
    # experts, llama-model.cpp:1361-1374
    n_expert = v.u32(f"{arch}.expert_count") or 0
    used = v.per_layer(f"{arch}.expert_used_count", n_layer) or [0]
    if arch in ("hunyuan_vl", "hunyuan-dense") and n_expert <= 1:
        n_expert, used = 0, [0]
    used_max = max(used)
    groups = v.u32(f"{arch}.expert_group_count") or 0
    group_used = v.u32(f"{arch}.expert_group_used_count") or 0
    problem = None
    if n_expert > LLAMA_MAX_EXPERTS:
        problem = f"expert_count {n_expert} is over llama.cpp's {LLAMA_MAX_EXPERTS}"
    elif used_max > n_expert:
        problem = f"expert_used_count {used_max} is more than expert_count {n_expert}"
    elif n_expert > 0:
        if used_max == 0:
            problem = f"expert_count is {n_expert} but expert_used_count is 0"
        elif groups >= n_expert:
            problem = f"expert_group_count {groups} is not below expert_count {n_expert}"
        elif groups > 1 and (n_expert % groups or not 0 < group_used < groups):
            problem = (
                f"{groups} expert groups do not divide {n_expert} experts, or "
                f"expert_group_used_count {group_used} is not between 1 and {groups - 1}"
            )
    elif groups:
        problem = f"expert_group_count is {groups} in a model without experts"
    if problem:
        raise InvalidModel(f"{name}: {arch}.{problem} (llama.cpp aborts on it)")
    # attention heads: the query heads of a layer are shared out among its KV heads
    heads = v.per_layer(f"{arch}.attention.head_count", n_layer)
    kv_heads = v.per_layer(f"{arch}.attention.head_count_kv", n_layer) or heads
    if heads is None or kv_heads is None:
        return
    for il, (nh, nkv) in enumerate(zip(heads, kv_heads, strict=False)):
        if nh > 0 and nkv > 0 and nh % nkv:
            raise InvalidModel(
                f"{name}: layer {il} has {nh} attention heads for {nkv} KV heads "
                "(not a whole number per KV head; llama.cpp's attention asserts on it)"
            )
    n_embd = v.u32(f"{arch}.embedding_length")
    if arch in SAME_HEAD_DIMS and heads[0] > 0 and n_embd:
        k = v.u32(f"{arch}.attention.key_length") or n_embd // heads[0]
        val = v.u32(f"{arch}.attention.value_length") or n_embd // heads[0]
        rot = v.u32(f"{arch}.rope.dimension_count") or k
        if not k == val == rot:
            raise InvalidModel(
                f"{name}: {arch} needs equal key, value and rope head sizes, this file has "
                f"{k}, {val} and {rot} (llama.cpp's {arch} graph asserts on it)"
            )


def _check_floats(header: GGUFHeader, name: str, arch: str) -> None:
    """Norm epsilons: ggml's norm kernels assert eps >= 0 (ggml-cpu/ops.cpp:4132); NaN fails it."""
    for key, val in header.metadata.items():
        if not (key.startswith(f"{arch}.") and key.endswith("epsilon")):
            continue
        if header.value_types.get(key) == _F32 and isinstance(val, float):
            if math.isnan(val) or val < 0:
                raise InvalidModel(
                    f"{name}: {key} is {val}; a norm epsilon must be 0 or more (llama.cpp "
                    "aborts on the first request)"
                )


def _check_tensors(header: GGUFHeader, name: str) -> None:
    for t in header.tensors:
        tname = GGML_TYPES[t.ggml_type][0]
        if t.ggml_type in NON_FLOAT_TYPES:
            raise InvalidModel(
                f"{name}: tensor {t.name!r} is {tname}; llama.cpp has no kernels for "
                "integer or f64 weights (it crashes on the first request)"
            )
        # norm weights and biases are added or multiplied into f32 activations: ggml's CPU
        # binary ops take only f32 there (ggml-cpu/binary-ops.cpp:135 aborts)
        if t.ggml_type != 0 and (t.name.endswith(("norm.weight", "norm.bias", ".bias"))):
            raise InvalidModel(
                f"{name}: tensor {t.name!r} is {tname}; llama.cpp needs norm weights and "
                "biases in F32 (it aborts on the first request)"
            )


def _check_vocab(v: _Values, name: str) -> None:
    model = v.string("tokenizer.ggml.model")
    if model is None:
        return  # llama.cpp: "key not found" / wrong type, a clean refusal
    if model in NO_VOCAB:
        raise InvalidModel(
            f"{name} has no tokenizer (tokenizer.ggml.model {model!r}): Hearth cannot turn text "
            "into tokens for it, and llama.cpp aborts when asked to"
        )
    at = v.h.array_offsets.get("tokenizer.ggml.tokens")
    if v.h.value_types.get("tokenizer.ggml.tokens") != _ARR or at is None or at[0] != _STR:
        return  # llama.cpp refuses cleanly
    n_tokens = v.h.array_lengths.get("tokenizer.ggml.tokens", 0)
    seen: set[bytes] = set()
    add = seen.add
    for i, text in enumerate(_strings(v.path, at[1], n_tokens)):
        if not text:  # llama-vocab.cpp:2521: an empty token is renamed
            text = f"[EMPTY_{i}]".encode()
        if text in seen:  # llama-vocab.cpp:2544
            raise InvalidModel(
                f"{name}: token {i} duplicates an earlier token "
                f"({text[:40].decode('utf-8', 'replace')!r}); llama.cpp aborts on a vocabulary "
                "with duplicate tokens"
            )
        add(text)
    types = _ints(v, "tokenizer.ggml.token_type", n_tokens)
    if model == "bert" and types is not None and 6 in types:  # llama-vocab.cpp:3207
        raise InvalidModel(
            f"{name}: a WordPiece (bert) vocabulary with byte tokens; llama.cpp aborts on it"
        )
    if model == "llama":  # SPM spells unknown characters as bytes: llama-vocab.cpp:4014
        missing = [
            b for b in _TEXT_BYTES if f"<0x{b:02X}>".encode() not in seen and bytes([b]) not in seen
        ]
        if missing:
            raise InvalidModel(
                f"{name}: its SentencePiece vocabulary has no token for byte 0x{missing[0]:02X} "
                f"(and {len(missing) - 1} more); llama.cpp aborts on text that needs them"
            )
    if model == "rwkv":
        byte_tokens = {t for t in (_unescape_rwkv(x) for x in seen) if len(t) == 1}
        missing = [b for b in _TEXT_BYTES if bytes([b]) not in byte_tokens]
        if missing:
            raise InvalidModel(
                f"{name}: its RWKV vocabulary has no token for byte 0x{missing[0]:02X}; "
                "llama.cpp fails on text that needs it"
            )
    _check_special(v, name, model, n_tokens)


def _check_special(v: _Values, name: str, model: str, n_tokens: int) -> None:
    """Hearth tokenizes with add_special: llama.cpp asserts the BOS/EOS/SEP it adds exist
    (llama-vocab.cpp:3443-3579). Defaults per tokenizer (llama-vocab.cpp:1970-2145)."""
    pre = v.string("tokenizer.ggml.pre") or ""
    defaults = {  # model: (bos, eos, sep, add_bos, add_eos)
        "llama": (1, 2, None, True, False),
        "bert": (101, None, 102, True, False),
        "gpt2": (11, 11, None, pre in BPE_ADD_BOS, False),
        "t5": (None, 1, None, False, True),
    }
    if model not in defaults:
        return
    bos, eos, sep, add_bos, add_eos = defaults[model]
    if model == "gpt2" and pre in BPE_NO_BOS:
        bos = None

    def resolve(default: int | None, key: str) -> int | None:
        tok = default if default is not None and default < n_tokens else None
        new = v.u32(f"tokenizer.ggml.{key}")
        return new if new is not None and new < n_tokens else tok

    bos = resolve(bos, "bos_token_id")
    eos = resolve(eos, "eos_token_id")
    sep = resolve(sep, "seperator_token_id")
    flag_bos, flag_eos = (
        v.flag("tokenizer.ggml.add_bos_token"),
        v.flag("tokenizer.ggml.add_eos_token"),
    )
    add_bos = add_bos if flag_bos is None else flag_bos
    add_eos = add_eos if flag_eos is None else flag_eos
    if pre == "gemma4":
        add_bos = True
    need = []
    if (add_bos or model == "bert") and bos is None:
        need.append("BOS")
    if add_eos and model != "bert" and eos is None:
        need.append("EOS")
    if model == "bert" and sep is None:
        need.append("SEP")
    if need:
        raise InvalidModel(
            f"{name}: the tokenizer adds {' and '.join(need)} tokens that are not in its "
            f"vocabulary of {n_tokens}; llama.cpp aborts on the first prompt"
        )


def token_texts(path: Path, h: GGUFHeader) -> Iterator[bytes]:
    """The raw texts of the vocabulary's tokens, in order (none when it has no string array)."""
    at = h.array_offsets.get("tokenizer.ggml.tokens")
    if h.value_types.get("tokenizer.ggml.tokens") != _ARR or at is None or at[0] != _STR:
        return iter(())
    return _strings(path, at[1], h.array_lengths.get("tokenizer.ggml.tokens", 0))


def _strings(path: Path, offset: int, count: int) -> Iterator[bytes]:
    """The raw strings of a GGUF string array (its bounds were checked by the header reader)."""
    unpack = struct.Struct("<Q").unpack_from
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        pos, end = offset, len(mm)
        for _ in range(count):
            if pos + 8 > end:
                return
            (n,) = unpack(mm, pos)
            pos += 8
            if n > MAX_TOKEN_BYTES or pos + n > end:
                return
            yield mm[pos : pos + n]
            pos += n


def _ints(v: _Values, key: str, count: int) -> array.array[int] | None:
    at = v.h.array_offsets.get(key)
    if at is None or at[0] != _I32 or v.h.array_lengths.get(key, 0) < count:
        return None
    out = array.array("i")
    with v.path.open("rb") as f:
        f.seek(at[1])
        out.frombytes(f.read(4 * count))
    return out


def _unescape_rwkv(text: bytes) -> bytes:
    """llama-vocab.cpp llama_unescape_rwkv_token: \\t \\n \\r \\xHH, and \\c for c."""
    out = bytearray()
    i = 0
    while i < len(text):
        c = text[i]
        if c == 0x5C and i + 1 < len(text):  # backslash
            e = text[i + 1]
            i += 2
            if e == ord("x") and i + 2 <= len(text):
                try:
                    out.append(int(text[i : i + 2], 16))
                except ValueError:
                    out.append(0)
                i += 2
            else:
                out.append({ord("t"): 9, ord("n"): 10, ord("r"): 13}.get(e, e))
            continue
        out.append(c)
        i += 1
    return bytes(out)
