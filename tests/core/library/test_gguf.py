"""GGUF header reader: real files from the reference writer, and malformed files that must be
refused with InvalidModel (SECURITY.md item 14) — never another exception, never a hang."""

from __future__ import annotations

import random
import struct
import time
from pathlib import Path

import gguf as gguf_ref
import pytest

from app.core.library import gguf
from app.errors import InvalidModel
from tests.support.gguf_files import (
    ARR,
    BOOL,
    CHATML,
    F32,
    I32,
    STR,
    U8,
    U16,
    U32,
    U64,
    Tensor,
    build,
    gstr,
    kv,
    minimal,
    write_model,
)

ARCH_KVS = [kv("general.architecture", STR, "llama"), kv("llama.context_length", U32, 128)]


def _touch_all(h: gguf.GGUFHeader) -> None:
    """Every derived property must work on anything parse_header accepted."""
    _ = (
        h.architecture,
        h.context_length,
        h.parameters,
        h.chat_template,
        h.quantization,
        h.is_embedding_model,
        [t.n_elements for t in h.tensors],
    )


def _end_of_data(h: gguf.GGUFHeader) -> int:
    return h.data_offset + max((t.offset + t.n_bytes for t in h.tensors), default=0)


# -- valid files ---------------------------------------------------------------------------------


def test_reads_metadata_from_writer_file(tmp_path: Path) -> None:
    p = write_model(tmp_path / "m.gguf", context_length=2048, file_type=7)
    h = gguf.read_header(p)
    assert h.version == 3
    assert h.architecture == "llama"
    assert h.context_length == 2048
    assert h.metadata["llama.block_count"] == 2
    assert h.metadata["general.name"] == "Tiny Test"
    assert h.parameters == 32 + 128
    assert h.quantization == "Q8_0"  # general.file_type 7
    assert h.chat_template == CHATML
    assert h.is_embedding_model is False
    assert h.file_size == p.stat().st_size
    assert {t.name: t.shape for t in h.tensors} == {"tok_embd": (8, 4), "out": (64, 2)}


def test_agrees_with_reference_reader(tmp_path: Path) -> None:
    p = write_model(tmp_path / "m.gguf", tokens=100)
    ours = gguf.read_header(p)
    ref = gguf_ref.GGUFReader(p)
    assert ours.data_offset == ref.data_offset
    assert len(ours.tensors) == len(ref.tensors)
    for t, rt in zip(ours.tensors, ref.tensors, strict=True):
        assert t.name == rt.name
        assert t.shape == tuple(int(x) for x in rt.shape)
        assert t.ggml_type == int(rt.tensor_type)
        assert ours.data_offset + t.offset == rt.data_offset
        assert t.n_bytes == rt.n_bytes
        assert t.n_elements == rt.n_elements


def test_raw_builder_output_is_a_valid_gguf(tmp_path: Path) -> None:
    # The malformed cases below are single changes to this base; it must be valid for both readers.
    data = minimal()
    p = tmp_path / "raw.gguf"
    p.write_bytes(data)
    h = gguf.parse_header(data)
    assert (h.architecture, h.context_length, h.parameters) == ("llama", 128, 16)
    ref = gguf_ref.GGUFReader(p)
    assert [t.name for t in ref.tensors] == ["w"]
    assert gguf.read_header(p).tensors == h.tensors


def test_version_2_is_accepted() -> None:
    assert gguf.parse_header(minimal(version=2)).version == 2


@pytest.mark.parametrize(
    ("big_q8", "expected"),
    [(True, "Q8_0"), (False, "F32")],  # the type holding the most bytes names the file
)
def test_quantization_from_tensor_types_without_file_type(
    tmp_path: Path, big_q8: bool, expected: str
) -> None:
    p = write_model(tmp_path / "m.gguf", file_type=None, big_q8=big_q8)
    h = gguf.read_header(p)
    assert "general.file_type" not in h.metadata
    assert h.quantization == expected


@pytest.mark.parametrize(
    ("file_type", "expected"), [(0, "F32"), (1, "F16"), (15, "Q4_K_M"), (18, "Q6_K")]
)
def test_quantization_from_file_type(tmp_path: Path, file_type: int, expected: str) -> None:
    h = gguf.read_header(write_model(tmp_path / "m.gguf", file_type=file_type))
    assert h.quantization == expected


def test_unknown_file_type_falls_back_to_tensor_types(tmp_path: Path) -> None:
    h = gguf.read_header(write_model(tmp_path / "m.gguf", file_type=999))
    assert h.quantization == "Q8_0"


def test_missing_or_blank_optional_metadata(tmp_path: Path) -> None:
    h = gguf.read_header(
        write_model(tmp_path / "a.gguf", context_length=None, chat_template=None, name=None)
    )
    assert h.context_length is None
    assert h.chat_template is None
    h2 = gguf.read_header(write_model(tmp_path / "b.gguf", chat_template="  \n "))
    assert h2.chat_template is None


def test_long_arrays_are_counted_not_kept(tmp_path: Path) -> None:
    h = gguf.read_header(write_model(tmp_path / "m.gguf", tokens=100))
    assert h.array_lengths["tokenizer.ggml.tokens"] == 100
    assert h.array_lengths["tokenizer.ggml.scores"] == 100
    assert h.metadata["tokenizer.ggml.tokens"] is None
    assert h.metadata["tokenizer.ggml.scores"] is None


def test_short_arrays_are_kept() -> None:
    data = minimal(
        kvs=[
            *ARCH_KVS,
            kv("a.strs", ARR, (STR, ["x", "yz"])),
            kv("a.u8", ARR, (U8, [1, 2, 3])),
            kv("a.nested", ARR, (ARR, [(U8, [1]), (U8, [2, 3])])),
        ]
    )
    h = gguf.parse_header(data)
    assert h.metadata["a.strs"] == ["x", "yz"]
    assert h.metadata["a.u8"] == [1, 2, 3]
    assert h.metadata["a.nested"] == [[1], [2, 3]]
    assert h.array_lengths["a.u8"] == 3


def test_bytes_and_file_give_the_same_header(tmp_path: Path) -> None:
    p = write_model(tmp_path / "m.gguf", tokens=70)
    assert gguf.parse_header(p.read_bytes()) == gguf.read_header(p)


def test_header_prefix_with_file_size(tmp_path: Path) -> None:
    # A remote header read with an HTTP Range request: only the beginning plus the real size.
    data = write_model(tmp_path / "m.gguf").read_bytes()
    h = gguf.parse_header(data)
    head = data[: h.data_offset]
    assert gguf.parse_header(head, file_size=len(data)).tensors == h.tensors
    with pytest.raises(InvalidModel):  # the data the header promises is not in the file
        gguf.parse_header(head, file_size=_end_of_data(h) - 1)
    with pytest.raises(InvalidModel):  # the prefix stops inside the header
        gguf.parse_header(head[: h.data_offset // 2], file_size=len(data))


# -- the real embedding model -----------------------------------------------------------------------


def test_real_minilm_embedding_model(minilm: Path) -> None:
    h = gguf.read_header(minilm)
    assert h.architecture == "bert"
    assert h.context_length == 512
    assert h.quantization == "Q8_0"
    assert h.is_embedding_model is True
    assert h.chat_template is None
    assert h.parameters > 20_000_000
    assert _end_of_data(h) <= h.file_size
    # the vocabulary is counted, not materialized
    assert h.array_lengths["tokenizer.ggml.tokens"] > 30_000
    assert h.metadata["tokenizer.ggml.tokens"] is None


# -- malformed files ---------------------------------------------------------------------------------


def _patch(data: bytes, at: int, raw: bytes) -> bytes:
    return data[:at] + raw + data[at + len(raw) :]


MALFORMED: dict[str, tuple[bytes, str]] = {
    "bad magic": (minimal(magic=b"GGUG"), "magic"),
    "zero magic": (minimal(magic=b"\0\0\0\0"), "magic"),
    "ggml magic": (_patch(minimal(), 0, b"lmgg"), "magic"),
    "version 0": (minimal(version=0), "version"),
    "version 1": (minimal(version=1), "version"),
    "version 4": (minimal(version=4), "version"),
    "version max": (minimal(version=0xFFFFFFFF), "version"),
    "absurd tensor count": (minimal(n_tensors=2**63), "tensor count"),
    "tensor count just over the cap": (minimal(n_tensors=gguf.MAX_TENSORS + 1), "tensor count"),
    "absurd kv count": (minimal(n_kv=2**64 - 1), "metadata count"),
    "kv count just over the cap": (minimal(n_kv=gguf.MAX_KV + 1), "metadata count"),
    "more kvs claimed than present": (minimal(n_kv=50), "past the end|absurd|unknown"),
    "more tensors claimed than present": (
        minimal(n_tensors=1000),
        "past the end|absurd|dimensions",
    ),
    "key length past EOF": (build([struct.pack("<Q", 10**6) + b"x"]), "past the end"),
    "key length 2**64-1": (build([struct.pack("<Q", 2**64 - 1) + b"k"]), "absurd length"),
    "string value length past EOF": (
        minimal(kvs=[*ARCH_KVS, gstr("k") + struct.pack("<IQ", STR, 10**6) + b"short"]),
        "past the end",
    ),
    "string value length absurd": (
        minimal(kvs=[*ARCH_KVS, gstr("k") + struct.pack("<IQ", STR, 2**62)]),
        "absurd length",
    ),
    "unknown value type 13": (
        minimal(kvs=[*ARCH_KVS, gstr("k") + struct.pack("<II", 13, 0)]),
        "unknown value type",
    ),
    "unknown value type max": (
        minimal(kvs=[*ARCH_KVS, gstr("k") + struct.pack("<I", 0xFFFFFFFF) + b"\0" * 8]),
        "unknown value type",
    ),
    "unknown array element type": (
        minimal(kvs=[*ARCH_KVS, gstr("k") + struct.pack("<IIQ", ARR, 77, 1) + b"\0" * 8]),
        "element type",
    ),
    "absurd array length": (
        minimal(kvs=[*ARCH_KVS, gstr("k") + struct.pack("<IIQ", ARR, U8, 2**63)]),
        "absurd length",
    ),
    "array longer than the file": (
        minimal(kvs=[*ARCH_KVS, gstr("k") + struct.pack("<IIQ", ARR, U64, 10**6)]),
        "past the end",
    ),
    "string array longer than the file": (
        minimal(kvs=[*ARCH_KVS, gstr("k") + struct.pack("<IIQ", ARR, STR, 10**6)]),
        "past the end|absurd",
    ),
    "arrays nested too deep": (
        minimal(
            kvs=[
                *ARCH_KVS,
                gstr("k")
                + struct.pack("<I", ARR)
                + struct.pack("<IQ", ARR, 1) * 4
                + struct.pack("<IQ", U8, 0),
            ]
        ),
        "too deep",
    ),
    "tensor data past EOF": (
        minimal(tensors=[Tensor("w", (8, 2), offset=0)], data=b"\0" * 63),
        "past the end",
    ),
    "tensor offset past EOF": (
        minimal(tensors=[Tensor("w", (8, 2), offset=4096)], data=b"\0" * 64),
        "past the end",
    ),
    "tensor offset 2**64 - 32": (
        minimal(tensors=[Tensor("w", (8, 2), offset=2**64 - 32)], data=b"\0" * 64),
        "past the end",
    ),
    "unknown tensor type 4 (removed Q4_2)": (
        minimal(tensors=[Tensor("w", (32, 2), ggml_type=4)]),
        "unknown type",
    ),
    "unknown tensor type 99": (
        minimal(tensors=[Tensor("w", (32, 2), ggml_type=99)]),
        "unknown type",
    ),
    "unknown tensor type max": (
        minimal(tensors=[Tensor("w", (32, 2), ggml_type=2**32 - 1)]),
        "unknown type",
    ),
    "n_dims 0": (minimal(tensors=[Tensor("w", ())]), "dimensions"),
    "n_dims 5": (minimal(tensors=[Tensor("w", (1, 1, 1, 1, 1))]), "dimensions"),
    "dimension 0": (minimal(tensors=[Tensor("w", (8, 0))]), "shape"),
    "dimension 2**63": (minimal(tensors=[Tensor("w", (8, 2**63))], data=b""), "shape"),
    "absurd element count": (minimal(tensors=[Tensor("w", (2**40, 2**40))], data=b""), "large"),
    "row not a whole number of blocks": (
        minimal(tensors=[Tensor("w", (33, 1), ggml_type=8)], data=b"\0" * 64),
        "blocks",
    ),
    "misaligned tensor offset": (
        minimal(tensors=[Tensor("w", (8, 2), offset=4)], data=b"\0" * 128),
        "misaligned",
    ),
    "duplicate tensor names": (
        minimal(tensors=[Tensor("w", (8, 2)), Tensor("w", (8, 2))]),
        "duplicate",
    ),
    "alignment 0": (minimal(kvs=[*ARCH_KVS, kv("general.alignment", U32, 0)]), "alignment"),
    "alignment not a power of two": (
        minimal(kvs=[*ARCH_KVS, kv("general.alignment", U32, 24)]),
        "alignment",
    ),
    "alignment huge": (
        minimal(kvs=[*ARCH_KVS, kv("general.alignment", U32, 1 << 30)]),
        "alignment",
    ),
    "alignment a string": (
        minimal(kvs=[*ARCH_KVS, kv("general.alignment", STR, "32")]),
        "alignment",
    ),
    "empty": (b"", "past the end"),
    "magic only": (b"GGUF", "past the end"),
    "header cut in the counts": (minimal()[:12], "past the end"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_bytes_are_refused(case: str) -> None:
    data, fragment = MALFORMED[case]
    with pytest.raises(InvalidModel, match=fragment) as ei:
        gguf.parse_header(data)
    assert ei.value.code == "invalid_model"


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_files_are_refused(tmp_path: Path, case: str) -> None:
    p = tmp_path / "bad.gguf"
    p.write_bytes(MALFORMED[case][0])
    with pytest.raises(InvalidModel):
        gguf.read_header(p)


@pytest.mark.parametrize("size", [0, 1, 4, 8, 16, 23])
def test_too_small_files(tmp_path: Path, size: int) -> None:
    p = tmp_path / "small.gguf"
    p.write_bytes(minimal()[:size])
    with pytest.raises(InvalidModel):
        gguf.read_header(p)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(InvalidModel):
        gguf.read_header(tmp_path / "nope.gguf")
    (tmp_path / "dir.gguf").mkdir()
    with pytest.raises(InvalidModel):
        gguf.read_header(tmp_path / "dir.gguf")


def test_truncation_at_every_byte(tmp_path: Path) -> None:
    data = write_model(tmp_path / "m.gguf", tokens=80).read_bytes()
    full = gguf.parse_header(data)
    need = _end_of_data(full)
    assert need <= len(data)
    for cut in range(len(data)):
        if cut < need:
            with pytest.raises(InvalidModel):
                gguf.parse_header(data[:cut])
        else:  # only alignment padding is missing: the model is complete
            assert gguf.parse_header(data[:cut]).tensors == full.tensors


def test_truncated_files_on_disk(tmp_path: Path) -> None:
    data = write_model(tmp_path / "m.gguf", tokens=80).read_bytes()
    need = _end_of_data(gguf.parse_header(data))
    p = tmp_path / "cut.gguf"
    for cut in [*range(0, need, 97), need - 1]:
        p.write_bytes(data[:cut])
        with pytest.raises(InvalidModel):
            gguf.read_header(p)


def test_random_byte_mutations_parse_or_raise_invalid_model(tmp_path: Path) -> None:
    data = write_model(tmp_path / "m.gguf", tokens=80).read_bytes()
    header_end = gguf.parse_header(data).data_offset
    rng = random.Random(20240614)
    outcomes = {"parsed": 0, "refused": 0}
    t0 = time.monotonic()
    for i in range(600):
        buf = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            pos = rng.randrange(header_end)
            if rng.random() < 0.5:
                buf[pos] ^= 1 << rng.randrange(8)
            else:
                buf[pos] = rng.choice([0x00, 0xFF, 0x7F, 0x80, rng.randrange(256)])
        try:
            h = gguf.parse_header(bytes(buf))
        except InvalidModel:
            outcomes["refused"] += 1
            continue
        except Exception as e:  # pragma: no cover - the failure we are looking for
            pytest.fail(f"mutation {i} raised {type(e).__name__}: {e}")
        _touch_all(h)
        outcomes["parsed"] += 1
    assert outcomes["parsed"] and outcomes["refused"]  # the fuzzing reached both outcomes
    assert time.monotonic() - t0 < 20


def test_random_u64_fields_set_to_extremes(tmp_path: Path) -> None:
    # Counts, lengths and offsets are u64s: write extreme values at every 8-byte window of the header.
    data = write_model(tmp_path / "m.gguf").read_bytes()
    header_end = gguf.parse_header(data).data_offset
    extremes = [2**64 - 1, 2**63, 2**32, 2**32 - 1, 10**9, len(data), len(data) + 1]
    for pos in range(4, header_end - 8):
        for v in extremes:
            buf = _patch(data, pos, struct.pack("<Q", v))
            try:
                _touch_all(gguf.parse_header(buf))
            except InvalidModel:
                pass


def test_many_small_metadata_entries_parse_quickly() -> None:
    kvs = [kv(f"k{i}", BOOL, True) for i in range(20_000)]
    t0 = time.monotonic()
    h = gguf.parse_header(minimal(kvs=[*ARCH_KVS, *kvs]))
    assert len(h.metadata) == 20_002
    assert time.monotonic() - t0 < 5


def test_scalar_types_round_trip() -> None:
    kvs = [
        *ARCH_KVS,
        kv("f", F32, 1.5),
        kv("b", BOOL, False),
        kv("u", U64, 2**40),
        kv("s", STR, "héllo"),
    ]
    m = gguf.parse_header(minimal(kvs=kvs)).metadata
    assert (m["f"], m["b"], m["u"], m["s"]) == (1.5, False, 2**40, "héllo")


def test_alignment_as_u32_is_honoured() -> None:
    data = minimal(kvs=[*ARCH_KVS, kv("general.alignment", U32, 64)], alignment=64)
    h = gguf.parse_header(data)
    assert h.data_offset % 64 == 0


@pytest.mark.parametrize("vtype", [U8, U16, I32, U64, BOOL])
def test_alignment_of_another_type_is_refused(vtype: int) -> None:
    v = True if vtype == BOOL else 32
    with pytest.raises(InvalidModel):
        gguf.parse_header(minimal(kvs=[*ARCH_KVS, kv("general.alignment", vtype, v)]))
