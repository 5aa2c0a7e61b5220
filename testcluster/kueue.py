"""Kueue under test: the pinned Kueue controller (`make tools` builds it from tools/kueue into
.tools/bin/kueue-controller) as a local process against the upstream control plane, with its CRDs and webhooks
from the same module, as its release manifests install them, less the Deployment and the Service:

- the CRDs of the module's config/components/crd/bases, and for the kinds its kustomization patches to a
  conversion webhook, that webhook by URL;
- Kueue's own admission webhooks (config/components/webhook/manifests.yaml, those for kueue.x-k8s.io kinds;
  the job kinds' webhooks are for integrations this cluster does not enable) registered with
  `clientConfig.url: https://127.0.0.1:<port>/<path>` instead of the `webhook-service` Service, which no kube-proxy
  routes here, and the cluster CA as their caBundle;
- the controller with `internalCertManagement.enable: false` (it would otherwise write a Secret and patch the
  webhook configurations of a Service that does not exist) and a serving certificate for 127.0.0.1 signed by
  the cluster's CA in its `webhook.certDir`. Without internal certificates Kueue reads its metrics server's
  pair from the fixed path /etc/kueue/metrics/certs, so it runs in a mount namespace of its own
  (`testcluster.sandbox`, as the process kubelet runs a container) where that path is the same pair; leader
  election, the metrics listener and the visibility server are off;
  `integrations.externalFrameworks` lists the ParallelJob kind, as docs/install.md tells an administrator to.

    state = controlplane.up(folder)        # or a cluster's state
    kueue.up(state)                        # returns once the webhooks answer; down(folder) stops it
"""

from __future__ import annotations

import base64
import copy
import functools
import json
import os
import shutil
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from paralleljob.api import types as api_types
from testcluster import controlplane, pki
from testcluster import sandbox as sandbox_program

MODULE = "sigs.k8s.io/kueue"
TOOLS = controlplane.REPO / "tools" / "kueue"
BINARY = "kueue-controller"
NAMESPACE = "kueue-system"
# The Kind.version.group Kueue's configuration names an externally managed job kind by.
EXTERNAL_FRAMEWORK = f"{api_types.KIND}.{api_types.VERSION}.{api_types.GROUP}"
API_GROUP_PATH = "-kueue-x-k8s-io-"  # the part of a webhook path that names Kueue's own kinds
METRICS_CERTS = "/etc/kueue/metrics/certs"  # where Kueue reads its metrics pair without internal certificates


class KueueError(RuntimeError):
    """Kueue could not be set up; the message says what and how to fix it."""


@functools.cache
def module_folder() -> Path:
    """The pinned Kueue module's files in Go's module cache (the build leaves them there)."""
    go = shutil.which("go")
    if go is None:
        raise KueueError("Kueue's CRDs come from Go's module cache: install Go and run `make tools`")
    done = subprocess.run(
        [go, "list", "-m", "-f", "{{.Dir}}", MODULE], cwd=TOOLS, capture_output=True, text=True, timeout=120,
        env={**os.environ, "GOFLAGS": "-mod=readonly"}, check=False,
    )  # fmt: skip
    folder = Path(done.stdout.strip())
    if done.returncode != 0 or not (folder / "config").is_dir():
        raise KueueError(f"the Kueue module is not in Go's module cache ({done.stderr.strip()}): run `make tools`")
    return folder


def _documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _ca_bundle(state: controlplane.State) -> str:
    return base64.b64encode(state.ca.read_bytes()).decode()


def _client_config(state: controlplane.State, port: int, path: str) -> dict[str, Any]:
    return {"url": f"https://127.0.0.1:{port}{path}", "caBundle": _ca_bundle(state)}


def _converted_kinds(crd_folder: Path) -> set[str]:
    """The CRDs (by name) whose conversion Kueue's kustomization points at its webhook."""
    kustomization = yaml.safe_load((crd_folder / "kustomization.yaml").read_text())
    names = set()
    for patch in kustomization.get("patches") or []:
        if "webhook_in_" in str(patch.get("path")):
            names.add(_documents(crd_folder / patch["path"])[0]["metadata"]["name"])
    return names


def crds(state: controlplane.State, port: int) -> list[dict[str, Any]]:
    """Kueue's CRDs as its release installs them, the conversion webhook by URL."""
    folder = module_folder() / "config" / "components" / "crd"
    converted = _converted_kinds(folder)
    found = []
    for path in sorted((folder / "bases").glob("*.yaml")):
        for crd in _documents(path):
            if crd["metadata"]["name"] in converted:
                crd["spec"]["conversion"] = {
                    "strategy": "Webhook",
                    "webhook": {
                        "clientConfig": _client_config(state, port, "/convert"),
                        "conversionReviewVersions": ["v1"],
                    },
                }
            found.append(crd)
    return found


def webhook_configurations(state: controlplane.State, port: int) -> list[dict[str, Any]]:
    """Kueue's admission webhooks for its own kinds, each called by URL on the loopback port."""
    found = []
    for config in _documents(module_folder() / "config" / "components" / "webhook" / "manifests.yaml"):
        config = copy.deepcopy(config)
        hooks = [
            hook for hook in config.get("webhooks") or [] if API_GROUP_PATH in hook["clientConfig"]["service"]["path"]
        ]
        for hook in hooks:
            hook["clientConfig"] = _client_config(state, port, hook["clientConfig"]["service"]["path"])
        config["metadata"] = {"name": f"kueue-{config['metadata']['name']}"}
        config["webhooks"] = hooks
        found.append(config)
    return found


def configuration(folder: Path, webhook_port: int, health_port: int, *, multikueue: bool = False) -> dict[str, Any]:
    """Kueue's Configuration; `multikueue`: a manager cluster's, whose generic MultiKueue adapter dispatches
    ParallelJobs (`testcluster.multikueue`)."""
    extra: dict[str, Any] = {}
    if multikueue:
        extra["multiKueue"] = {"externalFrameworks": [{"name": EXTERNAL_FRAMEWORK}], "gcInterval": "10s"}
    return {
        **extra,
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(folder / "certs")},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "clientConnection": {"qps": 100, "burst": 200},
        "integrations": {"frameworks": ["batch/job"], "externalFrameworks": [EXTERNAL_FRAMEWORK]},
        "featureGates": {"VisibilityOnDemand": False},
    }


def _create(state: controlplane.State, path: str, body: dict[str, Any], timeout: float = 120.0) -> None:
    """Create an object as the admin (one that exists is fine). Kueue's CRDs are large: a loaded API server
    takes longer than `controlplane.post`'s 10 s to store one, so this waits longer."""
    request = urllib.request.Request(state.server + path, data=json.dumps(body).encode(), method="POST")
    request.add_header("Authorization", f"Bearer {state.tokens['admin']}")
    request.add_header("Content-Type", "application/json")
    context = ssl.create_default_context(cafile=str(state.ca))
    try:
        with urllib.request.urlopen(request, context=context, timeout=timeout):
            return
    except urllib.error.HTTPError as error:
        if error.code != 409:
            raise KueueError(f"POST {path}: {error.code} {error.read().decode(errors='replace')}") from error


def _established(state: controlplane.State, names: list[str]) -> bool:
    for name in names:
        code, body = controlplane.get(state, f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        conditions = {c["type"]: c["status"] for c in json.loads(body).get("status", {}).get("conditions") or []}
        if code != 200 or conditions.get("Established") != "True":
            return False
    return True


def _ready(health_port: int) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{health_port}/readyz", timeout=2) as response:
        return response.status == 200


def _serving(state: controlplane.State, port: int) -> bool:
    """The webhook server answers TLS with a certificate the cluster's CA signed (any HTTP status will do)."""
    context = ssl.create_default_context(cafile=str(state.ca))
    try:
        urllib.request.urlopen(f"https://127.0.0.1:{port}/convert", context=context, timeout=2)
    except urllib.error.HTTPError:
        return True
    return True


def up(state: controlplane.State, *, multikueue: bool = False) -> None:
    """Install Kueue's CRDs, start its controller and register its webhooks; returns once they answer.
    `multikueue`: as a MultiKueue manager cluster (`configuration`)."""
    binary = controlplane.binary(BINARY)
    folder = state.folder / "kueue"
    folder.mkdir(parents=True, exist_ok=True)
    pki.sign_serving_pair(pki.Keys(state.folder / "pki"), folder / "certs", "kueue-webhook", ("IP:127.0.0.1",))
    webhook_port, health_port = controlplane.free_port(), controlplane.free_port()
    definitions = crds(state, webhook_port)
    for crd in definitions:
        _create(state, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    controlplane.wait_until(
        state, "kube-apiserver", lambda: _established(state, [crd["metadata"]["name"] for crd in definitions])
    )
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    _create(state, "/api/v1/namespaces", namespace)
    config = folder / "config.yaml"
    config.write_text(yaml.safe_dump(configuration(folder, webhook_port, health_port, multikueue=multikueue)))
    sandbox = {
        "root": str(folder / "root"),
        "hostname": "kueue",
        "mounts": [{"source": str(folder / "certs"), "target": METRICS_CERTS, "readOnly": True}],
        "keep": sorted({str(controlplane.REPO), sys.prefix, sys.base_prefix}),
        "workingDir": str(folder),
        "command": [str(binary), f"--config={config}", "--zap-log-level=2"],
        "env": {**os.environ, "KUBECONFIG": str(state.kubeconfig)},
    }
    (folder / "sandbox.json").write_text(json.dumps(sandbox, indent=1))
    log = (state.folder / "logs" / "kueue.log").open("ab")
    process = subprocess.Popen(
        sandbox_program.argv(folder / "sandbox.json"),
        cwd=controlplane.REPO, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    log.close()
    state.pids["kueue"] = process.pid
    state.save()
    controlplane.wait_until(state, "kueue", lambda: _ready(health_port) and _serving(state, webhook_port))
    for webhooks in webhook_configurations(state, webhook_port):
        kind = (
            "mutatingwebhookconfigurations"
            if webhooks["kind"].startswith("Mutating")
            else "validatingwebhookconfigurations"
        )
        _create(state, f"/apis/admissionregistration.k8s.io/v1/{kind}", webhooks)
