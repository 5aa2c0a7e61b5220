"""What the tests of tests/upstream share besides their fixtures: the operator's image, waiting on a product,
where a process ran, and the process kubelet's pods."""

from __future__ import annotations

import json
from typing import Any

import pytest

from testcluster import images, polling
from testcluster.api import Api
from testcluster.product import Product

OPERATOR_IMAGE = "ghcr.io/paralleljob/operator:0.1.0"  # the chart's default image at its appVersion


def require_image(reference: str, build: str) -> None:
    """An image these tests run must have been built: they fail, never fall back to the venv, without it."""
    store = images.Store()
    try:
        if store.find(reference) is None:
            pytest.fail(f"{reference} is not in {store.folder}/store: run `{build}` first", pytrace=False)
    finally:
        store.close()


def ran_from_image(product: Product, namespace: str, pod: str) -> dict[str, Any]:
    """What the kubelet ran a pod's container with (its sandbox.json), checked to be the pod's image."""
    sandbox = json.loads((product.pod_folder(namespace, pod) / "sandbox.json").read_text())
    assert "image" in sandbox, f"{pod} ran from the venv, not from its image"
    status = json.loads(product.kubectl("get", "pod", pod, "-n", namespace, "-o", "json"))
    assert status["status"]["containerStatuses"][0]["imageID"].startswith("sha256:")
    return dict(sandbox)


def wait_for(what: str, condition: Any, product: Product, timeout: float) -> Any:
    try:
        return polling.wait_for(condition, timeout, what)
    except TimeoutError as error:
        pytest.fail(f"{error}; {product.what_was_seen()}")


PODS = "/api/v1/namespaces/default/pods"


def wait_for_pod(api: Api, name: str, condition: Any, timeout: float = 60) -> dict[str, Any]:
    def seen() -> dict[str, Any] | None:
        response = api.send("GET", f"{PODS}/{name}")
        return response.json() if response.ok and condition(response.json()) else None

    return dict(polling.wait_for(seen, timeout, f"pod {name}"))
