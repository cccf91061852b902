"""`hearth search` / `hearth pull` / `hearth scan` as scripts use them: real subprocesses against the
fake Hub, a kill -9 in the middle of a pull, and a pull through a running server's API."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Served, start_served, stop_served
from tests.support.fakehub import TOKEN, FakeHub, gguf_bytes, mlx_files
from tests.support.hearthproc import hearth, kill_pull_at, ls

REPO = "acme/tiny-GGUF"
FILE = "tiny-Q4_K_M.gguf"


@pytest.fixture
def hub(fake_hub: FakeHub, tmp_path: Path) -> FakeHub:
    b = tmp_path / "build"
    fake_hub.add_repo(
        REPO,
        {
            FILE: gguf_bytes(b, elems=150_000),
            "tiny-Q8_0.gguf": gguf_bytes(b, file_type=7, elems=2048),
            "tiny-F16.gguf": gguf_bytes(b, file_type=1, elems=4096),
        },
        tags=["gguf"],
        downloads=100,
        likes=5,
    )
    fake_hub.add_repo(
        "acme/two-GGUF",
        {"two-Q5_K_M.gguf": gguf_bytes(b, name="two"), "two-Q8_0.gguf": gguf_bytes(b, file_type=7)},
        tags=["gguf"],
        downloads=10,
        likes=50,
    )
    fake_hub.add_repo(
        "mlx-community/tiny-4bit", mlx_files(), tags=["mlx"], library_name="mlx", downloads=1
    )
    fake_hub.add_repo("acme/pickle", {"pytorch_model.bin": b"\x80\x04.", "config.json": b"{}"})
    fake_hub.add_repo(
        "meta/gated-GGUF", {"g-Q4_K_M.gguf": gguf_bytes(b, name="g")}, tags=["gguf"], gated="manual"
    )
    return fake_hub


def test_search_lists_and_sorts(hub: FakeHub, tmp_path: Path) -> None:
    r = hearth(tmp_path, hub, "search", "GGUF", "--json", "--sort", "likes")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [m["id"] for m in rows] == ["acme/two-GGUF", "acme/tiny-GGUF", "meta/gated-GGUF"]
    assert rows[2]["gated"] == "manual" and rows[0]["format"] == "gguf"
    table = hearth(tmp_path, hub, "search", "--limit", "1")
    assert table.returncode == 0 and REPO in table.stdout and "two" not in table.stdout
    assert hearth(tmp_path, hub, "search", "--sort", "bogus").returncode == 2


def test_search_shows_each_repos_size_range(hub: FakeHub, tmp_path: Path) -> None:
    files = hub.repos[REPO].files
    sizes = sorted(len(f.data) for f in files.values())
    r = hearth(tmp_path, hub, "search", "tiny", "--json", "--format", "any")
    assert r.returncode == 0, r.stderr
    rows = {m["id"]: m for m in json.loads(r.stdout)}
    assert rows[REPO]["size_range"] == [sizes[0], sizes[-1]]  # smallest..largest quantization
    mlx_total = sum(len(f.data) for f in hub.repos["mlx-community/tiny-4bit"].files.values())
    assert rows["mlx-community/tiny-4bit"]["size_range"] == [mlx_total, mlx_total]  # one folder
    assert rows[REPO]["format"] == "gguf" and rows[REPO]["downloads"] == 100  # fields kept

    table = hearth(tmp_path, hub, "search", "tiny", "--format", "any")
    assert table.returncode == 0, table.stderr
    header, *lines = table.stdout.splitlines()
    assert header.split()[:3] == ["ID", "FORMAT", "SIZE"]
    row = next(line for line in lines if line.startswith(REPO)).split()
    lo_kb, hi_kb = sizes[0] / 1000, sizes[-1] / 1000
    assert row[2:4] == [f"{lo_kb:.1f}-{hi_kb:.1f}", "KB"]

    quick = hearth(tmp_path, hub, "search", "tiny", "--json", "--no-sizes")
    assert [m["size_range"] for m in json.loads(quick.stdout)] == [None]


def test_pull_picks_q4_k_m_then_a_named_quant(hub: FakeHub, tmp_path: Path) -> None:
    r = hearth(tmp_path, hub, "pull", REPO)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "tiny-q4_k_m"
    assert "completed" in r.stderr  # progress goes to stderr, the id alone to stdout
    r2 = hearth(tmp_path, hub, "pull", f"{REPO}:q8_0")  # case-insensitive
    assert r2.returncode == 0 and r2.stdout.strip() == "tiny-q8_0"
    r3 = hearth(tmp_path, hub, "pull", f"https://huggingface.co/{REPO}/blob/main/tiny-F16.gguf")
    assert r3.returncode == 0 and r3.stdout.strip() == "tiny-f16", r3.stderr
    models = {m["id"]: m for m in ls(tmp_path)}
    assert set(models) == {"tiny-q4_k_m", "tiny-q8_0", "tiny-f16"}
    assert models["tiny-q8_0"]["quantization"] == "Q8_0" and models["tiny-q8_0"]["owned"]
    assert {m["origin"] for m in models.values()} == {"downloaded"}


def test_pull_errors_and_exit_codes(hub: FakeHub, tmp_path: Path) -> None:
    amb = hearth(tmp_path, hub, "pull", "acme/two-GGUF")
    assert amb.returncode == 1 and amb.stdout == ""
    assert "acme/two-GGUF:Q5_K_M" in amb.stderr and "acme/two-GGUF:Q8_0" in amb.stderr
    pickle = hearth(tmp_path, hub, "pull", "acme/pickle")
    assert pickle.returncode == 1 and "pickle" in pickle.stderr
    gated = hearth(tmp_path, hub, "pull", "meta/gated-GGUF")
    assert gated.returncode == 1 and f"{hub.endpoint}/meta/gated-GGUF" in gated.stderr
    hostile = hearth(tmp_path, hub, "pull", "acme/tiny-GGUF/../../x.gguf")
    assert hostile.returncode == 1 and "refusing" in hostile.stderr
    assert hearth(tmp_path, hub, "pull", "acme/nope").returncode == 1
    assert hearth(tmp_path, hub, "pull").returncode == 2
    assert ls(tmp_path) == []


def test_gated_pull_with_a_token(hub: FakeHub, tmp_path: Path) -> None:
    # the token file Hearth's settings write (0600, outside settings.json)
    token_file = tmp_path / "config" / "hf_token"
    token_file.parent.mkdir(parents=True)
    token_file.write_text(TOKEN + "\n")
    r = hearth(tmp_path, hub, "pull", "meta/gated-GGUF")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "g-q4_k_m"
    # or huggingface_hub's own HF_TOKEN
    r2 = hearth(tmp_path / "other", hub, "pull", "meta/gated-GGUF", HF_TOKEN=TOKEN)
    assert r2.returncode == 0, r2.stderr


def test_pull_mlx_repo_as_a_folder(hub: FakeHub, tmp_path: Path) -> None:
    r = hearth(tmp_path, hub, "pull", "mlx-community/tiny-4bit")
    assert r.returncode == 0, r.stderr
    [m] = ls(tmp_path)
    assert m["id"] == r.stdout.strip() == "tiny-4bit" and m["format"] == "mlx"
    assert Path(m["path"]).is_dir() and (Path(m["path"]) / "model.safetensors").is_file()


def test_kill_9_mid_pull_then_resume(hub: FakeHub, tmp_path: Path) -> None:
    cut = 300_000
    partial = tmp_path / "models" / "acme" / "tiny-GGUF" / f".{FILE}.partial"
    kill_pull_at(tmp_path, hub, REPO, FILE, cut, partial)
    assert ls(tmp_path) == []  # nothing partial is listed as installed
    r = hearth(tmp_path, hub, "pull", REPO)
    assert r.returncode == 0, r.stderr
    ranges = hub.ranges(REPO, FILE)
    assert ranges == [None, f"bytes={cut}-"]
    [m] = ls(tmp_path)
    assert m["id"] == "tiny-q4_k_m"
    assert Path(m["path"]).read_bytes() == hub.repos[REPO].files[FILE].data
    assert not partial.exists()


def test_scan_indexes_other_apps_and_rm_keeps_their_files(tmp_path: Path) -> None:
    home = tmp_path / "fakehome"
    lms = home / ".lmstudio" / "models" / "lmstudio-community" / "Tiny-GGUF" / "Tiny-Q8_0.gguf"
    lms.parent.mkdir(parents=True)
    lms.write_bytes(gguf_bytes(tmp_path / "b", file_type=7))
    extra = {
        "HOME": str(home),
        "HF_HUB_CACHE": str(tmp_path / "no-hf"),
        "OLLAMA_MODELS": str(tmp_path / "no-ollama"),
    }
    h = tmp_path / "h"
    r = hearth(h, None, "scan", "--json", **extra)
    assert r.returncode == 0, r.stderr
    [m] = json.loads(r.stdout)
    assert m["id"] == "tiny-q8_0" and m["origin"] == "lm-studio" and not m["owned"]
    rm = hearth(h, None, "rm", "tiny-q8_0", **extra)
    assert rm.returncode == 0 and "file kept" in rm.stdout and lms.is_file()
    assert hearth(h, None, "scan", "--json", **extra).stdout.strip() == "[]"  # stays removed
    h2 = tmp_path / "h2"
    hearth(h2, None, "scan", **extra)
    rm2 = hearth(h2, None, "rm", "tiny-q8_0", "--delete-file", **extra)
    assert rm2.returncode == 0 and "deleted" in rm2.stdout and not lms.exists()


# -- through a running server ----------------------------------------------------------------------
@pytest.fixture
def served(hub: FakeHub, tmp_path: Path) -> Iterator[Served]:
    model = tmp_path / "seed" / "seed-Q8_0.gguf"
    model.parent.mkdir(parents=True)
    model.write_bytes(gguf_bytes(tmp_path / "b", name="seed", file_type=7))
    s = start_served(tmp_path / "served", model)  # its HubClient reads HF_ENDPOINT (the fake)
    s.service.hub.stall_timeout = 3600  # type: ignore[attr-defined]  # gates hold, not stalls
    try:
        yield s
    finally:
        stop_served(s)


def api(s: Served, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    req = urllib.request.Request(
        s.root + path, data=json.dumps(body).encode() if body is not None else None, method=method
    )
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_cli_pull_goes_through_the_running_server(hub: FakeHub, served: Served) -> None:
    # a bogus HF_ENDPOINT for the CLI proves the bytes came through the server
    r = hearth(served.home, None, "pull", REPO, HF_ENDPOINT="http://127.0.0.1:9")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "tiny-q4_k_m" and "downloading" in r.stderr
    _, models = api(served, "GET", "/v1/models")
    assert "tiny-q4_k_m" in [m["id"] for m in models["data"]]  # listed at once
    _, dl = api(served, "GET", "/api/v1/downloads")
    [d] = dl["downloads"]
    assert d["state"] == "completed" and d["model_id"] == "tiny-q4_k_m" and d["repo_id"] == REPO
    status, err = api(served, "POST", "/api/v1/pull", {"model": "acme/two-GGUF"})
    assert status == 400 and err["error"]["code"] == "ambiguous_choice"
    assert err["error"]["choices"] == ["acme/two-GGUF:Q5_K_M", "acme/two-GGUF:Q8_0"]
    status, err = api(served, "POST", "/api/v1/pull", {"model": "meta/gated-GGUF"})
    assert status == 403 and err["error"]["url"] == f"{hub.endpoint}/meta/gated-GGUF"
    assert api(served, "GET", "/api/v1/downloads/nope")[0] == 404
    amb = hearth(served.home, None, "pull", "acme/two-GGUF")
    assert amb.returncode == 1 and "acme/two-GGUF:Q8_0" in amb.stderr


def test_api_pull_streams_ndjson_and_obeys_pause_resume_cancel(
    hub: FakeHub, served: Served
) -> None:
    hub.hold(REPO, FILE, at=200_000)  # held until paused
    req = urllib.request.Request(
        served.root + "/api/v1/pull", data=json.dumps({"model": REPO}).encode(), method="POST"
    )
    lines: list[dict[str, Any]] = []
    with urllib.request.urlopen(req, timeout=60) as stream:
        assert stream.headers["Content-Type"].startswith("application/x-ndjson")
        paused = resumed = False
        for raw in stream:
            line = json.loads(raw)
            lines.append(line)
            if not paused and line.get("completed", 0) >= 200_000:
                code, s = api(served, "POST", f"/api/v1/downloads/{line['id']}/pause")
                assert code == 200 and s["state"] == "paused" and s["bytes_done"] == 200_000
                paused = True
            elif paused and not resumed and line["status"] == "paused":
                code, s = api(served, "POST", f"/api/v1/downloads/{line['id']}/resume")
                assert code == 200 and s["state"] in ("queued", "downloading", "verifying")
                resumed = True
    assert lines[0]["status"] == "queued" and lines[0]["total"] == len(
        hub.repos[REPO].files[FILE].data
    )
    assert lines[-1] == {
        "status": "success",
        "id": lines[0]["id"],
        "model": "tiny-q4_k_m",
        "path": lines[-1]["path"],
        "format": "gguf",
        "projector": None,  # this repo has no vision projector
        "projector_refused": None,
    }
    assert hub.ranges(REPO, FILE)[-1] == "bytes=200000-"
    # cancel: the stream ends with an error line, and nothing is left behind
    hub.hold(REPO, "tiny-Q8_0.gguf", at=1000)  # held until cancelled
    req = urllib.request.Request(
        served.root + "/api/v1/pull",
        data=json.dumps({"model": f"{REPO}:Q8_0"}).encode(),
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=60) as stream:
        last: dict[str, Any] = {}
        for raw in stream:
            last = json.loads(raw)
            if last.get("completed") == 1000 and last["status"] == "downloading":
                assert api(served, "POST", f"/api/v1/downloads/{last['id']}/cancel")[0] == 200
    assert last["status"] == "error" and last["error"]["code"] == "cancelled"
    folder = served.home / "models" / "acme" / "tiny-GGUF"
    assert not [p.name for p in folder.iterdir() if p.name.endswith((".partial", ".json"))]
