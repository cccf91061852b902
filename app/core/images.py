"""Images in a conversation: the decoded input a runtime gets (the vision contract).

t22-vapi owns this module (wire parsing, the bounded decoder); this is the contract part the
llama.cpp runtime builds on, kept verbatim so the branches merge.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.core.types import LocalModel

IMAGE_MARKER = "<__media__>"  # llama.cpp's mtmd default marker (mtmd_default_marker())


@dataclass(frozen=True, slots=True)
class ImageInput:
    """One decoded image, as a runtime gets it.

    Attributes:
        rgb: decoded pixels, RGB8, row-major, ``width * height * 3`` bytes.
        digest: sha256 hex of (width, height, rgb): the prompt cache keys on it.
        where: the wire parameter it came from (``messages[0].content[1]``), for errors.
    """

    rgb: bytes
    width: int
    height: int
    digest: str
    where: str = ""


def supports_vision(model: LocalModel) -> bool:
    """A GGUF with a paired projector (``extra["projector"]``: the mmproj GGUF's path)."""
    return model.format == "gguf" and bool(model.extra.get("projector"))
