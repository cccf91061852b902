"""A model whose chat template never finishes (or explodes) cannot hang the server.

A template of two nested 100,000-step loops with no output left `/health`
unanswered for 40 s and SIGTERM ignored for 15 s. Rendering now runs off the event loop under
a deadline that holds whatever the template does; this drives a real `hearth serve`.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.serveproc import start_serve
from tests.support.gguf_rewrite import copy_with_template

pytestmark = pytest.mark.model

SPIN = (
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    "{{ messages[0]['content'] }}"
)
BOMB = "{{ ('x' * 1000000) | replace('x', 'x' * 1000) }}{{ messages[0]['content'] }}"


def _chat(s: Any, model: str) -> tuple[int, Any]:
    return s.post(
        "/v1/chat/completions",
        {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        timeout=120,
    )


def test_a_template_that_never_finishes_is_stopped_and_never_blocks_the_server(
    tmp_path: Path, smollm2_path: Path
) -> None:
    spin = copy_with_template(smollm2_path, tmp_path / "spin.gguf", SPIN)
    bomb = copy_with_template(smollm2_path, tmp_path / "bomb.gguf", BOMB)
    s = start_serve(tmp_path / "h", spin, bomb, smollm2_path)
    try:
        spin_id, bomb_id = s.models["spin"], s.models["bomb"]
        good_id = next(v for k, v in s.models.items() if "SmolLM2" in k)
        for mid in (spin_id, bomb_id, good_id):
            assert s.post("/api/v1/models/load", {"model": mid})[0] == 200
        out: dict[str, Any] = {}
        t = threading.Thread(target=lambda: out.setdefault("r", _chat(s, spin_id)))
        t0 = time.monotonic()
        t.start()
        slowest = 0.0
        while t.is_alive():  # the whole time it renders, the loop answers at once
            slowest = max(slowest, s.health_seconds())
            time.sleep(0.1)
        t.join()
        elapsed = time.monotonic() - t0
        status, body = out["r"]
        assert status == 400 and body["error"]["code"] == "template_error", body
        assert "took longer than" in body["error"]["message"]
        assert slowest < 1.0, f"/health took {slowest:.2f}s during the render"
        assert elapsed < 60  # the render's own bound is 5 s; generous for a loaded machine
        status, body = _chat(s, bomb_id)
        assert status == 400 and body["error"]["code"] == "template_error", body
        status, body = _chat(s, good_id)  # and the server goes on serving
        assert status == 200 and body["choices"][0]["message"]["content"] is not None

        # SIGTERM while a hostile template renders: the server exits within the render bound
        t = threading.Thread(target=lambda: _chat(s, spin_id))
        t.start()
        time.sleep(0.5)
        t0 = time.monotonic()
        s.proc.send_signal(signal.SIGTERM)
        rc = s.proc.wait(60)
        assert rc == 0 and time.monotonic() - t0 < 30, (rc, s.stderr_tail())
        t.join(60)
    finally:
        s.stop()
