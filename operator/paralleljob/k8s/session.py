"""A connection to the API server: the kubernetes client configured in-cluster or from a kubeconfig.

Created once by the operator at startup (`connect()`) and passed to `reads`, `writes` and `events`, which
make every call through `Session.send()`: raw JSON (the client's model classes cost seconds at thousands of
pods), a request timeout on every call (so a dead connection can never hang a worker or hold the admission
lock), and the expected errors (404, 409) returned as outcomes instead of raised. Each answer's `Date` header
also tells the `ServerClock` how far the API server's clock is from ours, so that the pods' times (which the
server writes) are compared with the server's present moment, never with a skewed local clock.
"""

from __future__ import annotations

import dataclasses
import datetime
import email.utils
import json
from collections.abc import Callable, Collection
from typing import Any

import kubernetes

USER_AGENT = "paralleljob-operator/0.1"
# (connect, read) seconds for every request; the longest call is one page of a listing.
REQUEST_TIMEOUT = (5.0, 30.0)


class ServerClock:
    """The API server's present moment: our clock plus the offset its last `Date` header showed (whole
    seconds, as HTTP dates are); our own clock until an answer has told."""

    def __init__(self) -> None:
        self.offset = 0.0  # seconds the server's clock is ahead of ours

    def observe(self, date_header: str | None) -> None:
        if not date_header:
            return
        try:
            said = email.utils.parsedate_to_datetime(date_header)
        except (TypeError, ValueError):
            return
        if said.tzinfo is None:
            return
        # The header is truncated to the second: the server's moment lies in [said, said + 1s).
        self.offset = (said - datetime.datetime.now(datetime.UTC)).total_seconds() + 0.5

    def now(self) -> datetime.datetime:
        return datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=self.offset)


CONNECTIONS = 32


@dataclasses.dataclass(frozen=True)
class Session:
    """The API objects of one connection."""

    client: kubernetes.client.ApiClient
    core: kubernetes.client.CoreV1Api
    custom: kubernetes.client.CustomObjectsApi
    rbac: kubernetes.client.RbacAuthorizationV1Api
    scheduling: kubernetes.client.SchedulingV1Api
    timeout: tuple[float, float] = REQUEST_TIMEOUT
    clock: ServerClock = dataclasses.field(default_factory=ServerClock, compare=False)

    def server_now(self) -> datetime.datetime:
        """The API server's present moment (see `ServerClock`)."""
        return self.clock.now()

    @property
    def options(self) -> dict[str, Any]:
        """Keyword arguments of every client call: raw responses and the request timeout."""
        return {"_preload_content": False, "_request_timeout": self.timeout}

    def send(self, call: Callable[..., Any], *args: Any, tolerate: Collection[int] = (), **kwargs: Any) -> Reply:
        """Call a client method with `options`; an ApiException whose status is in `tolerate` is returned."""
        try:
            response = call(*args, **kwargs, **self.options)
        except kubernetes.client.ApiException as error:
            # A refusal carries the server's Date too: the first answer of a fresh operator is often a 404.
            self.clock.observe((error.headers or {}).get("Date"))
            if error.status in tolerate:
                return Reply(int(error.status), None)
            raise
        self.clock.observe(getattr(response, "headers", {}).get("Date"))
        return Reply(200, raw_json(response))


@dataclasses.dataclass(frozen=True)
class Reply:
    """An API answer: 200 with the parsed body, or a tolerated error status with no body."""

    status: int
    body: Any


def connect(
    kubeconfig: str | None = None, context: str | None = None, timeout: tuple[float, float] = REQUEST_TIMEOUT
) -> Session:
    """In-cluster configuration when running in a pod, else the kubeconfig (KUBECONFIG or ~/.kube/config)."""
    return from_configuration(configuration_of(kubeconfig, context), timeout)


def configuration_of(kubeconfig: str | None = None, context: str | None = None) -> kubernetes.client.Configuration:
    """The client configuration `connect` uses: in-cluster when running in a pod, else the kubeconfig."""
    configuration = kubernetes.client.Configuration()
    try:
        kubernetes.config.load_incluster_config(client_configuration=configuration)
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=configuration)
    return configuration


def from_configuration(
    configuration: kubernetes.client.Configuration, timeout: tuple[float, float] = REQUEST_TIMEOUT
) -> Session:
    # Room for every request `writes.create_all` has in flight, and the watches beside them: urllib3 would open
    # the extra connections anyway, only to discard each after one request.
    configuration.connection_pool_maxsize = max(configuration.connection_pool_maxsize or 0, CONNECTIONS)
    client = kubernetes.client.ApiClient(configuration)
    client.user_agent = USER_AGENT  # so audit logs (and the tests' call record) tell our calls apart
    return Session(
        client=client,
        core=kubernetes.client.CoreV1Api(client),
        custom=kubernetes.client.CustomObjectsApi(client),
        rbac=kubernetes.client.RbacAuthorizationV1Api(client),
        scheduling=kubernetes.client.SchedulingV1Api(client),
        timeout=timeout,
    )


def raw_json(response: Any) -> Any:
    """The body of a `_preload_content=False` response, parsed; skipping the client's slow model classes."""
    return json.loads(response.data or b"null")
