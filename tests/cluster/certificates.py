"""The API server's TLS: a throwaway CA and a serving certificate for 127.0.0.1, made with the openssl CLI once
per test process. Clients verify the server as they do on a real cluster (client-go never sends a bearer token
over plain HTTP), and pods find the CA where the Kubernetes client looks for it."""

from __future__ import annotations

import dataclasses
import functools
import shutil
import ssl
import subprocess
import tempfile
from pathlib import Path

CURVE = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


@dataclasses.dataclass(frozen=True)
class ServingCertificates:
    ca: Path
    certificate: Path
    key: Path

    def server_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.certificate, self.key)
        return context


def _openssl(*args: str, cwd: Path) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("the strict cluster needs the openssl command to make its TLS certificates")
    subprocess.run([openssl, *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@functools.cache
def serving_certificates() -> ServingCertificates:
    folder = Path(tempfile.mkdtemp(prefix="strict-cluster-tls-"))
    _openssl(
        "req",
        "-x509",
        *CURVE,
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "7",
        "-subj",
        "/CN=strict-cluster-ca",
        cwd=folder,
    )
    _openssl("req", *CURVE, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=kube-apiserver", cwd=folder)
    (folder / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    _openssl(
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "7",
        "-extfile",
        "server.ext",
        cwd=folder,
    )
    return ServingCertificates(folder / "ca.crt", folder / "server.crt", folder / "server.key")
