"""Memory estimates from model metadata: weights + KV cache (context, KV type) + compute + overhead.

Everything is derived from the GGUF header (local file or a remote header read with an HTTP Range
request), never guessed from the file size alone. ``verdict`` compares an estimate with the
machine's free memory (RAM, and VRAM from a device probe that tests can replace).
Tested by tests/core/library/test_formats.py and tests/core/hub/test_client.py.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from app.core.library.gguf import GGUFHeader
from app.core.util.fsutil import read_json

KV_BYTES = {
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "q8_0": 34 / 32,
    "q5_1": 24 / 32,
    "q5_0": 22 / 32,
    "q4_1": 20 / 32,
    "q4_0": 18 / 32,
}
LLAMA_OVERHEAD = 12 * 1024 * 1024  # context structs, graph metadata, thread pools
# the most prompt tokens one decode reads on the CPU (app/runtimes/llama/admission.py): there
# llama.cpp's compute buffer is touched only as far as such a decode reaches, so a text model
# served on the CPU is estimated with it (prompt scoring, which reads whole batches, goes
# beyond: its output rows are not in the estimate either)
CPU_PROMPT_PIECE = 32
MLX_OVERHEAD = 21 * 1024 * 1024  # MLX's allocator and kernel caches on first use
RUNTIME_OVERHEAD = LLAMA_OVERHEAD
# the most host memory one model's idle conversation caches take (a shared "reuse" cache moves
# them there, up to its own size: app/runtimes/llama/slots.py)
STASH_CAP = 1 << 30

Fit = Literal["fits-gpu", "fits-ram", "too-large"]


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    weights: int
    kv_cache: int
    compute: int
    overhead: int
    context_length: int
    prompt_ram: int = 0  # idle conversations' caches kept in host memory, at most

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.compute + self.overhead + self.prompt_ram

    def as_dict(self) -> dict[str, Any]:
        return {
            "weights": self.weights,
            "kv_cache": self.kv_cache,
            "compute": self.compute,
            "overhead": self.overhead,
            "prompt_ram": self.prompt_ram,
            "total": self.total,
            "context_length": self.context_length,
        }


def _int(v: Any, default: int = 0) -> int:
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    if isinstance(v, list) and v and all(isinstance(x, int) for x in v):  # per-layer arrays
        return max(v)
    return default


KEPT_SLOTS = 8  # sequence ids of a shared cache: the conversations it keeps at least
MAX_SLOTS = 64


def separate_caches(prompt_cache: str, kv_layout: str) -> bool:
    """Whether each parallel request gets its own cache of the context length (a llama.cpp
    cache stream per sequence): with the "per-sequence" layout, and always with the exact
    prompt cache (a sequence's cells then lie as in a solo run)."""
    return prompt_cache == "exact" or kv_layout == "per-sequence"


def cache_slots(parallel: int, prompt_cache: str, kv_layout: str = "shared") -> int:
    """The sequence ids a llama.cpp context gets: one per parallel request with separate caches;
    more in a shared cache, where idle ones keep other conversations' prompts."""
    parallel = max(1, parallel)
    if separate_caches(prompt_cache, kv_layout):
        return parallel
    return min(MAX_SLOTS, max(2 * parallel, KEPT_SLOTS))


def estimate_gguf(
    header: GGUFHeader,
    *,
    context_length: int | None = None,
    kv_type: str = "f16",
    batch_size: int = 512,
    flash_attention: bool = False,
    n_vocab: int | None = None,
    embedding: bool | None = None,
    parallel: int = 1,
    prompt_cache: str = "reuse",
    kv_layout: str = "shared",
) -> MemoryEstimate:
    """Estimate the resident memory of a GGUF model loaded with these options and run to a full
    context (what llama.cpp really touches, not just what it reserves).

    Args:
        header: the parsed header (tensor sizes come from its tensor table).
        context_length: the context to allocate; None = min(trained context, 4096).
        kv_type: KV cache element type (f16, q8_0, q4_0, ...).
        batch_size: llama.cpp's micro-batch (n_ubatch) size.
        flash_attention: attention scores are not materialized when on.
        n_vocab: vocabulary size when the header's token list length is unknown.
        embedding: an embedding model (pooled outputs for every token, no KV cache for
            non-causal encoders); None = decide from the header.
        parallel: sequences decoded together: they share one ``context_length`` of cache,
            or, with separate caches (``kv_layout`` "per-sequence" or ``prompt_cache``
            "exact"), each has its own.
        prompt_cache: the load's prompt-cache mode (reuse, exact, off).
        kv_layout: the load's cache layout (shared, per-sequence).

    A shared "reuse" cache also keeps idle conversations' caches in host memory, up to the
    cache's own size (at most STASH_CAP): ``prompt_ram``.

    The per-element constants were fitted to resident-memory measurements of llama.cpp on a
    135M chat model at 1-4k context and a MiniLM embedder (see tests/runtimes/test_memory_estimate.py).
    """
    weights = sum(t.n_bytes for t in header.tensors)
    trained = header.context_length or 4096
    n_ctx = min(context_length or min(trained, 4096), trained)
    n_layer = _int(header.arch_value("block_count"))
    n_embd = _int(header.arch_value("embedding_length"))
    n_ff = _int(header.arch_value("feed_forward_length"), 4 * n_embd)
    n_head = _int(header.arch_value("attention.head_count"), 1) or 1
    n_head_kv = _int(header.arch_value("attention.head_count_kv"), n_head) or n_head
    head_k = _int(header.arch_value("attention.key_length"), n_embd // n_head if n_head else 0)
    head_v = _int(header.arch_value("attention.value_length"), head_k)
    is_embedding = header.is_embedding_model if embedding is None else embedding
    causal = header.arch_value("attention.causal") is not False
    per_elem = KV_BYTES.get(kv_type.lower(), 2.0)
    separate = separate_caches(prompt_cache, kv_layout)
    streams = max(1, parallel) if separate and not is_embedding else 1
    slots = 1 if is_embedding else cache_slots(parallel, prompt_cache, kv_layout)
    kv = int(n_layer * n_ctx * n_head_kv * (head_k + head_v) * per_elem) * streams if causal else 0
    vocab = n_vocab or header.array_lengths.get("tokenizer.ggml.tokens") or 32000
    # an embedding context takes a whole input as one micro-batch
    ub = n_ctx if is_embedding else max(1, min(batch_size, n_ctx))
    attn = int(ub * n_ctx * n_head * (1.0 if flash_attention else 6.5))
    act = ub * (8 * n_embd + (3 * n_ff if causal else 0)) * 4
    # pooled embeddings make llama.cpp keep an output row per token; generation keeps one
    outputs = n_ctx * (vocab + n_embd) * 4 if is_embedding else vocab * 4 * slots
    stash = kv and not separate and prompt_cache == "reuse" and not is_embedding
    prompt_ram = min(kv, STASH_CAP) if stash else 0
    return MemoryEstimate(weights, kv, attn + act + outputs, LLAMA_OVERHEAD, n_ctx, prompt_ram)


def with_projector(est: MemoryEstimate, projector: GGUFHeader) -> MemoryEstimate:
    """``est`` plus a vision projector (mmproj GGUF): its weights, and the compute buffer of
    its encoder over one image (libmtmd allocates it at load, for an image of image_size)."""
    m = projector.metadata
    n_embd = _int(m.get("clip.vision.embedding_length"))
    n_ff = _int(m.get("clip.vision.feed_forward_length"), 4 * n_embd)
    n_head = _int(m.get("clip.vision.attention.head_count"), 1) or 1
    side = _int(m.get("clip.vision.image_size"))
    n_pos = (side // max(1, _int(m.get("clip.vision.patch_size"), 14))) ** 2 + 1
    # attention scores, activations, and the image as floats (same shape as estimate_gguf's)
    compute = n_pos * n_pos * n_head * 4 + n_pos * (8 * n_embd + 3 * n_ff) * 4 + side * side * 12
    weights = sum(t.n_bytes for t in projector.tensors)
    return replace(est, weights=est.weights + weights, compute=est.compute + compute)


@dataclass(frozen=True, slots=True)
class DeviceMemory:
    """What this machine can hold: free RAM and, per GPU, free VRAM (bytes)."""

    ram_total: int
    ram_available: int
    gpus: tuple[tuple[str, int], ...] = ()


def probe_memory() -> DeviceMemory:
    """RAM from /proc/meminfo (or sysconf); GPUs are reported by runtimes and merged by callers."""
    total = avail = 0
    try:
        with open("/proc/meminfo") as f:
            info = {
                line.split(":")[0]: int(line.split()[1]) * 1024 for line in f if line.split()[1:]
            }
        total = info.get("MemTotal", 0)
        avail = info.get("MemAvailable", info.get("MemFree", 0))
    except (OSError, ValueError, IndexError):
        pass
    if not total:
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
            avail = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            total = avail = 0
    return DeviceMemory(total, avail)


def default_budget() -> int:
    """80% of the machine's RAM, or of the largest GPU's VRAM when a GPU is reported."""
    mem = probe_memory()
    gpu = max((free for _, free in mem.gpus), default=0)
    return int(0.8 * max(mem.ram_total, gpu)) or 8 * 1024**3


def verdict(estimate: int, memory: DeviceMemory) -> Fit:
    """fits-gpu when a GPU has room for all of it, fits-ram when RAM does, else too-large."""
    if any(free >= estimate for _, free in memory.gpus):
        return "fits-gpu"
    if memory.ram_available >= estimate:
        return "fits-ram"
    return "too-large"


def estimate_mlx(
    folder: str, *, context_length: int | None = None, prefill_step: int = 512
) -> MemoryEstimate:
    """MLX folder: safetensors sizes + an f16 KV cache + prefill scores and logits (config.json)."""
    import json
    from pathlib import Path

    p = Path(folder)
    weights = sum(f.stat().st_size for f in p.glob("*.safetensors"))
    try:
        cfg = json.loads((p / "config.json").read_text())
    except (OSError, ValueError):
        cfg = {}
    cfg = cfg if isinstance(cfg, dict) else {}
    n_layer = _int(cfg.get("num_hidden_layers"))
    n_embd = _int(cfg.get("hidden_size"))
    n_head = _int(cfg.get("num_attention_heads"), 1) or 1
    n_head_kv = _int(cfg.get("num_key_value_heads"), n_head) or n_head
    head = _int(cfg.get("head_dim"), n_embd // n_head)
    trained = _int(cfg.get("max_position_embeddings"), 4096)
    n_ctx = min(context_length or min(trained, 4096), trained)
    kv = n_layer * n_ctx * n_head_kv * head * 2 * 2
    vocab = _int(cfg.get("vocab_size"), 32000)
    step = min(prefill_step, n_ctx)
    # attention scores + softmax of one prefill chunk (f32), and its logits (f16)
    compute = step * n_ctx * n_head * 8 + step * vocab * 2
    return MemoryEstimate(weights, kv, compute, MLX_OVERHEAD, n_ctx)


def current_rss() -> int:
    """This process's resident memory in bytes (0 where unknown)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    try:  # macOS / BSD: peak, the best portable figure
        import resource

        ru = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(ru if os.uname().sysname == "Darwin" else ru * 1024)
    except (ImportError, OSError, ValueError):
        return 0


def read_calibration(path: Path) -> dict[str, int]:
    """The measured footprints remembered by earlier loads (key -> bytes)."""
    try:
        data = read_json(path, {})
    except ValueError:
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, int) and v > 0}
