"""HTTPS for the server: the SSLContext built from a certificate and key file.

A missing, unreadable or mismatched pair is a ServerError naming the file and the reason, raised
before the socket is bound, so ``hearth serve`` exits 1 with it and the GUI shows it inline.
"""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass
from pathlib import Path

from app.errors import ServerError

log = logging.getLogger(__name__)

_PEM_BEGIN = "-----BEGIN CERTIFICATE-----"
_PEM_END = "-----END CERTIFICATE-----"


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """A loaded certificate/key pair: the server's context and the certificate it presents
    (the leaf, in PEM), which the running-server record carries so the CLI can pin it."""

    context: ssl.SSLContext
    cert_pem: str
    cert_file: str


def tls_pair(cert: str | None, key: str | None) -> tuple[str, str] | None:
    """The (cert, key) paths to serve HTTPS with, or None for plain HTTP (both empty).

    Raises:
        ServerError: only one of the two is given.
    """
    cert, key = (cert or "").strip(), (key or "").strip()
    if not cert and not key:
        return None
    if not cert or not key:
        missing = "certificate (--tls-cert)" if not cert else "key (--tls-key)"
        raise ServerError(
            f"HTTPS needs both a certificate and a key file; the {missing} is missing"
        )
    return cert, key


def load_tls(cert_file: str, key_file: str) -> TlsConfig:
    """An SSLContext for serving (TLS 1.2 or newer) from PEM files.

    Raises:
        ServerError: a file is missing or unreadable, is not PEM, or the key does not match
            the certificate.
    """
    cert_path, key_path = Path(cert_file).expanduser(), Path(key_file).expanduser()
    cert_text = _read(cert_path, "certificate")
    _read(key_path, "key", keep=False)  # only to name the file that fails; ssl reads the key
    leaf = _first_certificate(cert_text)
    if leaf is None:
        raise ServerError(f"TLS certificate file {cert_path} holds no PEM certificate")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(str(cert_path), str(key_path))
    except ssl.SSLError as e:
        if e.reason == "KEY_VALUES_MISMATCH":
            raise ServerError(
                f"TLS key {key_path} does not match the certificate {cert_path}"
            ) from e
        raise ServerError(
            f"cannot use TLS certificate {cert_path} with key {key_path}: "
            f"{e.reason or e} (both must be PEM; the key unencrypted)"
        ) from e
    except OSError as e:  # replaced or removed since it was read
        raise ServerError(
            f"cannot read TLS files {cert_path}, {key_path}: {e.strerror or e}"
        ) from e
    log.info("TLS certificate %s loaded", cert_path)
    return TlsConfig(context=ctx, cert_pem=leaf, cert_file=str(cert_path.resolve()))


def _read(path: Path, what: str, *, keep: bool = True) -> str:
    try:
        if not keep:
            path.open("rb").close()
            return ""
        return path.read_text(encoding="ascii", errors="replace")
    except OSError as e:
        raise ServerError(f"cannot read the TLS {what} file {path}: {e.strerror or e}") from e


def _first_certificate(pem: str) -> str | None:
    """The first certificate of a PEM chain file: the one the server presents."""
    start = pem.find(_PEM_BEGIN)
    end = pem.find(_PEM_END, start)
    if start < 0 or end < 0:
        return None
    return pem[start : end + len(_PEM_END)] + "\n"
