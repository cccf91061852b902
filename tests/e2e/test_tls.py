"""HTTPS: a real `hearth serve --tls-cert/--tls-key` with a certificate from a test CA
(trustme) for 127.0.0.1 and localhost; real clients verify it, and the CLI pins it."""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.e2e.serveproc import ServeProc, start_serve
from tests.support.tlsfiles import Pki, make_pki

trustme = pytest.importorskip("trustme")

DEADLINE = 120.0  # generous: liveness, never speed


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path, pki: Pki
) -> Iterator[ServeProc]:
    s = start_serve(
        tmp_path_factory.mktemp("tls"),
        smollm2_path,
        args=("--tls-cert", str(pki.cert_file), "--tls-key", str(pki.key_file)),
    )
    yield s
    s.stop()


def hearth(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HEARTH_HOME": str(home)}
    env.pop("HEARTH_API_KEY", None)
    return subprocess.run(
        [sys.executable, "-m", "app", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=DEADLINE,
    )


def port_of(s: ServeProc) -> int:
    port = urlsplit(s.root).port
    assert port is not None
    return port


@pytest.mark.model
@pytest.mark.parametrize("name", ["127.0.0.1", "localhost"])
def test_openai_client_verifies_the_test_ca_lists_and_streams(
    server: ServeProc, pki: Pki, name: str
) -> None:
    import openai

    assert server.root.startswith("https://127.0.0.1:")  # the printed base URL says https
    base = f"https://{name}:{port_of(server)}/v1"
    with httpx.Client(verify=pki.client_context(), timeout=DEADLINE) as http:
        client = openai.OpenAI(base_url=base, api_key="unused", http_client=http)
        mid = server.models["SmolLM2-135M-Instruct.Q4_1"]
        assert mid in [m.id for m in client.models.list()]
        stream = client.chat.completions.create(
            model=mid,
            messages=[{"role": "user", "content": "Say hi"}],
            max_tokens=8,
            stream=True,
        )
        chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")


@pytest.mark.model
def test_a_client_without_the_ca_fails_verification(server: ServeProc) -> None:
    import openai

    with httpx.Client(timeout=DEADLINE) as http:  # the system's CAs only
        client = openai.OpenAI(base_url=server.root + "/v1", api_key="x", http_client=http)
        with pytest.raises(openai.APIConnectionError) as info:
            client.models.list()
    cause: BaseException | None = info.value
    while cause is not None and not isinstance(cause, ssl.SSLCertVerificationError):
        cause = cause.__cause__ or cause.__context__
    assert isinstance(cause, ssl.SSLCertVerificationError), repr(info.value)


@pytest.mark.model
def test_plain_http_to_the_tls_port_gets_no_answer(server: ServeProc, pki: Pki) -> None:
    with socket.create_connection(("127.0.0.1", port_of(server)), timeout=DEADLINE) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        got = b""
        while True:
            try:
                part = sock.recv(65536)
            except ConnectionResetError:
                break
            if not part:
                break
            got += part
    assert not got.startswith(b"HTTP/"), got[:200]
    # and the server still serves HTTPS
    r = httpx.get(server.root + "/health", verify=pki.client_context(), timeout=DEADLINE)
    assert r.status_code == 200 and r.json()["status"] == "ok"


@pytest.mark.model
def test_the_cli_reaches_the_tls_server_and_pins_its_certificate(
    server: ServeProc, tmp_path: Path
) -> None:
    mid = server.models["SmolLM2-135M-Instruct.Q4_1"]
    record = json.loads((server.home / "data" / "server.json").read_text())
    assert record["url"] == server.root + "/v1"
    r = hearth(server.home, "load", mid, "--json")
    assert r.returncode == 0, r.stderr
    r = hearth(server.home, "ps", "--json")
    assert r.returncode == 0, r.stderr
    assert mid in [m["id"] for m in json.loads(r.stdout)]

    # the same record naming another certificate: the CLI refuses the server's
    other = trustme.CA().issue_cert("127.0.0.1", "localhost").cert_chain_pems[0].bytes().decode()
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "server.json").write_text(json.dumps({**record, "tls_cert_pem": other}))
    r = hearth(tmp_path, "ps")
    assert r.returncode == 1
    assert "CERTIFICATE_VERIFY_FAILED" in r.stderr, r.stderr


def serve(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`hearth serve` expected to refuse at start (it never prints a URL)."""
    return hearth(home, "serve", "--port", "0", *args)


def test_a_missing_key_file_exits_1_naming_it(tmp_path: Path, pki: Pki) -> None:
    missing = tmp_path / "nope.pem"
    r = serve(tmp_path, "--tls-cert", str(pki.cert_file), "--tls-key", str(missing))
    assert r.returncode == 1 and r.stdout == ""
    assert str(missing) in r.stderr and "No such file or directory" in r.stderr, r.stderr
    assert not (tmp_path / "data" / "server.json").exists()


def test_a_key_of_another_certificate_exits_1(tmp_path: Path, pki: Pki) -> None:
    r = serve(tmp_path, "--tls-cert", str(pki.cert_file), "--tls-key", str(pki.other_key_file))
    assert r.returncode == 1 and r.stdout == ""
    assert "does not match the certificate" in r.stderr, r.stderr


def test_a_file_that_is_not_pem_exits_1(tmp_path: Path, pki: Pki) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    r = serve(tmp_path, "--tls-cert", str(junk), "--tls-key", str(pki.key_file))
    assert r.returncode == 1 and "holds no PEM certificate" in r.stderr, r.stderr
    r = serve(tmp_path, "--tls-cert", str(pki.cert_file), "--tls-key", str(junk))
    assert r.returncode == 1 and "cannot use TLS certificate" in r.stderr, r.stderr


def test_a_certificate_without_a_key_exits_1(tmp_path: Path, pki: Pki) -> None:
    r = serve(tmp_path, "--tls-cert", str(pki.cert_file))
    assert r.returncode == 1 and "needs both a certificate and a key" in r.stderr, r.stderr


def test_flags_override_the_settings(tmp_path: Path, pki: Pki) -> None:
    cfg = tmp_path / "config"
    cfg.mkdir()
    server = {"tls_cert": str(pki.cert_file), "tls_key": str(pki.key_file)}
    (cfg / "settings.json").write_text(json.dumps({"server": server}))
    r = serve(tmp_path, "--tls-key", str(pki.other_key_file))  # the cert still from settings
    assert r.returncode == 1 and "does not match the certificate" in r.stderr, r.stderr
