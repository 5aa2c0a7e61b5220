"""The API server's TLS: a throwaway CA and a serving certificate for 127.0.0.1, made with the openssl CLI once
per test process. Clients verify the server as they do on a real cluster (client-go never sends a bearer token
over plain HTTP), and pods find the CA where the Kubernetes client looks for it."""

from __future__ import annotations

import dataclasses
import functools
import ssl
import tempfile
from pathlib import Path

from tests.upstream import pki


@dataclasses.dataclass(frozen=True)
class ServingCertificates:
    ca: Path
    certificate: Path
    key: Path

    def server_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.certificate, self.key)
        return context


@functools.cache
def serving_certificates() -> ServingCertificates:
    """The upstream test cluster's CA and serving certificate (tests/upstream/pki.py), made once per process."""
    keys = pki.make_keys(Path(tempfile.mkdtemp(prefix="strict-cluster-tls-")))
    return ServingCertificates(keys.ca, keys.serving_certificate, keys.serving_key)
