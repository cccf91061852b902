"""No disk reads per request: settings.json is not re-read per generation and the
models folder is not scanned per listing, yet changes other processes make are still seen.
The real server, the real SmolLM2 runtime, real files and a real second process."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import app.core.library.index as library_module
import app.settings as settings_module
from app.core.library.index import ADOPT_INTERVAL_S
from app.core.util import filecache
from tests.conftest import Served
from tests.support.gguf_files import write_model

pytestmark = pytest.mark.model

REPO = Path(__file__).resolve().parents[2]
N = 50


def call(s: Served, method: str, path: str, body: object | None = None) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=120)
    data = None if body is None else json.dumps(body).encode()
    conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    out = r.read()
    conn.close()
    return r.status, json.loads(out)


def generate(s: Served, chat: bool = True) -> None:
    if chat:
        path = "/v1/chat/completions"
        body: dict[str, Any] = {"messages": [{"role": "user", "content": "Hi"}]}
    else:
        path, body = "/v1/completions", {"prompt": "Hi"}
    status, out = call(s, "POST", path, {"model": s.model_id, "max_tokens": 1, **body})
    assert status == 200, out


@pytest.fixture(scope="module")
def loaded(served: Served) -> Served:
    """The model loaded with one thread: a busy machine's other programs then cost it least
    (two spinning llama.cpp threads on two shared cores made each generation take seconds)."""
    opts = {"model": served.model_id, "options": {"threads": 1}}
    status, out = call(served, "POST", "/api/v1/models/load", opts)
    assert status == 200, out
    return served


def listed(s: Served) -> set[str]:
    status, body = call(s, "GET", "/v1/models")
    assert status == 200, body
    return {m["id"] for m in body["data"]}


class Counter:
    """Wraps a module function and counts the calls whose first argument is ``path``."""

    def __init__(self, fn: Any, path: Path) -> None:
        self.fn, self.path, self.calls = fn, path, 0

    def __call__(self, first: Any, *args: Any, **kwargs: Any) -> Any:
        if Path(first) == self.path:
            self.calls += 1
        return self.fn(first, *args, **kwargs)


def test_generations_do_not_read_the_settings_file(
    loaded: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    served = loaded
    generate(served)
    settings_file = served.home / "config" / "settings.json"
    reads = Counter(settings_module.read_json, settings_file)
    stats = Counter(filecache.signature, settings_file)
    monkeypatch.setattr(settings_module, "read_json", reads)
    monkeypatch.setattr(filecache, "signature", stats)
    start = time.monotonic()
    for i in range(N):
        generate(served, chat=i % 2 == 0)
    elapsed = time.monotonic() - start
    assert reads.calls == 0, f"settings.json read {reads.calls} times in {N} generations"
    # the change check is one stat per CHECK_INTERVAL_S, whatever the request rate
    assert stats.calls <= 2 + elapsed / filecache.CHECK_INTERVAL_S, (stats.calls, elapsed)


def test_listings_do_not_scan_the_models_folder_or_read_the_index(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    service: Any = served.service
    models_dir = service.models.folder
    index_file = service.models._library.index_file
    listed(served)
    scans = Counter(library_module._candidates, models_dir)
    reads = Counter(library_module.read_json, index_file)
    monkeypatch.setattr(library_module, "_candidates", scans)
    monkeypatch.setattr(library_module, "read_json", reads)
    start = time.monotonic()
    for i in range(N):
        assert served.model_id in listed(served)
        if i % 2:
            status, body = call(served, "GET", "/api/tags")
            assert status == 200 and served.model_id in {
                m["model"].removesuffix(":latest") for m in body["models"]
            }
    elapsed = time.monotonic() - start
    assert reads.calls == 0, f"the index was read {reads.calls} times in {N} listings"
    # a scan at most every ADOPT_INTERVAL_S (the old code scanned on every listing)
    assert scans.calls <= 2 + elapsed / ADOPT_INTERVAL_S, (scans.calls, elapsed)


def wait_listed(s: Served, model_id: str, deadline_s: float = 60) -> None:
    deadline = time.monotonic() + deadline_s  # generous: what is checked is that it appears
    while model_id not in listed(s):
        assert time.monotonic() < deadline, f"{model_id} never appeared in /v1/models"
        time.sleep(0.05)


def test_a_model_imported_by_another_process_is_listed(served: Served, tmp_path: Path) -> None:
    path = write_model(tmp_path / "Other-Process.gguf")
    env = {**os.environ, "HEARTH_HOME": str(served.home), "PYTHONPATH": str(REPO)}
    env.pop("HEARTH_API_KEY", None)
    r = subprocess.run(
        [sys.executable, "-m", "app", "import", str(path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    model_id = r.stdout.strip()
    assert model_id == "other-process"
    # a request for it right away finds it (a miss checks the index file at once)
    status, body = call(served, "GET", f"/v1/models/{model_id}")
    assert status == 200, body
    wait_listed(served, model_id)


def test_a_file_dropped_into_the_models_folder_is_listed(served: Served) -> None:
    service: Any = served.service
    write_model(Path(service.models.folder) / "Dropped-In.gguf")
    wait_listed(served, "dropped-in")


def test_a_name_missed_in_several_places_looks_at_each_file_once_a_request(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model id the library lacks is looked up afresh (another process may have just added
    it) by each stage that asks: each shared file is looked at once a request, not once a stage."""
    service: Any = served.service
    index_file = Path(service.models._library.index_file)
    call(served, "POST", "/v1/chat/completions", {"model": "nowhere/none", "messages": []})
    stats = Counter(filecache.signature, index_file)
    monkeypatch.setattr(filecache, "signature", stats)
    body = {"model": "nowhere/none", "messages": [{"role": "user", "content": "Hi"}]}
    for _ in range(N):
        status, out = call(served, "POST", "/v1/chat/completions", body)
        assert status == 404, out
    assert 0 < stats.calls <= N, stats.calls
