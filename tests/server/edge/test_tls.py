"""HTTPS from the settings file (server.tls_cert/tls_key), in process: the base URL, the
running-server record, and the TLS handshake held to the header deadline (SECURITY.md 6)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import Served, serving
from tests.support.tlsfiles import Pki, make_pki

pytest.importorskip("trustme")

DEADLINE = 60.0  # generous: liveness, never speed


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_served(
    tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path, pki: Pki
) -> Iterator[Served]:
    with serving(
        tmp_path_factory.mktemp("tls"),
        smollm2_path,
        tls_cert=str(pki.cert_file),
        tls_key=str(pki.key_file),
        header_timeout_s=1.0,
    ) as s:
        yield s


def test_settings_turn_on_https(tls_served: Served, pki: Pki) -> None:
    assert tls_served.base_url == f"https://127.0.0.1:{tls_served.port}/v1"
    record = json.loads((tls_served.home / "data" / "server.json").read_text())
    assert record["url"] == tls_served.base_url
    leaf = pki.cert_file.read_text().split("-----END CERTIFICATE-----")[0]
    assert record["tls_cert_pem"] == leaf + "-----END CERTIFICATE-----\n"  # the leaf alone
    r = httpx.get(tls_served.root + "/v1/models", verify=pki.client_context(), timeout=DEADLINE)
    assert r.status_code == 200
    assert tls_served.model_id in [m["id"] for m in r.json()["data"]]
    # the Host and Origin rules are the same over HTTPS: an https loopback origin is echoed
    origin = f"https://localhost:{tls_served.port}"
    r = httpx.get(
        tls_served.root + "/v1/models",
        headers={"Origin": origin},
        verify=pki.client_context(),
        timeout=DEADLINE,
    )
    assert r.status_code == 200 and r.headers["Access-Control-Allow-Origin"] == origin
    r = httpx.get(
        tls_served.root + "/v1/models",
        headers={"Host": "evil.example"},
        verify=pki.client_context(),
        timeout=DEADLINE,
    )
    assert r.status_code == 403


def test_a_client_that_never_finishes_the_handshake_is_closed(tls_served: Served) -> None:
    with socket.create_connection(("127.0.0.1", tls_served.port), timeout=DEADLINE) as sock:
        sock.sendall(b"\x16\x03\x01")  # the first bytes of a ClientHello, and no more
        t0 = time.monotonic()
        try:
            got = sock.recv(65536)
        except ConnectionResetError:
            got = b""
        waited = time.monotonic() - t0
    # closed by the 1 s header deadline, well before asyncio's own 60 s handshake timeout
    assert got == b"" and waited < 30, (got, waited)
