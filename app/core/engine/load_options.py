"""The one description of every load option: type, range or choices, default, help, CLI flag.

``SPECS`` drives validation (the load API, presets, the settings' load defaults), the CLI flags
of ``load``/``run``/``serve`` and the Load dialog's widgets: change a range here and every one of
them follows. Defaults live on :class:`~app.core.types.LoadOptions` itself and are read from it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Literal

from app.core.types import LoadOptions
from app.errors import InvalidRequest

OptionKind = Literal["int", "float", "bool", "choice"]


@dataclass(frozen=True, slots=True)
class OptionSpec:
    """One LoadOptions field as the edges see it.

    Attributes:
        name: the LoadOptions field (and the key in API bodies and presets).
        kind: int, float, bool or choice (a string from ``choices``).
        label: a short human name (the Load dialog's row).
        help: one sentence for the CLI's --help and the dialog's tooltip.
        flag: the CLI flag; for a bool, the flag sets the opposite of the default.
        minimum, maximum: the inclusive range of an int or float.
        choices: the allowed strings of a choice.
        nullable: None is allowed too (seed: None = random).
        special: what the minimum means, shown instead of the number (e.g. 0 = "Auto (fits memory)").
        step: the dialog's spin step.
        mlx: the MLX runtime reads it (the others are llama.cpp's alone).
        advanced: the dialog keeps it under "Advanced options".
    """

    name: str
    kind: OptionKind
    label: str
    help: str
    flag: str
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    nullable: bool = False
    special: str = ""
    step: float = 1
    mlx: bool = False
    advanced: bool = False

    @property
    def default(self) -> Any:
        return getattr(LoadOptions(), self.name)

    def describe_range(self) -> str:
        if self.kind == "choice":
            return "one of " + ", ".join(self.choices)
        if self.kind == "bool":
            return "a boolean"
        noun = "an integer" if self.kind == "int" else "a number"
        if self.minimum is not None or self.maximum is not None:
            noun += f" in [{_fmt(self.minimum)}, {_fmt(self.maximum)}]"
        return noun + (" or null" if self.nullable else "")

    def check(self, value: Any, *, param: str | None = None) -> Any:
        """The value, normalized (ints as floats for a float option).

        Raises:
            InvalidRequest: wrong type, out of range or not a choice (``param`` names it).
        """
        p = param or self.name
        if value is None and self.nullable:
            return None
        bad = InvalidRequest(f"'{self.name}' must be {self.describe_range()}", param=p)
        if self.kind == "bool":
            if not isinstance(value, bool):
                raise bad
            return value
        if self.kind == "choice":
            if not isinstance(value, str) or value not in self.choices:
                raise bad
            return value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise bad
        if self.kind == "int" and not isinstance(value, int):
            raise bad
        if isinstance(value, float) and not math.isfinite(value):
            raise bad
        if self.minimum is not None and value < self.minimum:
            raise bad
        if self.maximum is not None and value > self.maximum:
            raise bad
        return float(value) if self.kind == "float" else value


def _fmt(v: float | None) -> str:
    if v is None:
        return "..."
    return str(int(v)) if float(v).is_integer() else str(v)


KV_TYPES = ("f16", "q8_0", "q4_0")
FLASH = ("auto", "on", "off")
ROPE = ("none", "linear", "yarn")
PROMPT_CACHE = ("reuse", "exact", "off")
KV_LAYOUTS = ("shared", "per-sequence")
SPECULATIVE = ("ngram", "off")

_TABLE = (
    OptionSpec(
        "context_length", "int", "Context length",
        "context length to allocate, in tokens (0 = auto: the largest that fits the memory "
        "budget, up to the model's trained length and the cap in Settings)",
        "--ctx", 0, 1 << 22, special="Auto (fits memory)", step=512, mlx=True,
    ),
    OptionSpec(
        "gpu_layers", "int", "GPU offload",
        "layers to offload to the GPU (-1 auto: all that fit, 0 none)",
        "--gpu-layers", -1, 100_000, special="Auto (all that fit)",
    ),
    OptionSpec(
        "flash_attention", "choice", "Flash attention", "flash attention (auto, on, off)",
        "--flash-attention", choices=FLASH,
    ),
    OptionSpec(
        "kv_type", "choice", "KV cache type",
        "the KV cache's number type (q8_0 halves its memory)", "--kv-type", choices=KV_TYPES,
    ),
    OptionSpec(
        "seed", "int", "Seed", "the default sampling seed (none: random)", "--seed",
        nullable=True, special="Random", mlx=True,
    ),
    OptionSpec(
        "parallel", "int", "Parallel requests",
        "the most requests decoded together in one batch; they share one KV cache of the "
        "context length, and on the CPU those beyond 4 join only while that is faster (with the "
        "exact prompt cache or a cache per sequence each gets its own, and memory grows with "
        "this number)",
        "--parallel", 1, 16,
    ),
    OptionSpec(
        "prompt_cache", "choice", "Prompt cache",
        "reuse: continue from the longest cached prefix (prompt and answer, several "
        "conversations); exact: reuse only what keeps answers bit-identical to an uncached "
        "run; off: no reuse",
        "--prompt-cache", choices=PROMPT_CACHE, mlx=True,
    ),
    OptionSpec(
        "kv_layout", "choice", "KV cache layout",
        "shared: the parallel requests share one cache of the context length; per-sequence: "
        "each gets its own of the context length (memory grows with parallel; none waits for "
        "another's cells)",
        "--kv-layout", choices=KV_LAYOUTS, advanced=True,
    ),
    OptionSpec(
        "speculative", "choice", "Speculative decoding",
        "ngram: a request decoding alone drafts what followed its last tokens earlier in its "
        "prompt or answer and checks the draft in one step (repeats and edits come out several "
        "tokens a step; the same answers but where two tokens nearly tie); off: one token a step",
        "--speculative", choices=SPECULATIVE, advanced=True,
    ),
    OptionSpec(
        "threads", "int", "CPU threads", "CPU threads (0 = auto: the physical cores, fewer while other programs keep them busy)", "--threads",
        0, 1024, special="Auto (follows the load)", advanced=True,
    ),
    OptionSpec(
        "batch_size", "int", "Batch size", "prompt tokens processed per step", "--batch",
        1, 1 << 16, step=128, advanced=True,
    ),
    OptionSpec(
        "ubatch_size", "int", "Micro-batch size",
        "tokens per compute micro-batch (0 = the batch size)", "--ubatch",
        0, 1 << 16, special="Same as batch", step=128, advanced=True,
    ),
    OptionSpec(
        "use_mmap", "bool", "Memory-map the model file",
        "read the weights into memory instead of memory-mapping the file", "--no-mmap",
        advanced=True,
    ),
    OptionSpec(
        "use_mlock", "bool", "Lock the model in RAM (no swapping)", "lock the weights in RAM",
        "--mlock", advanced=True,
    ),
    OptionSpec(
        "rope_scaling", "choice", "RoPE scaling",
        "RoPE scaling (none = the model's own, linear, yarn)", "--rope-scaling",
        choices=ROPE, advanced=True,
    ),
    OptionSpec(
        "rope_freq_base", "float", "RoPE base frequency",
        "RoPE base frequency (0 = the model's)", "--rope-freq-base",
        0, 1e9, special="Model's own", advanced=True,
    ),
    OptionSpec(
        "rope_freq_scale", "float", "RoPE frequency scale",
        "RoPE frequency scale (0 = the model's)", "--rope-freq-scale",
        0, 64, special="Model's own", step=0.25, advanced=True,
    ),
)  # fmt: skip

# looked up at call time by every edge (a test may replace an entry to move a range)
SPECS: dict[str, OptionSpec] = {s.name: s for s in _TABLE}


def specs() -> list[OptionSpec]:
    """Every option, in the table's order (the dialog's and --help's)."""
    return list(SPECS.values())


def check_option(name: str, value: Any, *, param: str | None = None) -> Any:
    """Validate one option by name.

    Raises:
        InvalidRequest: an unknown name or a bad value.
    """
    spec = SPECS.get(name)
    if spec is None:
        raise InvalidRequest(f"unknown load option '{name}'", param=param or name)
    return spec.check(value, param=param)


def validate_load_options(raw: Any, *, where: str = "options") -> dict[str, Any]:
    """A dict of load options (from JSON: API, CLI, GUI, a file), checked against the table.

    Raises:
        InvalidRequest: not an object, an unknown option or a bad value (``param`` names it).
    """
    if not isinstance(raw, dict):
        raise InvalidRequest(f"'{where}' must be an object", param=where)
    return {k: check_option(k, v, param=f"{where}.{k}") for k, v in raw.items()}


def _table_matches_the_type() -> None:
    # a field added to LoadOptions without a row here would be unvalidated and flagless
    names = {f.name for f in fields(LoadOptions)}
    if names != set(SPECS):  # pragma: no cover - a programming error, caught at import
        raise RuntimeError(f"load option table and LoadOptions differ: {names ^ set(SPECS)}")


_table_matches_the_type()
