"""Vision projectors (``mmproj*.gguf``): whether one serves a model, and which one goes with it.

One check (:func:`projector_problem`) answers for every caller: the library when it pairs a
projector found next to a model (import, scans) or downloaded with it (pull), and the llama.cpp
runtime before it loads one. It reads only the two GGUF headers.

Which projector, when there are several (a Hub repo's files, a folder's), is one rule
(:func:`projector_rank`): first one whose name names the model (``mmproj-gemma-3-4b-F16`` for
``gemma-3-4b-Q4_K_M``) over a generic one (``mmproj-F16``) over one naming another model; then
one of the model's own quantization; then F16, BF16, Q8_0, F32, anything else; then the
smallest; then by name.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from app.core.library.gguf import QUANT_RE, GGUFHeader, quant_of, read_header
from app.errors import InvalidModel

log = logging.getLogger(__name__)

PREFIX = "mmproj"
_QUANT_ORDER = ("F16", "BF16", "Q8_0", "F32")


def is_projector_name(name: str) -> bool:
    """A file named like a vision projector: ``mmproj*.gguf`` (case-insensitive)."""
    base = name.rsplit("/", 1)[-1].lower()
    return base.startswith(PREFIX) and base.endswith(".gguf")


def header_problem(model: GGUFHeader, projector: GGUFHeader, *, name: str) -> str | None:
    """Why the projector (header of the file ``name``) cannot serve the model, or None."""
    meta = projector.metadata
    if meta.get("general.architecture") not in (None, "clip") or not meta.get(
        "clip.has_vision_encoder"
    ):
        return f"'{name}' is not a vision projector (no vision encoder)"
    proj_dim = meta.get("clip.vision.projection_dim")
    n_embd = model.arch_value("embedding_length")
    # converters write the text model's width; llama.cpp's input width adds deepstack layers'
    deep = model.arch_value("n_deepstack_layers")
    deep = deep if isinstance(deep, int) and not isinstance(deep, bool) and deep > 0 else 0
    if (
        isinstance(proj_dim, int)
        and isinstance(n_embd, int)
        and proj_dim not in (n_embd, n_embd * (1 + deep))
    ):
        return (
            f"the projector '{name}' does not match the model: its embedding size {proj_dim} "
            f"does not match the model's {n_embd}"
        )
    return None


def projector_problem(model_path: str | Path, projector_path: str | Path) -> str | None:
    """Why the projector file cannot serve the model file, or None when it matches.

    Reads both GGUF headers (bounds-checked); a missing or malformed file is a reason too.
    """
    p = Path(projector_path)
    if not p.is_file():
        return f"the projector {p} is missing"
    try:
        proj = read_header(p)
    except InvalidModel as e:
        return f"'{p.name}' is not a valid GGUF ({e.message})"
    try:
        model = read_header(model_path)
    except InvalidModel as e:
        return f"the model cannot be read ({e.message})"
    return header_problem(model, proj, name=p.name)


def _base(name: str) -> str:
    """A file name without folder, extension, ``mmproj`` prefix and quantization: ``gemma-3-4b``."""
    stem = name.rsplit("/", 1)[-1]
    stem = stem[:-5] if stem.lower().endswith(".gguf") else stem
    stem = QUANT_RE.sub("", stem).lower()
    if stem.startswith(PREFIX):
        stem = stem[len(PREFIX) :]
    stem = re.sub(r"-\d{5}-of-\d{5}$", "", stem)
    return re.sub(r"[^a-z0-9]+", "-", stem).strip("-")


def projector_rank(projector: str, size: int | None, model: str) -> tuple[int, int, int, int, str]:
    """Sort key of a projector file name for the model file name (lowest first; module doc)."""
    pbase, mbase = _base(projector), _base(model)
    named = 1 if not pbase else 0 if pbase in mbase else 2
    pq = quant_of(projector)
    same_quant = 0 if pq is not None and pq == quant_of(model) else 1
    order = _QUANT_ORDER.index(pq) if pq in _QUANT_ORDER else len(_QUANT_ORDER)
    return named, same_quant, order, size if size is not None else 1 << 62, projector


@dataclass(frozen=True, slots=True)
class Pairing:
    """What pairing found for one model: the projector's path, or why none (``refused``)."""

    projector: Path | None
    refused: tuple[str, ...] = ()


def pair_in_folder(model_path: Path, candidates: Iterable[Path] | None = None) -> Pairing:
    """The matching projector lying next to ``model_path`` (the best by :func:`projector_rank`
    among those that match), and the reasons each one that does not match was refused."""
    if candidates is None:
        candidates = projectors_in(model_path.parent)
    ranked = sorted(candidates, key=lambda p: projector_rank(p.name, _size(p), model_path.name))
    refused: list[str] = []
    for p in ranked:
        why = projector_problem(model_path, p)
        if why is None:
            return Pairing(p, tuple(refused))
        refused.append(why)
    return Pairing(None, tuple(refused))


def projectors_in(folder: Path) -> list[Path]:
    """The ``mmproj*.gguf`` files in ``folder`` (not hidden; symlinks followed: the HF cache's
    snapshot folders are symlinks to blobs)."""
    try:
        return sorted(
            p
            for p in folder.iterdir()
            if is_projector_name(p.name) and not p.name.startswith(".") and p.is_file()
        )
    except OSError:
        return []


def _size(p: Path) -> int | None:
    try:
        return p.stat().st_size
    except OSError:
        return None


def apply_pairing(extra: dict[str, object], pairing: Pairing, *, model: str) -> dict[str, object]:
    """``extra`` with ``projector`` (a matching one) or ``projector_refused`` (the reasons);
    the refusals are logged, never silent."""
    out = {k: v for k, v in extra.items() if k not in ("projector", "projector_refused")}
    if pairing.projector is not None:
        out["projector"] = str(pairing.projector)
    elif pairing.refused:
        out["projector_refused"] = "; ".join(pairing.refused)
    for why in pairing.refused:
        log.warning("%s: not paired with a projector: %s", model, why)
    return out
