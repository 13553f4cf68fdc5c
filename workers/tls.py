"""TLS for the intake: the server's context, the sensors' context, a dev certificate.

An intake that listens beyond loopback must serve TLS: in production the
certificate comes from the config (`intake.tls_cert`, `intake.tls_key`) and
sensors trust `intake.tls_ca`; for the isolated dev rig `corral up` makes a
self-signed certificate for the bridge address with the `openssl` CLI (the
certificate is its own CA). The token check is unchanged either way.
"""

from __future__ import annotations

import ipaddress
import ssl
import subprocess
from pathlib import Path

from contract.errors import CorralError

DEV_CERT_DAYS = 30


class TlsError(CorralError):
    """A certificate could not be made or loaded."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as err:
        raise TlsError(f"intake certificate {cert} / key {key}: {err}") from err
    return context


def client_context(ca: Path | None) -> ssl.SSLContext:
    """Verifies the server against `ca` (else the system's roots)."""
    try:
        return ssl.create_default_context(cafile=str(ca) if ca else None)
    except (OSError, ssl.SSLError) as err:
        raise TlsError(f"intake CA {ca}: {err}") from err


def make_dev_certificate(cert: Path, key: Path, host: str) -> None:
    """A self-signed certificate for `host` (an IP or a DNS name), unless one exists."""
    if cert.exists() and key.exists():
        return
    cert.parent.mkdir(parents=True, exist_ok=True)
    san = f"IP:{host}" if _is_ip(host) else f"DNS:{host}"
    argv = [
        "openssl", "req", "-x509", "-newkey", "ec",
        "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-days", str(DEV_CERT_DAYS), "-subj", "/CN=corral-intake",
        "-addext", f"subjectAltName={san}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-keyout", str(key), "-out", str(cert),
    ]  # fmt: skip
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    except FileNotFoundError as err:
        raise TlsError("openssl is not installed; it makes the dev rig's certificate") from err
    if proc.returncode != 0:
        raise TlsError(f"openssl could not make a certificate: {proc.stderr.strip()[:200]}")
    key.chmod(0o600)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
