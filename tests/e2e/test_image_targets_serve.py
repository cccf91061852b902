"""Hostile images at a real `hearth serve` (SmolLM2, no projector) through names that are not
a vision model: an alias set by `hearth alias set`, unknown names, ``auto`` without rules, no
model. Every answer is the model's 404/400, never the image's (so no image was decoded): a
corrupt image is not called corrupt, a progressive JPEG with thousands of scans and 64 large
PNGs cost nothing, the server's memory stays where it was, and it keeps answering."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.serveproc import start_serve
from tests.support.fuzz_requests import image_cases

pytestmark = pytest.mark.model


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def test_images_to_names_that_are_no_vision_model_are_refused_before_decoding(
    tmp_path: Path, smollm2_path: Path
) -> None:
    s = start_serve(tmp_path / "h", smollm2_path)
    try:
        chat = next(iter(s.models.values()))
        env = {**os.environ, "HEARTH_HOME": str(s.home)}
        r = subprocess.run(
            [sys.executable, "-m", "app", "alias", "set", "blind", chat],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
        bad: list[tuple[str, int, str]] = []
        for model in (chat, "blind"):
            for _, path, raw, headers in image_cases(model):
                sent = json.loads(raw)["model"]
                status, body = s.request("POST", path, raw=raw, headers=headers, timeout=120)
                text = json.dumps(body)
                if sent in ("no-such-model", "prov/no-such-model"):
                    ok = status == 404
                elif sent in ("auto", ""):
                    ok = status == 400 and "model" in text
                else:  # the chat model itself, or the alias for it
                    ok = status == 400 and "vision" in text
                if not ok or "corrupt" in text or "scans" in text or "pixels" in text:
                    bad.append((f"{sent} {path}", status, text[:200]))
        assert s.alive(), s.stderr_tail()
        assert not bad, bad[:5]
        peak = _peak_rss_mib(s.proc.pid)
        assert s.request("POST", "/tokenize", {"model": "blind", "content": "hi"})[0] == 200
    finally:
        s.stop()
    # 64 images of 4096x4096 decoded would be 3 GB of pixels; none was decoded
    assert peak < 1024, f"server peak RSS {peak:.0f} MiB"
