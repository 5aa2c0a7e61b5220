"""The API server the operator tests run against: the upstream control plane (testcluster/controlplane.py),
one per test worker, with the fault proxy (testcluster/proxy.py) in front of it for the operator, and the
test in the roles the control plane leaves to nodes.

What runs, and what the test plays:
- etcd, kube-apiserver (authentication, RBAC, the CRD's schema and CEL, admission) and kube-controller-manager
  (garbage collector, ServiceAccount tokens) are the real ones. The controller-manager runs without its
  node-lifecycle and namespace controllers, and no kube-scheduler runs: the tests write their Nodes' status and
  bind the operator's pods themselves, as the scheduler and kubelets would (a test that needs the real scheduler
  starts one, `start_scheduler`);
- `NodeAgent` watches every pod, keeps the history of their changes (`history`, as the tests replay it), and
  confirms the graceful deletion of a pod on a Ready node after `termination_seconds`, as a kubelet does once
  the containers stopped; a pod on a NotReady node stays Terminating until someone force-deletes it;
- the operator (and anything a test points at `url`) talks to the server through the proxy, which records its
  requests and injects the faults a test asks for; the test's own client talks to the server directly.

Tests share the cluster one after another: `reset` puts it back as it was after start-up (every namespace,
Node, cluster role and binding, priority class, admission policy and kube-system Lease made since then goes),
so each test starts from the cluster the one before it found. A namespace goes the way the namespace controller
takes it, but without that controller (which would race the next test's namespace of the same name): deleted
(so nothing new can be created in it), emptied of every namespaced resource the server lists in its discovery,
then finalized.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import json
import os
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent import futures
from pathlib import Path
from typing import Any, NamedTuple

import kubernetes
import yaml

from testcluster import controlplane, polling
from testcluster.proxy import FaultProxy

REPO = controlplane.REPO
CRD = REPO / "crds" / "paralleljob.io_paralleljobs.yaml"
CRD_NAME = "paralleljobs.paralleljob.io"
# The test writes Node status itself: no node-lifecycle controller to overrule it (nor taints to evict by). No
# namespace controller either: `reset` empties and finalizes the tests' namespaces itself, and the next test makes
# them again by the same names at once, while the namespace controller takes a deletion up five seconds later, by
# name, and goes on deleting in whatever namespace of that name is being reset then and after it is made again
# (CI lost the operator's ServiceAccount and a test's ConfigMap so; tests/operator/test_server_reset.py).
CONTROLLERS = "*,-node-lifecycle-controller,-namespace-controller"
KUBELET_AGENT = "paralleljob-test-node-agent"
# Namespaces the API server makes and the tests never delete, whose Leases, Roles and RoleBindings a reset removes.
SYSTEM_NAMESPACES = ("kube-system", "kube-node-lease")


class Change(NamedTuple):
    """One pod change the node agent saw: what changed, and the fields tests replay."""

    kind: str  # ADDED, MODIFIED, DELETED
    plural: str
    namespace: str
    name: str
    labels: dict[str, str]
    phase: str | None
    gpus: int  # nvidia.com/gpu requested by a pod's containers

    @classmethod
    def of(cls, kind: str, plural: str, obj: Mapping[str, Any]) -> Change:
        meta = obj.get("metadata") or {}
        containers = (obj.get("spec") or {}).get("containers") or []
        gpus = sum(int(((c.get("resources") or {}).get("requests") or {}).get("nvidia.com/gpu", 0)) for c in containers)
        phase = (obj.get("status") or {}).get("phase")
        return cls(
            kind,
            plural,
            meta.get("namespace") or "",
            meta.get("name") or "",
            dict(meta.get("labels") or {}),
            phase,
            gpus,
        )


def admin_client(state: controlplane.State, agent: str = "paralleljob-tests") -> kubernetes.client.ApiClient:
    client = kubernetes.config.new_client_from_config(str(state.kubeconfig))
    client.user_agent = agent
    return client


class NodeAgent:
    """The pods' side of the nodes the tests write: the history of every pod change, and a kubelet's
    confirmation of graceful deletions on Ready nodes.

    Not kwok, which plays the kubelets of the scale benches (bench/kwok.py): its pod-delete Stage selects on the
    pod alone, so it would confirm the deletion of a pod on a node the test made NotReady, where a dead kubelet
    confirms nothing and the lost-node tests wait for the operator's force-delete; its heartbeat Stage would write
    back the Ready a test took away; and it keeps no history to replay."""

    def __init__(self, state: controlplane.State) -> None:
        self.client = admin_client(state, KUBELET_AGENT)
        self.core = kubernetes.client.CoreV1Api(self.client)
        self.history: list[Change] = []
        # Seconds a deleted pod's containers take to stop on a Ready node before the pod object goes.
        self.termination_seconds = 0.2
        self.gaps = 0  # watches that expired (410): history missed changes
        self._confirming: set[str] = set()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="node-agent")

    def start(self) -> NodeAgent:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()

    def _run(self) -> None:
        version = self.core.list_pod_for_all_namespaces(limit=1).metadata.resource_version
        while not self._stopped.is_set():
            try:
                version = self._stream(version)
            except (kubernetes.client.ApiException, KeyError) as error:
                # An expired watch (410): the client raises it, or fails on it undecoded (KeyError).
                if isinstance(error, kubernetes.client.ApiException) and error.status != 410:
                    time.sleep(0.2)
                    continue
                self.gaps += 1
                version = self.core.list_pod_for_all_namespaces(limit=1).metadata.resource_version
            except Exception:  # a dropped connection: watch again from where it was
                time.sleep(0.2)

    def _stream(self, version: str) -> str:
        watch = kubernetes.watch.Watch()
        for event in watch.stream(
            self.core.list_pod_for_all_namespaces,
            resource_version=version,
            timeout_seconds=60,
            allow_watch_bookmarks=True,
            deserialize=False,  # the pods as JSON: no model objects for thousands of events
        ):
            if self._stopped.is_set():
                watch.stop()
                break
            pod = event["object"]
            version = pod["metadata"].get("resourceVersion") or version
            if event["type"] == "ERROR":
                raise kubernetes.client.ApiException(status=pod.get("code", 500), reason=pod.get("message"))
            if event["type"] == "BOOKMARK":
                continue
            self.history.append(Change.of(event["type"], "pods", pod))
            if event["type"] != "DELETED":
                self._maybe_confirm(pod)
        return version

    def _maybe_confirm(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        if not meta.get("deletionTimestamp") or not (pod.get("spec") or {}).get("nodeName"):
            return
        if meta["uid"] in self._confirming:
            return
        self._confirming.add(meta["uid"])
        timer = threading.Timer(self.termination_seconds, self._confirm, args=(pod,))
        timer.daemon = True
        timer.start()

    def _confirm(self, pod: dict[str, Any]) -> None:
        """The containers stopped: the kubelet deletes the pod object with grace 0, unless its node is dead."""
        meta = pod["metadata"]
        if not self._node_ready(pod["spec"]["nodeName"]):
            return
        body = kubernetes.client.V1DeleteOptions(
            grace_period_seconds=0, preconditions=kubernetes.client.V1Preconditions(uid=meta["uid"])
        )
        try:
            self.core.delete_namespaced_pod(meta["name"], meta["namespace"], body=body)
        except kubernetes.client.ApiException as error:
            if error.status not in (404, 409):
                raise

    def _node_ready(self, name: str) -> bool:
        try:
            node = self.core.read_node(name)
        except kubernetes.client.ApiException:
            return False
        return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])


class UpstreamServer:
    """The worker's control plane, its fault proxy and its node agent, as the operator tests see them."""

    def __init__(self, state: controlplane.State, proxy: FaultProxy, agent: NodeAgent, folder: Path) -> None:
        self.state, self.proxy, self.agent, self.folder = state, proxy, agent, folder
        self.client = admin_client(state)
        self.core = kubernetes.client.CoreV1Api(self.client)
        self.baseline = self._cluster_objects()
        self.namespaced = namespaced_collections(self.client)
        self._requests_mark = 0
        self._scheduler_pid: int | None = None
        self._resume: threading.Timer | None = None

    # -- where clients connect ----------------------------------------------------------------------------

    @property
    def kubeconfig(self) -> Path:
        """The admin's kubeconfig, straight to the API server (the test's own reads and writes)."""
        return self.state.kubeconfig

    @property
    def url(self) -> str:
        """The proxy's address: what the operator and the progress reporter talk to."""
        return f"https://127.0.0.1:{self.proxy.port}"

    @property
    def ca(self) -> Path:
        return self.state.ca

    @property
    def admin_token(self) -> str:
        return self.state.tokens["admin"]

    @property
    def proxied_kubeconfig(self) -> Path:
        """The admin's kubeconfig through the proxy (its requests are recorded)."""
        return self.proxy.kubeconfig_for("admin", self.folder)

    def token_for(self, namespace: str, account: str, seconds: int = 3600) -> str:
        """A token of a ServiceAccount, from the TokenRequest API (as a pod's projected token)."""
        request = {"spec": {"audiences": [controlplane.ISSUER], "expirationSeconds": seconds}}
        answer = self.core.create_namespaced_service_account_token(account, namespace, request)
        return str(answer.status.token)

    def kubeconfig_for(self, namespace: str, account: str) -> Path:
        """A kubeconfig of a ServiceAccount, through the proxy."""
        token = self.token_for(namespace, account)
        path = self.folder / f"kubeconfig-{namespace}-{account}"
        document = controlplane.kubeconfig_document(self.url, self.ca, f"{namespace}-{account}", token)
        path.write_text(yaml.safe_dump(document))
        return path

    # -- what the proxy saw, since the test began ---------------------------------------------------------

    @property
    def calls(self) -> list[tuple[str, str, str, str, str]]:
        """(verb, group, resource[/subresource], namespace, user agent) of every resource request through the
        proxy: the operator's, and the progress reporter's."""
        return [(r.verb, r.group, r.resource, r.namespace, r.agent) for r in self.proxy.requests if r.verb]

    @property
    def denied(self) -> list[str]:
        """The 403 messages the server sent through the proxy (a test that provokes one clears it)."""
        return self.proxy.denied

    @property
    def force_deleted(self) -> list[str]:
        """Names of the pods deleted with gracePeriodSeconds=0 through the proxy."""
        return [r.name for r in self.proxy.requests if r.force and r.resource == "pods"]

    @property
    def held(self) -> set[tuple[str, str]]:
        """(verb, resource) pairs whose requests wait while they are in this set."""
        return self.proxy.held_verbs

    @property
    def holding(self) -> list[tuple[str, str, str]]:
        """(verb, resource, namespace) of the requests waiting on `held` now."""
        return self.proxy.holding

    @property
    def latency(self) -> dict[tuple[str, str], float]:
        return self.proxy.latency

    @property
    def rejects(self) -> dict[str, tuple[int, str, str]]:
        return self.proxy.rejects

    @property
    def muted(self) -> set[str]:
        return self.proxy.muted

    @property
    def operator_outage_after(self) -> int | None:
        return self.proxy.outage_after

    @operator_outage_after.setter
    def operator_outage_after(self, value: int | None) -> None:
        self.proxy.outage_after = value

    @property
    def operator_outage_loses_last_answer(self) -> bool:
        return self.proxy.lose_last_answer

    @operator_outage_loses_last_answer.setter
    def operator_outage_loses_last_answer(self, value: bool) -> None:
        self.proxy.lose_last_answer = value

    @property
    def clock_offset(self) -> float:
        return self.proxy.clock_offset

    @clock_offset.setter
    def clock_offset(self, value: float) -> None:
        self.proxy.clock_offset = value

    def clock(self) -> datetime.datetime:
        """The server's present moment as its answers' Date headers tell it."""
        return datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=self.proxy.clock_offset)

    # -- the node agent ---------------------------------------------------------------------------------------

    @property
    def history(self) -> list[Change]:
        return self.agent.history

    @property
    def termination_seconds(self) -> float:
        return self.agent.termination_seconds

    @termination_seconds.setter
    def termination_seconds(self, value: float) -> None:
        self.agent.termination_seconds = value

    # -- what only a cluster's history can give --------------------------------------------------------------

    def add_unchecked(self, doc: dict[str, Any]) -> dict[str, Any]:
        """Store a ParallelJob that today's CRD refuses, as one stored under an older CRD without its CEL rules:
        the CRD is replaced by one without them, the job created, and today's CRD put back (a real API server
        never checks stored objects again)."""
        extensions = kubernetes.client.ApiextensionsV1Api(self.client)
        current = self.client.sanitize_for_serialization(extensions.read_custom_resource_definition(CRD_NAME))
        older = copy.deepcopy(current)
        for version in older["spec"]["versions"]:
            _drop_rules(version["schema"]["openAPIV3Schema"])
        extensions.replace_custom_resource_definition(CRD_NAME, older)
        try:
            custom = kubernetes.client.CustomObjectsApi(self.client)
            namespace = doc["metadata"]["namespace"]
            deadline = time.monotonic() + 30
            while True:  # the API server serves the replaced schema a moment after the write
                try:
                    return dict(
                        custom.create_namespaced_custom_object(
                            "paralleljob.io", "v1alpha1", namespace, "paralleljobs", doc
                        )
                    )
                except kubernetes.client.ApiException as error:
                    if error.status != 422 or time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
        finally:
            restored = copy.deepcopy(current)
            restored["metadata"] = {
                "name": CRD_NAME,
                "resourceVersion": extensions.read_custom_resource_definition(CRD_NAME).metadata.resource_version,
            }
            extensions.replace_custom_resource_definition(CRD_NAME, restored)

    # -- a garbage collector that comes late ---------------------------------------------------------------

    def pause_controllers(self, seconds: float) -> None:
        """Stop kube-controller-manager (SIGSTOP) for `seconds`, then let it go on (SIGCONT): the dependents of an
        owner deleted meanwhile stay until then, and its garbage collector deletes them at once after, as a busy
        collector would some time after the delete."""
        pid = self.state.pids["kube-controller-manager"]
        os.kill(pid, signal.SIGSTOP)
        self._resume = threading.Timer(seconds, self._resume_controllers)
        self._resume.daemon = True
        self._resume.start()

    def _resume_controllers(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.state.pids["kube-controller-manager"], signal.SIGCONT)

    # -- a scheduler, for the tests that want one -----------------------------------------------------------

    def start_scheduler(self) -> None:
        """kube-scheduler against this cluster until `reset`: it binds pods where their requests fit."""
        self._scheduler_pid = controlplane.start_scheduler(self.state)

    # -- between tests -------------------------------------------------------------------------------------------

    def _cluster_objects(self) -> dict[str, set[str]]:
        rbac = kubernetes.client.RbacAuthorizationV1Api(self.client)
        scheduling = kubernetes.client.SchedulingV1Api(self.client)
        admission = kubernetes.client.AdmissionregistrationV1Api(self.client)
        leases = kubernetes.client.CoordinationV1Api(self.client)
        return {
            "namespaces": {n.metadata.name for n in self.core.list_namespace().items},
            "clusterroles": {r.metadata.name for r in rbac.list_cluster_role().items},
            "clusterrolebindings": {r.metadata.name for r in rbac.list_cluster_role_binding().items},
            "priorityclasses": {p.metadata.name for p in scheduling.list_priority_class().items},
            "policies": {p.metadata.name for p in admission.list_validating_admission_policy().items},
            "bindings": {p.metadata.name for p in admission.list_validating_admission_policy_binding().items},
            # The chart's Role and RoleBinding for the admission Lease live in kube-system, those for reading the
            # node Leases in kube-node-lease (where the lost-peer tests play the kubelets' Leases): namespaces
            # the tests never delete, so their objects are named here as "namespace/name".
            "leases": _in_system_namespaces(leases.list_namespaced_lease),
            "roles": _in_system_namespaces(rbac.list_namespaced_role),
            "rolebindings": _in_system_namespaces(rbac.list_namespaced_role_binding),
        }

    def begin(self) -> None:
        """A test begins: nothing recorded, no fault, deletions confirmed quickly."""
        self.proxy.begin()
        self.agent.history.clear()
        self.agent.termination_seconds = 0.2

    def reset(self) -> None:
        """Put the cluster back as it was after start-up, and lift every fault."""
        self.proxy.outage_after = None
        self.proxy.outage_after_request = None
        self.proxy.lose_last_answer = False
        self.proxy.end_holds()
        self.proxy.rejects.clear()
        self.proxy.muted.clear()
        self.proxy.clock_offset = 0.0
        if self._resume is not None:
            self._resume.cancel()
            self._resume = None
            self._resume_controllers()
        if self._scheduler_pid is not None:
            controlplane.stop_process(self._scheduler_pid)
            self._scheduler_pid = None
        now = self._cluster_objects()
        # The cluster's own (bootstrap roles, system priority classes) are never the tests', whenever they came.
        new = {
            kind: {n for n in names - self.baseline[kind] if not n.rsplit("/", 1)[-1].startswith("system")}
            for kind, names in now.items()
        }
        rbac = kubernetes.client.RbacAuthorizationV1Api(self.client)
        scheduling = kubernetes.client.SchedulingV1Api(self.client)
        admission = kubernetes.client.AdmissionregistrationV1Api(self.client)
        leases = kubernetes.client.CoordinationV1Api(self.client)
        for namespace in sorted(new["namespaces"]):
            _ignore_missing(self.core.delete_namespace, namespace)
        for namespace in sorted(new["namespaces"]):
            self._empty(namespace)
        self._empty("default")
        self._delete_contents(new["namespaces"])
        for namespace in sorted(new["namespaces"]):
            self._finalize(namespace)
        deletions = [
            *((rbac.delete_cluster_role, (n,)) for n in new["clusterroles"]),
            *((rbac.delete_cluster_role_binding, (n,)) for n in new["clusterrolebindings"]),
            *((scheduling.delete_priority_class, (n,)) for n in new["priorityclasses"]),
            *((admission.delete_validating_admission_policy_binding, (n,)) for n in new["bindings"]),
            *((admission.delete_validating_admission_policy, (n,)) for n in new["policies"]),
            *((leases.delete_namespaced_lease, tuple(reversed(n.split("/")))) for n in new["leases"]),
            *((rbac.delete_namespaced_role, tuple(reversed(n.split("/")))) for n in new["roles"]),
            *((rbac.delete_namespaced_role_binding, tuple(reversed(n.split("/")))) for n in new["rolebindings"]),
        ]
        for delete, args in deletions:
            _ignore_missing(delete, *args)
        self.core.delete_collection_node(grace_period_seconds=0)

    def _empty(self, namespace: str) -> None:
        """Pods go at once (no kubelet would confirm their deletion), jobs lose the finalizers a killed operator
        left on them."""
        custom = kubernetes.client.CustomObjectsApi(self.client)
        _ignore_missing(self.core.delete_collection_namespaced_pod, namespace, grace_period_seconds=0)
        for pod in self.core.list_namespaced_pod(namespace).items:
            if pod.metadata.finalizers:
                no_finalizers = {"metadata": {"finalizers": None}}
                _ignore_missing(self.core.patch_namespaced_pod, pod.metadata.name, namespace, no_finalizers)
        try:
            jobs = custom.list_namespaced_custom_object("paralleljob.io", "v1alpha1", namespace, "paralleljobs")
        except kubernetes.client.ApiException:
            return
        for job in jobs["items"]:
            if job["metadata"].get("finalizers"):
                patch = {"metadata": {"finalizers": None}}
                _ignore_missing(
                    custom.patch_namespaced_custom_object,
                    "paralleljob.io", "v1alpha1", namespace, "paralleljobs", job["metadata"]["name"], patch,
                )  # fmt: skip

    def _delete_contents(self, namespaces: set[str]) -> None:
        """Delete every namespaced resource's collection in each namespace at once, as the namespace controller
        would after its discovery, but in parallel and without its requeue delays."""
        calls = [(namespace, path) for namespace in namespaces for path in self.namespaced]
        with futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda call: self._delete_collection(*call), calls))

    def _delete_collection(self, namespace: str, path: str) -> None:
        base, resource = path.rsplit("/", 1)
        url = f"{base}/namespaces/{namespace}/{resource}"
        try:
            _request(self.client, "DELETE", url, [("gracePeriodSeconds", 0)])
        except kubernetes.client.ApiException as error:
            if error.status not in (404, 405):
                raise

    def _finalize(self, namespace: str) -> None:
        """Lift the namespace's `kubernetes` finalizer, which the namespace controller lifts once the namespace is
        empty: its contents went in `_delete_contents`, and a deleted namespace takes no new objects."""
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}, "spec": {"finalizers": []}}
        _ignore_missing(self.core.replace_namespace_finalize, namespace, body)


def namespaced_collections(client: kubernetes.client.ApiClient) -> list[str]:
    """'/api/v1/pods'-like paths of every namespaced resource the server can delete by collection, from its
    discovery (preferred versions), as the namespace controller finds them."""
    groups = _request(client, "GET", "/apis")["groups"]
    paths = []
    for base in ["/api/v1", *(f"/apis/{g['preferredVersion']['groupVersion']}" for g in groups)]:
        listing = _request(client, "GET", base)
        paths += [
            f"{base}/{r['name']}"
            for r in listing["resources"]
            if r["namespaced"] and "/" not in r["name"] and "deletecollection" in r.get("verbs", [])
        ]
    return paths


def _request(
    client: kubernetes.client.ApiClient, method: str, path: str, query: list[tuple[str, Any]] | None = None
) -> Any:
    """One request of a path no typed API method covers; its JSON answer."""
    request = client.param_serialize(method, path, query_params=query, auth_settings=["BearerToken"])
    answer = client.call_api(*request)
    answer.read()
    if not 200 <= answer.status < 300:
        raise kubernetes.client.ApiException(http_resp=answer)
    return json.loads(answer.data)


def _drop_rules(schema: dict[str, Any]) -> None:
    schema.pop("x-kubernetes-validations", None)
    for child in (schema.get("properties") or {}).values():
        _drop_rules(child)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            _drop_rules(schema[key])


def _in_system_namespaces(list_namespaced: Any) -> set[str]:
    """ "namespace/name" of the objects a namespaced list call finds in the namespaces the tests never delete."""
    return {f"{ns}/{x.metadata.name}" for ns in SYSTEM_NAMESPACES for x in list_namespaced(ns).items}


def _ignore_missing(call: Any, *args: Any, **kwargs: Any) -> None:
    try:
        call(*args, **kwargs)
    except kubernetes.client.ApiException as error:
        if error.status not in (404, 409):
            raise


def install_crd(state: controlplane.State) -> None:
    client = admin_client(state)
    extensions = kubernetes.client.ApiextensionsV1Api(client)
    extensions.create_custom_resource_definition(yaml.safe_load(CRD.read_text()))

    def established() -> bool:
        conditions = extensions.read_custom_resource_definition(CRD_NAME).status.conditions or []
        return any(c.type == "Established" and c.status == "True" for c in conditions)

    try:
        polling.wait_for(established, 60, f"the CRD {CRD_NAME} Established", interval=0.1)
    except TimeoutError as error:
        raise controlplane.ControlPlaneError(str(error)) from None


def started(folder: Path) -> Iterator[UpstreamServer]:
    """The worker's control plane, up until the generator is closed."""
    # The CRD before the controller-manager: its garbage collector collects a deleted job's dependents from the
    # start (testcluster/controlplane.py, `up`).
    state = controlplane.up(folder, CONTROLLERS, scheduler=False, before_controllers=install_crd)
    proxy = agent = None
    try:
        proxy = FaultProxy(state).start()
        agent = NodeAgent(state).start()
        yield UpstreamServer(state, proxy, agent, folder)
    finally:
        if agent is not None:
            agent.stop()
        if proxy is not None:
            with contextlib.suppress(TimeoutError):  # a watch the operator left open: the worker ends anyway
                proxy.stop()
        # The cluster's data is thrown away: no need to wait for the API server to drain the watches still open.
        controlplane.down(folder, grace=1.0)
