"""A certificate authority of a test's own and a server certificate it signed for loopback, made with the
system's `openssl` (elliptic-curve keys: quick to make). Clients verify the server against the CA and its
name (127.0.0.1 / localhost), as librdkafka's `https` endpoint identification and libpq's `verify-full` do."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

KEYSTORE_PASSWORD = "test-keystore"  # the broker's PKCS#12 keystore: a test fixture's, guards nothing
_DAYS = "2"
_EC = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


@dataclass(frozen=True)
class ServerCertificate:
    ca: Path  # the CA's certificate (PEM): what a client trusts
    certificate: Path  # the server's certificate (PEM)
    key: Path  # its private key (PEM, unencrypted, mode 0600)
    keystore: Path  # both as PKCS#12, for a JVM (password KEYSTORE_PASSWORD)


def _openssl(*arguments: str | Path) -> None:
    done = subprocess.run(["openssl", *map(str, arguments)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"openssl {arguments[0]} failed: {done.stderr.strip()}"


def make_server_certificate(folder: Path) -> ServerCertificate:
    folder.mkdir(parents=True, exist_ok=True)
    ca, ca_key = folder / "ca.pem", folder / "ca.key"
    certificate, key, request = folder / "server.pem", folder / "server.key", folder / "server.csr"
    _openssl("req", "-x509", *_EC, "-keyout", ca_key, "-out", ca, "-days", _DAYS, "-subj", "/CN=test CA")
    _openssl("req", *_EC, "-keyout", key, "-out", request, "-subj", "/CN=127.0.0.1")
    names = folder / "names.ext"
    names.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl(
        "x509", "-req", "-in", request, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
        "-out", certificate, "-days", _DAYS, "-extfile", names,
    )  # fmt: skip
    keystore = folder / "server.p12"
    _openssl(
        "pkcs12", "-export", "-in", certificate, "-inkey", key, "-out", keystore,
        "-name", "server", "-passout", f"pass:{KEYSTORE_PASSWORD}",
    )  # fmt: skip
    key.chmod(0o600)
    return ServerCertificate(ca, certificate, key, keystore)
