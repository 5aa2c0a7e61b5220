"""The control plane's keys and certificates, made with the openssl CLI into the cluster's folder.

One throwaway CA signs the API server's serving certificate (for 127.0.0.1 and the in-cluster names of the
`kubernetes` Service) and is also the client CA, the cluster-signing CA of the controller-manager and the root CA
it publishes to every namespace, so pods verify the server as they do on a real cluster. The ServiceAccount
token signing key is a separate RSA pair, as kubeadm makes it.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from pathlib import Path

CURVE = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
DAYS = "30"
# The first address of the service range (`--service-cluster-ip-range`) is the `kubernetes` Service's.
SERVING_NAMES = (
    "IP:127.0.0.1",
    "IP:10.0.0.1",
    "DNS:localhost",
    "DNS:kubernetes",
    "DNS:kubernetes.default",
    "DNS:kubernetes.default.svc",
    "DNS:kubernetes.default.svc.cluster.local",
)


@dataclasses.dataclass(frozen=True)
class Keys:
    folder: Path

    @property
    def ca(self) -> Path:
        return self.folder / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.folder / "ca.key"

    @property
    def serving_certificate(self) -> Path:
        return self.folder / "apiserver.crt"

    @property
    def serving_key(self) -> Path:
        return self.folder / "apiserver.key"

    @property
    def service_account_key(self) -> Path:
        return self.folder / "sa.key"

    @property
    def service_account_public_key(self) -> Path:
        return self.folder / "sa.pub"


def _openssl(*args: str, cwd: Path) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("the control plane needs the openssl command to make its keys (apt-get install openssl)")
    subprocess.run([openssl, *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def sign_serving_pair(keys: Keys, folder: Path, subject: str, names: tuple[str, ...]) -> tuple[Path, Path]:
    """A serving certificate and key signed by the cluster's CA, for a server the API server calls (a webhook):
    `tls.crt` and `tls.key` in `folder`, as controller-runtime's webhook server reads them. Made once."""
    certificate, key = folder / "tls.crt", folder / "tls.key"
    if certificate.exists():
        return certificate, key
    folder.mkdir(parents=True, exist_ok=True)
    _openssl("req", *CURVE, "-keyout", "tls.key", "-out", "tls.csr", "-subj", f"/CN={subject}", cwd=folder)
    (folder / "tls.ext").write_text(f"subjectAltName={','.join(names)}\nextendedKeyUsage=serverAuth\n")
    _openssl(
        "x509", "-req", "-in", "tls.csr", "-CA", str(keys.ca), "-CAkey", str(keys.ca_key), "-CAcreateserial",
        "-out", "tls.crt", "-days", DAYS, "-extfile", "tls.ext", cwd=folder,
    )  # fmt: skip
    return certificate, key


def make_keys(folder: Path, addresses: tuple[str, ...] = ()) -> Keys:
    """Make every key once; a folder that has them keeps them, so a restarted cluster keeps its tokens valid.
    `addresses`: more IP addresses the serving certificate covers (the pod network's address of the machine)."""
    keys = Keys(folder)
    if keys.service_account_public_key.exists():
        return keys
    folder.mkdir(parents=True, exist_ok=True)
    _openssl(
        "req",
        "-x509",
        *CURVE,
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        DAYS,
        "-subj",
        "/CN=paralleljob-test-ca",
        cwd=folder,
    )
    _openssl(
        "req", *CURVE, "-keyout", "apiserver.key", "-out", "apiserver.csr", "-subj", "/CN=kube-apiserver", cwd=folder
    )
    names = (*SERVING_NAMES, *(f"IP:{address}" for address in addresses))
    extensions = f"subjectAltName={','.join(names)}\nextendedKeyUsage=serverAuth\n"
    (folder / "apiserver.ext").write_text(extensions)
    _openssl(
        "x509",
        "-req",
        "-in",
        "apiserver.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "apiserver.crt",
        "-days",
        DAYS,
        "-extfile",
        "apiserver.ext",
        cwd=folder,
    )
    _openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", "sa.key", cwd=folder)
    _openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=folder)
    return keys
