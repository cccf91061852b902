"""Certificate files from a test CA (trustme) for HTTPS tests: a chain for 127.0.0.1 and
localhost, its key, and a key that belongs to another certificate."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pki:
    ca_file: Path  # what clients trust
    cert_file: Path  # the server's chain (leaf first)
    key_file: Path
    other_key_file: Path  # a valid key that belongs to another certificate

    def client_context(self) -> ssl.SSLContext:
        """What a client that trusts the test CA verifies with (names checked too)."""
        return ssl.create_default_context(cafile=str(self.ca_file))


def make_pki(d: Path) -> Pki:
    import trustme

    d.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    with (d / "cert.pem").open("wb") as f:
        for pem in leaf.cert_chain_pems:
            f.write(pem.bytes())
    leaf.private_key_pem.write_to_path(str(d / "key.pem"))
    trustme.CA().issue_cert("localhost").private_key_pem.write_to_path(str(d / "other.pem"))
    return Pki(d / "ca.pem", d / "cert.pem", d / "key.pem", d / "other.pem")
