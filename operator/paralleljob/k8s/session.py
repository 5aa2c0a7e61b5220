"""A connection to the API server: the kubernetes client configured in-cluster or from a kubeconfig.

Created once by the operator at startup (`connect()`) and passed to `reads`, `writes` and `events`.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import kubernetes


@dataclasses.dataclass(frozen=True)
class Session:
    """The API objects of one connection."""

    client: kubernetes.client.ApiClient
    core: kubernetes.client.CoreV1Api
    custom: kubernetes.client.CustomObjectsApi
    rbac: kubernetes.client.RbacAuthorizationV1Api


def connect(kubeconfig: str | None = None, context: str | None = None) -> Session:
    """In-cluster configuration when running in a pod, else the kubeconfig (KUBECONFIG or ~/.kube/config)."""
    configuration = kubernetes.client.Configuration()
    try:
        kubernetes.config.load_incluster_config(client_configuration=configuration)
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=configuration)
    return from_configuration(configuration)


USER_AGENT = "paralleljob-operator/0.1"


def from_configuration(configuration: kubernetes.client.Configuration) -> Session:
    client = kubernetes.client.ApiClient(configuration)
    client.user_agent = USER_AGENT  # so audit logs (and the tests' call record) tell our calls apart
    return Session(
        client=client,
        core=kubernetes.client.CoreV1Api(client),
        custom=kubernetes.client.CustomObjectsApi(client),
        rbac=kubernetes.client.RbacAuthorizationV1Api(client),
    )


def raw_json(response: Any) -> Any:
    """The body of a `_preload_content=False` response, parsed; skipping the client's slow model classes."""
    return json.loads(response.data or b"null")
