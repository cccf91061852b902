"""The CLI as scripts use it: real subprocesses, real files, exit codes, stdout/stderr split."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ID_RE = r"^[a-z0-9][a-z0-9._:/-]*$"


def hearth(
    home: Path, *args: str, input: str | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HEARTH_HOME": str(home)}
    env.pop("HEARTH_API_KEY", None)
    return subprocess.run(
        [sys.executable, "-m", "app", *args],
        capture_output=True,
        text=True,
        env=env,
        input=input,
        timeout=timeout,
    )


def test_ls_json_empty(tmp_path: Path) -> None:
    r = hearth(tmp_path, "ls", "--json")
    assert r.returncode == 0
    assert json.loads(r.stdout) == []


def test_usage_error_exit_2(tmp_path: Path) -> None:
    assert hearth(tmp_path, "frobnicate").returncode == 2
    assert hearth(tmp_path, "serve", "--port", "notanumber").returncode == 2


def test_import_ls_rm_in_place(tmp_path: Path, smollm2_path: Path) -> None:
    import re

    src = tmp_path / "src" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    src.parent.mkdir()
    shutil.copyfile(smollm2_path, src)
    r = hearth(tmp_path / "h", "import", str(src))
    assert r.returncode == 0, r.stderr
    mid = r.stdout.strip()
    assert re.match(ID_RE, mid) and mid == "smollm2-135m-instruct.q4_1"
    again = hearth(tmp_path / "h", "import", str(src))
    assert again.returncode == 0 and again.stdout.strip() == mid
    ls = json.loads(hearth(tmp_path / "h", "ls", "--json").stdout)
    assert len(ls) == 1
    m = ls[0]
    for key in (
        "id",
        "format",
        "architecture",
        "parameters",
        "quantization",
        "size_bytes",
        "context_length",
        "has_chat_template",
        "path",
    ):
        assert key in m
    assert m["format"] == "gguf" and m["architecture"] == "llama" and m["quantization"] == "Q4_1"
    assert m["has_chat_template"] is True and m["context_length"] == 8192
    assert m["path"] == str(src.resolve()) and m["size_bytes"] == src.stat().st_size
    assert 100e6 < m["parameters"] < 200e6
    # a second file with the same name from elsewhere gets a suffixed id; --copy copies it
    other = tmp_path / "other" / src.name
    other.parent.mkdir()
    shutil.copyfile(src, other)
    r2 = hearth(tmp_path / "h", "import", "--copy", str(other))
    assert r2.returncode == 0 and r2.stdout.strip() == mid + "-2"
    ls = {x["id"]: x for x in json.loads(hearth(tmp_path / "h", "ls", "--json").stdout)}
    copied = Path(ls[mid + "-2"]["path"])
    assert copied.is_relative_to((tmp_path / "h" / "models").resolve()) and copied.exists()
    # rm: in-place file is kept, owned copy is deleted
    assert hearth(tmp_path / "h", "rm", mid).returncode == 0
    assert src.exists()
    assert hearth(tmp_path / "h", "rm", mid + "-2").returncode == 0
    assert not copied.exists()
    assert json.loads(hearth(tmp_path / "h", "ls", "--json").stdout) == []
    r = hearth(tmp_path / "h", "rm", "nope")
    assert r.returncode == 1 and "does not exist" in r.stderr


def test_invalid_gguf_refused(tmp_path: Path) -> None:
    bad = tmp_path / "evil.gguf"
    bad.write_bytes(
        b"GGUF" + (3).to_bytes(4, "little") + (2**62).to_bytes(8, "little") + b"\0" * 64
    )
    r = hearth(tmp_path / "h", "import", str(bad))
    assert r.returncode == 1
    assert "invalid GGUF" in r.stderr and r.stdout == ""
    assert json.loads(hearth(tmp_path / "h", "ls", "--json").stdout) == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(
    home: Path, *args: str, env_extra: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    env = {**os.environ, "HEARTH_HOME": str(home), **(env_extra or {})}
    if not env_extra or "HEARTH_API_KEY" not in env_extra:
        env.pop("HEARTH_API_KEY", None)
    return subprocess.Popen(
        [sys.executable, "-m", "app", "serve", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _get(url: str, key: str | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url)
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@pytest.mark.model
def test_serve_preload_path_sigterm_and_cli_clients(tmp_path: Path, smollm2_path: Path) -> None:
    home = tmp_path / "h"
    port = _free_port()
    p = _serve(home, "--port", str(port), "--model", str(smollm2_path))
    try:
        line = p.stdout.readline().strip()  # printed once listening
        assert line == f"http://127.0.0.1:{port}/v1"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            st, body = _get(f"http://127.0.0.1:{port}/api/v1/models")
            if (
                st == 200
                and json.loads(body)["models"]
                and json.loads(body)["models"][0]["state"] == "loaded"
            ):
                break
            time.sleep(0.2)
        models = json.loads(body)["models"]
        assert models[0]["state"] == "loaded", "--model PATH was imported and preloaded"
        mid = models[0]["id"]
        # ps / unload / load find the running server through the data folder
        ps = hearth(home, "ps", "--json")
        assert ps.returncode == 0 and [m["id"] for m in json.loads(ps.stdout)] == [mid]
        # the default load: up to eight requests share one cache of the context length
        row = json.loads(ps.stdout)[0]
        assert (row["parallel"], row["options"]["prompt_cache"]) == (8, "reuse")
        assert row["cache_tokens"] == row["context_length"] > 0
        assert hearth(home, "unload", mid).returncode == 0
        assert json.loads(hearth(home, "ps", "--json").stdout) == []
        # a cache stream per request: cache_tokens is parallel x context_length
        load = hearth(
            home, "load", mid, "--kv-layout", "per-sequence", "--parallel", "2",
            "--speculative", "ngram",
        )  # fmt: skip
        assert load.returncode == 0, load.stderr
        (row,) = json.loads(hearth(home, "ps", "--json").stdout)
        assert row["options"]["kv_layout"] == "per-sequence"
        assert row["options"]["speculative"] == "ngram"
        assert row["cache_tokens"] == 2 * row["context_length"] > 0
        bad = hearth(home, "load", mid, "--kv-layout", "split")
        assert bad.returncode != 0 and "kv-layout" in bad.stderr
        assert hearth(home, "unload", mid).returncode == 0
        assert hearth(home, "load", mid).returncode == 0
        assert [m["id"] for m in json.loads(hearth(home, "ps", "--json").stdout)] == [mid]
        # a second server on the same port: clear error, exit 1
        second = _serve(tmp_path / "h2", "--port", str(port))
        out, err = second.communicate(timeout=60)
        assert second.returncode == 1 and "already in use" in err and out == ""
    finally:
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert not (home / "data" / "server.json").exists()
    # SECURITY.md 13: a clean stop leaves no lock or temp files (imports, loads, the probe and
    # the server record all took locks and wrote atomically)
    leftovers = [
        str(f.relative_to(home))
        for f in home.rglob("*")
        if f.name.endswith((".lock", ".tmp", ".partial"))
    ]
    assert leftovers == []


@pytest.mark.model
def test_serve_api_key_env_and_lan_refusal(tmp_path: Path, smollm2_path: Path) -> None:
    for host in ("0.0.0.0", "0"):  # "0" is another spelling of 0.0.0.0 to the resolver
        r = _serve(tmp_path / "h", "--host", host, "--port", "0")
        out, err = r.communicate(timeout=60)
        assert r.returncode == 1 and "API key" in err and out == "", (host, err)
    port = _free_port()
    p = _serve(tmp_path / "h", "--port", str(port), env_extra={"HEARTH_API_KEY": "k-123"})
    try:
        assert p.stdout.readline().strip().endswith(f":{port}/v1")
        assert _get(f"http://127.0.0.1:{port}/v1/models")[0] == 401
        assert _get(f"http://127.0.0.1:{port}/v1/models", "k-123")[0] == 200
        assert _get(f"http://127.0.0.1:{port}/health")[0] == 200
    finally:
        p.send_signal(signal.SIGINT)
        p.communicate(timeout=60)
    assert p.returncode == 0


@pytest.mark.model
def test_run_chats_in_terminal(tmp_path: Path, smollm2_path: Path) -> None:
    r = hearth(
        tmp_path / "h",
        "run",
        str(smollm2_path),
        "--temperature",
        "0",
        "--max-tokens",
        "12",
        input="What is the capital of France?\nAnd of Italy?\n/bye\nnever read\n",
    )
    assert r.returncode == 0, r.stderr
    answers = [a for a in r.stdout.split("\n") if a.strip()]
    assert len(answers) >= 2, r.stdout  # one streamed answer per turn
    assert "never read" not in r.stdout


def test_settings_load_defaults_reach_every_load(tmp_path: Path) -> None:
    """The Settings page's load defaults (parallel included) are what loads get."""
    import dataclasses

    from app.cli import build_service
    from app.paths import AppPaths
    from app.settings import LoadDefaults, Settings, SettingsStore

    paths = AppPaths.default(tmp_path / "h").ensure()
    store = SettingsStore(paths.settings_file)
    load = LoadDefaults(context_length=1024, threads=1, batch_size=256, parallel=3)
    store.save(dataclasses.replace(Settings(), load=load))
    service = build_service(paths, store.load())
    opts = service.models._scheduler._load_defaults()  # type: ignore[attr-defined]
    assert (opts.context_length, opts.threads, opts.batch_size, opts.parallel) == (1024, 1, 256, 3)
