"""``hearth run ID`` with ``/image PATH``, through the CLI's own entry point with
stdin, on SmolLM2 with the tiny real projector: a bad path or file says why and attaches
nothing, the images go with the next message (their positions counted in its prompt) and stay
in the history (the next turn reuses their cached cells); a model without vision says so."""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path

import pytest
from PIL import Image

from app.cli import main
from tests.core.workspace.test_chat_images import noise_png
from tests.support.vision_gguf import IMAGE_SIZE, N_IMAGE_TOKENS, image_rgb, write_projector

pytestmark = pytest.mark.model
STATS = re.compile(r"\[prompt (\d+) tokens \((\d+) cached\), answer (\d+) tokens\]")


def run(
    home: Path,
    model: str,
    stdin: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> tuple[int, str, list[tuple[int, int]]]:
    monkeypatch.setenv("HEARTH_HOME", str(home))
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    capsys.readouterr()
    rc = main(["run", model, "--stats", "--temperature", "0", "--max-tokens", "1", "--ctx", "512"])
    err = capsys.readouterr().err
    return rc, err, [(int(p), int(c)) for p, c, _ in STATS.findall(err)]


def test_image_command_attaches_to_the_next_message(
    tmp_path: Path,
    smollm2_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    seer = tmp_path / "seer" / smollm2_path.name  # a copy with its projector beside it
    seer.parent.mkdir()
    seer.write_bytes(smollm2_path.read_bytes())
    write_projector(seer.parent / "mmproj-test.gguf")
    for seed in (1, 2):
        Image.frombytes("RGB", (IMAGE_SIZE, IMAGE_SIZE), image_rgb(seed)).save(
            tmp_path / f"{seed}.png"
        )
    (tmp_path / "bad.png").write_bytes(noise_png()[:1500])  # cut short
    question = "What is this?\n"

    home = tmp_path / "home"  # one home: the runtime's one-time probe runs once
    monkeypatch.setenv("HEARTH_HOME", str(home))
    assert main(["import", str(smollm2_path)]) == 0
    mid = capsys.readouterr().out.strip()
    rc, err, stats = run(home, mid, f"/image {tmp_path}/1.png\n" + question, monkeypatch, capsys)
    assert rc == 0 and f"{mid} cannot see images" in err and "projector" in err
    ((text_only, _),) = stats  # the question went without the image

    assert main(["import", str(seer)]) == 0  # pairs the projector lying next to it
    mid = capsys.readouterr().out.strip()
    script = (
        f"/image {tmp_path}/missing.png\n/image {tmp_path}/bad.png\n/image\n"
        f"/image {tmp_path}/1.png\n/image {tmp_path}/2.png\n" + question + "And now?\n/bye\n"
    )
    rc, err, stats = run(home, mid, script, monkeypatch, capsys)
    assert rc == 0
    assert "image not attached: missing.png: no such file" in err
    assert "image not attached: bad.png: the image is corrupt" in err
    assert "usage: /image PATH" in err
    assert f"attached 1.png ({IMAGE_SIZE}×{IMAGE_SIZE})" in err and "attached 2.png" in err
    (first, _), (second, cached) = stats
    assert first == text_only + 2 * N_IMAGE_TOKENS  # both images, the bad ones not
    # the images stay in the history: the second turn's prompt reuses their cached cells
    assert cached >= first - 1 and second > first
