"""The native load API validates with the load option table: a range moved in the
table moves the API's refusal. A real server on a loopback port; nothing is loaded."""

from __future__ import annotations

import dataclasses
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from app.core.engine.load_options import SPECS
from tests.conftest import start_served, stop_served
from tests.support.gguf_files import write_model


def _call(root: str, method: str, path: str, body: Any) -> tuple[int, Any]:
    req = urllib.request.Request(
        root + path,
        data=json.dumps(body).encode(),
        method=method,
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_the_table_drives_the_load_api_refusals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = start_served(tmp_path / "h", write_model(tmp_path / "src" / "tiny.gguf"))
    try:
        mid = s.model_id
        # 4 is in today's range: estimated, saved as a preset, and not refused by validation
        est = {"model": mid, "options": {"parallel": 4}}
        assert _call(s.root, "POST", "/api/v1/models/estimate", est)[0] == 200
        assert _call(s.root, "PUT", f"/api/v1/models/{mid}/preset", {"parallel": 4})[0] == 200
        assert _call(s.root, "PUT", f"/api/v1/models/{mid}/preset", {})[0] == 200
        st, body = _call(
            s.root, "POST", "/api/v1/models/load", {"model": mid, "options": {"parallel": 17}}
        )
        assert st == 400 and body["error"]["param"] == "options.parallel"
        assert "[1, 16]" in body["error"]["message"]

        monkeypatch.setitem(SPECS, "parallel", dataclasses.replace(SPECS["parallel"], maximum=3))
        for path, method, body, param in (
            (
                "/api/v1/models/load",
                "POST",
                {"model": mid, "options": {"parallel": 4}},
                "options.parallel",
            ),
            (
                "/api/v1/models/estimate",
                "POST",
                {"model": mid, "options": {"parallel": 4}},
                "options.parallel",
            ),
            (f"/api/v1/models/{mid}/preset", "PUT", {"parallel": 4}, "options.parallel"),
        ):
            st, answer = _call(s.root, method, path, body)
            assert st == 400, (path, answer)
            assert answer["error"]["param"] == param
            assert "[1, 3]" in answer["error"]["message"]
    finally:
        stop_served(s)
