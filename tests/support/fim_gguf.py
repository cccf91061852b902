"""Test helper: SmolLM2 (a real model) made a fill-in-the-middle model. SmolLM2's vocabulary
has StarCoder's control tokens but no FIM markers; the copy either names four of its control
tokens in the ``tokenizer.ggml.fim_*_token_id`` keys, or renames them to StarCoder's FIM texts
(``<fim_prefix>``...) so only the texts say what they are. Every other key and tensor is
copied as it is."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import gguf

# SmolLM2's control tokens used as the markers: <gh_stars>, <issue_start>, <issue_comment>,
# <empty_output>; <repo_name> and <file_sep> as they are
FIM_IDS = {"pre": 7, "suf": 8, "mid": 9, "pad": 16, "rep": 3, "sep": 5}
TEXTS = {7: "<fim_prefix>", 8: "<fim_suffix>", 9: "<fim_middle>", 16: "<fim_pad>"}


def write_fim_copy(src: Path, dst: Path, how: Literal["keys", "texts"]) -> Path:
    """A copy of ``src`` whose FIM tokens its metadata keys name (``keys``) or whose vocabulary
    spells them (``texts``)."""
    reader = gguf.GGUFReader(src)
    arch = str(reader.fields["general.architecture"].contents())
    writer = gguf.GGUFWriter(dst, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = field.contents()
        if name == "tokenizer.ggml.tokens" and how == "texts":
            value = [TEXTS.get(i, t) for i, t in enumerate(value)]
        writer.add_key_value(name, value, vtype, sub_type=sub)
    if how == "keys":
        for role, tok in FIM_IDS.items():
            writer.add_uint32(f"tokenizer.ggml.fim_{role}_token_id", tok)
    for t in reader.tensors:
        writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst
