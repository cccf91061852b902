"""Decode work and memory bounds of app/core/inference/images.py on real images made with Pillow: a
JPEG's scans are counted from its markers before Pillow sees it (a progressive JPEG with its
last scan repeated is refused at once), a request's images share one pixel budget taken from
their headers before any is decoded, and a decode stops at its next block read once asked."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from app.core.inference.images import (
    MAX_JPEG_SCANS,
    DecodeStopped,
    ImageLimits,
    ImageSource,
    InvalidImage,
    decode_image,
    jpeg_scans,
)
from app.core.types import ChatMessage
from app.core.workspace.chat_images import decode_messages
from tests.support.hostile_images import header_only_png, progressive_jpeg, repeated_scans

WHERE = "messages[0].content[1].image_url.url"


def test_real_encoders_scans_are_counted_and_taken() -> None:
    progressive = progressive_jpeg(noisy=True)
    scans, segments = jpeg_scans(progressive)
    assert 6 <= scans <= 16 < MAX_JPEG_SCANS and segments >= scans  # libjpeg's script: ~10
    baseline = io.BytesIO()
    Image.new("RGB", (64, 48), (1, 2, 3)).save(baseline, "JPEG")
    assert jpeg_scans(baseline.getvalue())[0] == 1
    grey = io.BytesIO()
    Image.new("L", (64, 48), 9).save(grey, "JPEG", progressive=True)
    assert 1 < jpeg_scans(grey.getvalue())[0] <= 16
    assert decode_image(progressive, where=WHERE).width == 256  # taken as before
    assert jpeg_scans(b"\x89PNG\r\n\x1a\n") == (0, 0)  # not a JPEG: nothing to count


def test_a_progressive_jpeg_with_its_last_scan_repeated_is_refused_before_decoding() -> None:
    hostile = repeated_scans(progressive_jpeg(), 3000)  # decoding it: a pass per scan
    with pytest.raises(InvalidImage) as e:
        decode_image(hostile, where=WHERE)
    assert e.value.status == 400 and e.value.param == WHERE
    assert e.value.message.startswith(WHERE) and f"more than {MAX_JPEG_SCANS} scans" in str(e.value)
    # just under the bound is taken; just over is not
    base = progressive_jpeg((32, 32))
    n = jpeg_scans(base)[0]
    decode_image(repeated_scans(base, MAX_JPEG_SCANS - n), where=WHERE)
    with pytest.raises(InvalidImage, match="scans"):
        decode_image(repeated_scans(base, MAX_JPEG_SCANS - n + 1), where=WHERE)


def test_stuffed_bytes_and_restart_markers_in_scan_data_are_not_markers() -> None:
    buf = io.BytesIO()
    noisy = Image.effect_noise((128, 128), 120).convert("RGB")
    noisy.save(buf, "JPEG", progressive=True, restart_marker_blocks=1)  # RSTn between blocks
    data = buf.getvalue()
    assert b"\xff\x00" in data and b"\xff\xd0" in data
    assert jpeg_scans(data)[0] == jpeg_scans(progressive_jpeg(noisy=True))[0]


def test_a_request_s_images_share_one_pixel_budget_taken_from_their_headers() -> None:
    def png(side: int) -> bytes:
        buf = io.BytesIO()
        Image.new("RGB", (side, side), (0, 9, 0)).save(buf, "PNG")
        return buf.getvalue()

    limits = ImageLimits(max_pixels=10_000, max_request_pixels=250)
    # the third image would go over: it is refused from its header (its data is missing, so
    # decoding it would say "corrupt": the budget answers first)
    msgs = [
        ChatMessage("user", "a", image_sources=(ImageSource("m0.a", data=png(10)),)),
        ChatMessage("user", "b", image_sources=(
            ImageSource("m1.a", data=png(10)), ImageSource("m1.b", data=header_only_png(8, 8)))),
    ]  # fmt: skip
    with pytest.raises(InvalidImage) as e:
        decode_messages(msgs, limits)
    assert e.value.param == "m1.b" and "250" in e.value.message
    assert "max_request_pixels" in e.value.message
    # within the budget the same images decode
    ok = decode_messages(msgs[:1] + [ChatMessage("user", "b", image_sources=(
        ImageSource("m1.a", data=png(10)),))], limits)  # fmt: skip
    assert [len(m.images) for m in ok] == [1, 1]


class CountingBytes(io.BytesIO):
    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.reads = 0

    def read(self, size: int | None = -1, /) -> bytes:
        self.reads += 1
        return super().read(size)


def test_a_decode_stops_at_its_next_read_once_asked() -> None:
    # seconds of decoding, 3 of Pillow's 64 KB blocks: stopped after the first block
    hostile = repeated_scans(progressive_jpeg((512, 512)), 12_000)
    many = ImageLimits(max_jpeg_scans=10**6)  # past the scan bound: only stop ends it
    header = CountingBytes(hostile)
    Image.open(header)  # the reads Pillow makes before any pixel is decoded
    asked: list[int] = []

    def stop() -> bool:
        asked.append(1)
        return len(asked) > header.reads + 1

    with pytest.raises(DecodeStopped):
        decode_image(hostile, where=WHERE, limits=many, stop=stop)
    assert len(asked) == header.reads + 2
    with pytest.raises(DecodeStopped):  # asked before anything is read, too
        decode_image(progressive_jpeg(), where=WHERE, stop=lambda: True)
