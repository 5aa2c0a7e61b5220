"""The strict cluster's API server: kmock's Kubernetes emulator, made to behave like kube-apiserver where our
operator, kopf, kubectl and rank 0's progress hook look.

kmock stores objects and streams watch events. This subclass runs every resource request through the pipeline
of a real API server: authentication (bearer tokens, `auth`), RBAC authorisation (`auth`), then on writes the
admission of built-in objects (`admission`) or custom resources through their CRD (`crd`), and only then the
store. It also adds what the store of a real server does: server-filled metadata (uid, resourceVersion,
creationTimestamp, generation), the namespace from the URL (and 404 for a namespace that does not exist), JSON
merge and JSON patches, PUT with resourceVersion preconditions (409 Conflict when stale), status-subresource
isolation, the pods/binding subresource, labelSelector on lists, List kinds, ServiceAccount admission (a pod
naming a missing account is refused), a token minted for every ServiceAccount, cascade deletion through
ownerReferences (the garbage collector; optionally late, as the real one is asynchronous) and graceful pod
deletion: deleting a pod bound to a node marks it Terminating and removes it when its kubelet confirms (see
`kubelet`), never while its node is NotReady or gone; `gracePeriodSeconds=0` removes it at once.

It records every request as (verb, group, resource, namespace, user agent) so tests can count API calls, every
refusal by RBAC in `denied`, and every change as a `history` entry so tests can check what existed at the same
time. Strategic merge patches are applied as JSON merge patches (lists replaced, not merged by key).

`ClusterThread` runs it on a real TCP port in a background thread and writes kubeconfigs for it.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import datetime
import email.utils
import itertools
import json
import ssl
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import aiohttp.test_utils
import aiohttp.web
import attrs
import kmock
import yaml
from kmock._internal import enums
from kmock._internal import parsing as kmock_parsing

from paralleljob.k8s import timestamps
from tests.cluster import admission, auth, certificates, crd, statuses

REPO = Path(__file__).resolve().parents[2]
# The CRDs `paralleljob crd` generates: what an admin installs before running the operator.
PROJECT_CRDS = tuple(sorted((REPO / "crds").glob("*.yaml")))

# Built-in resources: (group, version, plural) -> (kind, namespaced, subresources).
BUILTIN: dict[tuple[str, str, str], tuple[str, bool, set[str]]] = {
    ("", "v1", "pods"): ("Pod", True, {"status", "binding"}),
    ("", "v1", "services"): ("Service", True, {"status"}),
    ("", "v1", "configmaps"): ("ConfigMap", True, set()),
    ("", "v1", "serviceaccounts"): ("ServiceAccount", True, set()),
    ("", "v1", "events"): ("Event", True, set()),
    ("", "v1", "nodes"): ("Node", False, {"status"}),
    ("", "v1", "namespaces"): ("Namespace", False, {"status"}),
    ("", "v1", "persistentvolumeclaims"): ("PersistentVolumeClaim", True, {"status"}),
    ("rbac.authorization.k8s.io", "v1", "roles"): ("Role", True, set()),
    ("rbac.authorization.k8s.io", "v1", "rolebindings"): ("RoleBinding", True, set()),
    ("rbac.authorization.k8s.io", "v1", "clusterroles"): ("ClusterRole", False, set()),
    ("rbac.authorization.k8s.io", "v1", "clusterrolebindings"): ("ClusterRoleBinding", False, set()),
    ("apps", "v1", "deployments"): ("Deployment", True, {"status"}),
    ("scheduling.k8s.io", "v1", "priorityclasses"): ("PriorityClass", False, set()),
    ("coordination.k8s.io", "v1", "leases"): ("Lease", True, set()),
    ("apiextensions.k8s.io", "v1", "customresourcedefinitions"): ("CustomResourceDefinition", False, {"status"}),
}
VERBS = {"get", "list", "watch", "create", "patch", "update", "delete"}
INITIAL_NAMESPACES = ("default", "kube-system", "kube-public")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: dicts merge recursively, null deletes, anything else replaces."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def json_patch(target: Any, operations: Sequence[Mapping[str, Any]]) -> Any:
    """RFC 6902 JSON patch: add, remove, replace and test (what clients send)."""
    result = copy.deepcopy(target)
    for op in operations:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in str(op.get("path", "")).split("/")[1:]]
        parent = result
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent[part]
        last = parts[-1]
        kind = op.get("op")
        if kind == "test":
            current = parent[int(last)] if isinstance(parent, list) else parent.get(last)
            if current != op.get("value"):
                raise statuses.APIError(422, "Invalid", f"the test operation on {op.get('path')} failed")
        elif kind == "remove":
            del parent[int(last) if isinstance(parent, list) else last]
        elif isinstance(parent, list):
            if last == "-":
                parent.append(op.get("value"))
            elif kind == "add":
                parent.insert(int(last), op.get("value"))
            else:
                parent[int(last)] = op.get("value")
        else:
            parent[last] = copy.deepcopy(op.get("value"))
    return result


def matches_selector(labels: Mapping[str, str], selector: str) -> bool:
    """Equality-based label selectors: `a=b`, `a==b`, `a!=b`, `a`, `!a`, comma-joined."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def matches_fields(obj: Mapping[str, Any], selector: str) -> bool:
    """Field selectors the API serves on every kind: `metadata.name=x`, `metadata.namespace=x`, and `!=`;
    plus pods' `spec.nodeName` and `status.phase`."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        negated = "!=" in term
        field, value = term.split("!=" if negated else "=", 1)
        node: Any = obj
        for part in field.lstrip("=").split("."):
            node = node.get(part) if isinstance(node, Mapping) else None
        if ((node or "") == value.lstrip("=")) == negated:
            return False
    return True


def status_response(code: int, reason: str, message: str) -> aiohttp.web.Response:
    return statuses.status_response(code, reason, message)


class Change(NamedTuple):
    """One entry of the server's history: what changed, and the fields tests replay."""

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


KMOCK_PARSE_PATH = kmock_parsing.parse_path


def _version_of(event: Mapping[str, Any]) -> int:
    return int((event["object"].get("metadata") or {}).get("resourceVersion") or 0)


def parse_path_with_namespace_lists(path: str) -> Any:
    """kmock's path parser, except that /api/v1/namespaces is the namespace list, not a namespaced prefix.

    kmock reads `namespaces` as the start of `/namespaces/<ns>/...` and fails (HTTP 500) on the bare list,
    which kopf requests when it watches listed namespaces. Installed only while a ClusterThread serves.
    """
    parts = path.strip("/").split("/")
    if parts == ["api", "v1", "namespaces"]:
        return kmock_parsing.ParsedPath("", "v1", "namespaces", None, None, None)
    if parts[:3] == ["api", "v1", "namespaces"] and (len(parts) == 4 or (len(parts) == 5 and parts[4] == "status")):
        # /api/v1/namespaces/<name>[/status] is the Namespace object itself.
        return kmock_parsing.ParsedPath("", "v1", "namespaces", None, parts[3], parts[4] if len(parts) == 5 else None)
    return KMOCK_PARSE_PATH(path)


def _verb(request: kmock.Request) -> str:
    """The RBAC verb of a request."""
    if request.action == enums.action.WATCH:
        return "watch"
    if request.method == enums.method.PUT:
        return "update"
    if request.method == enums.method.POST:
        return "create"
    if request.method == enums.method.DELETE:
        return "delete" if request.name else "deletecollection"
    if request.method == enums.method.PATCH:
        return "patch"
    return "get" if request.name else "list"


@attrs.define(kw_only=True)
class APIServer(kmock.KubernetesEmulator):
    """A KubernetesEmulator that refuses what kube-apiserver refuses, and stores what it would store."""

    calls: list[tuple[str, str, str, str, str]] = attrs.field(factory=list)
    # The 403 messages sent, in order: a least-privilege violation while the operator runs.
    denied: list[str] = attrs.field(factory=list)
    # Every ADDED/MODIFIED/DELETED, in order.
    history: list[Change] = attrs.field(factory=list)
    # Names of the pods deleted with gracePeriodSeconds=0 (a force delete: on a real cluster their
    # containers may still be running).
    force_deleted: list[str] = attrs.field(factory=list)
    # Seconds a request takes, by (verb, plural), e.g. ("create", "pods"): a slow API server.
    latency: dict[tuple[str, str], float] = attrs.field(factory=dict)
    # Requests answered only once their (verb, plural) leaves this set: an API server that stalls.
    held: set[tuple[str, str]] = attrs.field(factory=set)
    # Creates refused, by plural: (HTTP status, reason, message), e.g. an admission webhook or a quota.
    rejects: dict[str, tuple[int, str, str]] = attrs.field(factory=dict)
    # Plurals whose changes watch streams do not carry: the events a watch loses while it restarts.
    muted: set[str] = attrs.field(factory=set)
    # An operator killed mid-pass: after this many more requests from the operator (user agent
    # paralleljob-operator) every further one is answered 503, until it is set back to None.
    operator_outage_after: int | None = None
    # With this set, the last request before the outage is carried out but its answer is lost (503): the
    # process died after sending it, so a create or a delete took effect that the operator never learned of.
    operator_outage_loses_last_answer: bool = False
    # Seconds the phase-only kubelet takes to stop a deleted pod's containers before the pod object goes.
    termination_seconds: float = 0.2
    # Seconds before the garbage collector deletes the dependents of a deleted owner (0: at once).
    gc_delay: float = 0.0
    # CRDs installed at start, as an admin would before running the operator.
    crds: Sequence[Path] = ()
    tokens: auth.Tokens = attrs.field(factory=auth.Tokens)
    definitions: dict[tuple[str, str], crd.Definition] = attrs.field(factory=dict)
    # Called after every change (ADDED/MODIFIED/DELETED) with the plural, so a scheduler or kubelet can react.
    watchers: list[Callable[[str], None]] = attrs.field(factory=list)
    # The TCP port it serves on (set by ClusterThread), for kubelets that tell pods where the API is.
    port: int = 0
    # Creation order of objects by uid: the scheduler's queue is FIFO.
    created_order: dict[str, int] = attrs.field(factory=dict)
    # Set by a process kubelet: it confirms graceful deletions itself, when the processes have exited.
    kubelet_confirms_deletion: bool = False
    # Seconds this server's clock is ahead of the test machine's (negative: behind): every time it writes
    # (creationTimestamp, deletionTimestamp, condition transitions, the Date header) reads `clock()`.
    clock_offset: float = 0.0
    _versions: Any = attrs.field(factory=lambda: itertools.count(1))
    # How many changes per resource a watch from a resourceVersion can catch up on, as the real server's
    # watch cache keeps a window of them; a watch from an older version gets 410 Gone and lists again.
    watch_cache_events: int = 20_000
    # Each resource's recent changes as (resourceVersion, event), oldest first, and the newest version that
    # fell out of the window.
    _changes: dict[Any, collections.deque[tuple[int, dict[str, Any]]]] = attrs.field(
        factory=lambda: collections.defaultdict(collections.deque)
    )
    _forgotten: dict[Any, int] = attrs.field(factory=dict)
    authorizer: auth.Authorizer = attrs.field(init=False)
    # Live objects' store keys by (plural, namespace, name), and by plural in creation order: lookups for
    # RBAC, admission, the scheduler and kubelets stay O(1) with thousands of pods.
    _keys: dict[tuple[str, str, str], Any] = attrs.field(factory=dict)
    _plural_keys: dict[str, dict[Any, None]] = attrs.field(factory=dict)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.authorizer = auth.Authorizer(self.live_objects, self.lookup)
        for (group, version, plural), (kind, namespaced, subresources) in BUILTIN.items():
            self.resources[f"{group}/{version}/{plural}" if group else f"{version}/{plural}"] = kmock.ResourceInfo(
                kind=kind, namespaced=namespaced, verbs=VERBS, subresources=subresources
            )
        now = self.now()
        for name in INITIAL_NAMESPACES:
            self.store_directly(
                "",
                "v1",
                "namespaces",
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "creationTimestamp": now}},
            )
        for path in self.crds:
            self.store_directly(
                "apiextensions.k8s.io", "v1", "customresourcedefinitions", yaml.safe_load(path.read_text())
            )

    def clock(self) -> datetime.datetime:
        return datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=self.clock_offset)

    def now(self) -> str:
        """The server's present moment as it writes timestamps."""
        return timestamps.format_time(self.clock())

    # -- the store, for this package's components --------------------------------------------------------------

    def _resource(self, group: str, version: str, plural: str) -> Any:
        return kmock.resource(group, version, plural)

    def store_directly(self, group: str, version: str, plural: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Store an object without a request (the cluster's bootstrap), with server-filled metadata."""
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", self.now())
        meta.setdefault("generation", 1)
        self._stamp(obj)
        key = (self._resource(group, version, plural), meta.get("namespace"), meta["name"])
        self.objects[key] = obj
        self._index(key)
        self._after_create(plural, obj)
        return obj

    def _index(self, key: Any) -> None:
        plural = key[0].plural or ""
        self._keys[(plural, key[1] or "", key[2])] = key
        self._plural_keys.setdefault(plural, {})[key] = None

    def _unindex(self, key: Any) -> None:
        plural = key[0].plural or ""
        self._keys.pop((plural, key[1] or "", key[2]), None)
        self._plural_keys.get(plural, {}).pop(key, None)

    def live_objects(self, plural: str) -> list[dict[str, Any]]:
        return [self.objects[key].raw for key in self._plural_keys.get(plural, {})]

    def lookup(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        key = self._keys.get((plural, namespace, name))
        return dict(self.objects[key].raw) if key is not None else None

    def key_of(self, plural: str, namespace: str, name: str) -> Any:
        return self._keys.get((plural, namespace, name))

    async def add_unchecked(self, group: str, version: str, plural: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Store an object no admission saw (one written before a CRD rule existed), and tell watchers."""
        async with self._lock:
            stored = self.store_directly(group, version, plural, copy.deepcopy(obj))
            await self._emit(self._resource(group, version, plural), "ADDED", stored)
            return stored

    async def replace_stored(self, key: Any, obj: dict[str, Any]) -> None:
        """Store a new version of an existing object (for the scheduler and kubelets) and tell watchers."""
        self._stamp(obj)
        self.objects[key].create(obj)
        await self._emit(key[0], "MODIFIED", obj)

    # -- discovery -------------------------------------------------------------------------------------------

    async def _serve_version(self, request: kmock.Request) -> Any:
        payload = await super()._serve_version(request)
        if payload.get("groupVersion") == "/v1":
            payload["groupVersion"] = "v1"
        for resource in payload.get("resources") or []:
            if "/" in resource.get("name", ""):
                resource.pop("shortNames", None)  # a subresource has no short names of its own
        return payload

    # -- recording -------------------------------------------------------------------------------------

    def _record(self, request: kmock.Request) -> tuple[str, str, str, str, str]:
        assert request.resource is not None
        verb = _verb(request)
        plural = request.resource.plural or ""
        if request.subresource:
            plural = f"{plural}/{request.subresource}"
        agent = request.headers.get("User-Agent", "")
        call = (verb, request.resource.group or "", plural, request.namespace or "", agent)
        self.calls.append(call)
        return call

    # -- the pipeline ----------------------------------------------------------------------------------------

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        try:
            response = await self._answer(request)
        except aiohttp.web.HTTPException as refusal:  # kmock's own answers (a 404 of an unknown object) too
            refusal.headers["Date"] = self._date()
            raise
        finally:
            self._forget(request)
        if isinstance(response, aiohttp.web.StreamResponse) and not response.prepared:
            # What a client learns the server's time from (aiohttp would write its own clock's).
            response.headers["Date"] = self._date()
        return response

    def _date(self) -> str:
        """The Date header of every answer, from this server's clock, as a real API server sends it."""
        return email.utils.format_datetime(self.clock(), usegmt=True)

    def _forget(self, request: kmock.Request) -> None:
        """Drop an answered request from kmock's own record of every request. kmock finds a request's handler
        by scanning that record (`request in payload._source`), so a record that grows makes each request
        slower than the last: quadratic over a long test. Our own `calls` keeps what tests look at."""
        served = self._requests
        for index in range(len(served) - 1, -1, -1):
            if served[index] is request:
                del served[index]
                return

    async def _answer(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        try:
            user = self.tokens.user(request.headers.get("Authorization", ""))
            if user is None:
                raise auth.unauthorized()
            if request.resource is None or not request.resource.plural:
                return await super()._handle(request)  # discovery: open to every authenticated user
            verb, group, plural, namespace, agent = self._record(request)
            answer_lost = self._operator_killed(agent)
            response = await self._serve(request, user, verb, group, plural, namespace)
            if answer_lost and not response.prepared:
                raise statuses.APIError(503, "ServiceUnavailable", "the operator was killed awaiting this answer")
            return response
        except statuses.APIError as refusal:
            return refusal.response()

    def _operator_killed(self, agent: str) -> bool:
        """Count the operator's request against a planned outage: raise 503 once it has begun, and say
        whether this request is the last one, carried out with its answer lost."""
        if self.operator_outage_after is None or not agent.startswith("paralleljob-operator"):
            return False
        if self.operator_outage_after <= 0:
            raise statuses.APIError(503, "ServiceUnavailable", "the operator was killed here")
        self.operator_outage_after -= 1
        return self.operator_outage_after == 0 and self.operator_outage_loses_last_answer

    async def _serve(
        self, request: kmock.Request, user: auth.User, verb: str, group: str, plural: str, namespace: str
    ) -> aiohttp.web.StreamResponse:
        """Authorize, check and carry out one resource request."""
        attributes = auth.Attributes(verb, group, plural, namespace, request.name or "")
        if not self.authorizer.allows(user, attributes):
            refusal = auth.forbidden(user, attributes)
            self.denied.append(refusal.message)
            raise refusal
        await asyncio.sleep(self.latency.get((verb, plural), 0.0))
        while (verb, plural) in self.held:
            await asyncio.sleep(0.02)
        if "protobuf" in request.headers.get("Content-Type", ""):
            message = "the strict test cluster reads JSON only, not application/vnd.kubernetes.protobuf"
            raise statuses.APIError(415, "UnsupportedMediaType", message)
        if len(request.body or b"") > admission.REQUEST_MAX_BYTES:
            limit = admission.REQUEST_MAX_BYTES
            raise statuses.APIError(413, "RequestEntityTooLarge", f"Request entity too large: limit is {limit}")
        async with self._lock:
            if request.method == enums.method.POST and request.subresource == "binding":
                return await self._bind(request)
            if request.action == enums.action.CREATE:
                return await self._create(request, user)
            if request.method in (enums.method.PATCH, enums.method.PUT) and request.name:
                return await self._update(request, user)
            if request.action == enums.action.DELETE and request.name:
                return await self._delete(request)
        if request.action == enums.action.FETCH and request.subresource:
            return await self._fetch_subresource(request)
        if request.action == enums.action.WATCH:
            return await self._watch(request)
        if (
            request.action == enums.action.FETCH
            and request.name
            and self.key_of(plural, namespace, request.name) is None
        ):
            # The API server's own 404 (reason NotFound), not kmock's, which names no object and has no Date.
            raise statuses.not_found(plural, request.name, group)
        return await super()._handle(request)

    def _strict_fields(self, request: kmock.Request) -> bool:
        return str(request.params.get("fieldValidation", "")).lower() == "strict"

    def _definition(self, request: kmock.Request) -> crd.Definition | None:
        return self.definitions.get((request.resource.group or "", request.resource.plural or ""))

    def _kind(self, request: kmock.Request) -> str:
        info = self.resources.get(request.resource)
        return info.kind if info and info.kind else "Object"

    def _namespace_must_exist(self, request: kmock.Request) -> None:
        if request.namespace and self.lookup("namespaces", "", request.namespace) is None:
            raise statuses.not_found("namespaces", request.namespace)

    def _admit(
        self, request: kmock.Request, user: auth.User, obj: dict[str, Any], old: Mapping[str, Any] | None
    ) -> tuple[dict[str, Any], list[str]]:
        group, plural = request.resource.group or "", request.resource.plural or ""
        version = request.resource.version or ""
        obj.setdefault("apiVersion", f"{group}/{version}" if group else version)
        obj.setdefault("kind", self._kind(request))
        definition = self._definition(request)
        if definition is not None:
            return crd.admit(definition, obj, old, strict_fields=self._strict_fields(request))
        stored, warnings = admission.check_object(plural, group, obj, old, strict_fields=self._strict_fields(request))
        name = str(stored["metadata"].get("name") or "")
        if plural == "customresourcedefinitions" and (errors := crd.crd_errors(stored)):
            raise statuses.invalid(stored["kind"], group, name, errors)
        if plural in ("roles", "clusterroles", "rolebindings", "clusterrolebindings"):
            self.authorizer.check_escalation(user, plural, stored, request.namespace or "")
        if plural == "pods" and old is None:
            self._service_account_exists(stored)
        return stored, warnings

    def _service_account_exists(self, pod: Mapping[str, Any]) -> None:
        """The ServiceAccount admission plugin: a pod may only run as an account that exists."""
        namespace = pod["metadata"].get("namespace") or ""
        account = (pod.get("spec") or {}).get("serviceAccountName") or "default"
        if account != "default" and self.lookup("serviceaccounts", namespace, account) is None:
            raise statuses.APIError(
                403,
                "Forbidden",
                f'pods "{pod["metadata"].get("name")}" is forbidden: error looking up service account '
                f'{namespace}/{account}: serviceaccount "{account}" not found',
            )

    @staticmethod
    def _respond(body: Mapping[str, Any], code: int, warnings: Iterable[str]) -> aiohttp.web.Response:
        headers = [("Warning", f'299 - "{w}"') for w in warnings]
        response = aiohttp.web.json_response(dict(body), status=code)
        for name, value in headers:
            response.headers.add(name, value)
        return response

    # -- writes ----------------------------------------------------------------------------------------

    def _key(self, request: kmock.Request, name: str | None = None) -> tuple[Any, str | None, str]:
        return (request.resource, request.namespace, name or request.name or "")

    def _has_status(self, request: kmock.Request) -> bool:
        info = self.resources.get(request.resource)
        return bool(info and "status" in info.subresources)

    def _live(self, key: Any) -> dict[str, Any] | None:
        if key not in self.objects or self.objects[key].deleted:
            return None
        return copy.deepcopy(self.objects[key].raw)

    async def _emit(self, resource: Any, kind: str, obj: Mapping[str, Any]) -> None:
        self.history.append(Change.of(kind, resource.plural or "", obj))
        event = {"type": kind, "object": copy.deepcopy(dict(obj))}
        changes = self._changes[resource]
        changes.append((int((obj.get("metadata") or {}).get("resourceVersion") or 0), event))
        while len(changes) > self.watch_cache_events:
            self._forgotten[resource] = changes.popleft()[0]
        await self._buses[resource].put(event)
        for watcher in self.watchers:
            watcher(resource.plural or "")

    def _stamp(self, obj: dict[str, Any]) -> None:
        obj["metadata"]["resourceVersion"] = str(next(self._versions))

    async def _create(self, request: kmock.Request, user: auth.User) -> aiohttp.web.StreamResponse:
        body = copy.deepcopy(request.data if isinstance(request.data, dict) else {})
        meta = body.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if request.namespace:
            if meta.get("namespace") and meta["namespace"] != request.namespace:
                raise statuses.bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = request.namespace
        self._namespace_must_exist(request)
        key = self._key(request, meta.get("name"))
        if request.resource.plural in self.rejects:
            return status_response(*self.rejects[request.resource.plural])
        body, warnings = self._admit(request, user, body, None)
        if self._live(key) is not None:
            raise statuses.already_exists(request.resource.plural, meta["name"], request.resource.group or "")
        if self._has_status(request) and self._definition(request) is not None:
            body.pop("status", None)  # a custom resource's status is written through /status only
        for server_field in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds"):
            meta.pop(server_field, None)
        body["metadata"].update(uid=str(uuid.uuid4()), generation=1, creationTimestamp=self.now())
        self._stamp(body)
        self.created_order[body["metadata"]["uid"]] = len(self.created_order)
        if key in self.objects:
            self.objects[key].create(body)
        else:
            self.objects[key] = body
        self._index(key)
        self._after_create(request.resource.plural or "", body)
        await self._emit(request.resource, "ADDED", body)
        return self._respond(body, 201, warnings)

    def _after_create(self, plural: str, obj: Mapping[str, Any]) -> None:
        meta = obj["metadata"]
        if plural == "serviceaccounts":
            self.tokens.mint(meta.get("namespace") or "", meta["name"])
        elif plural == "customresourcedefinitions":
            self.register(crd.Definition.of(obj))

    def register(self, definition: crd.Definition) -> None:
        """Serve a CRD's resource: discovery lists it, writes go through its schema."""
        self.definitions[(definition.group, definition.plural)] = definition
        self.resources[f"{definition.group}/{definition.version}/{definition.plural}"] = kmock.ResourceInfo(
            kind=definition.kind,
            namespaced=definition.namespaced,
            verbs=VERBS,
            subresources={"status"} if definition.status_subresource else set(),
            singular=definition.singular,
            shortnames=set(definition.short_names),
        )

    def _patched(self, request: kmock.Request, current: dict[str, Any]) -> dict[str, Any]:
        """The object a PATCH or PUT asks for, before the subresource rules."""
        if request.method == enums.method.PUT:
            body = copy.deepcopy(request.data if isinstance(request.data, dict) else {})
            sent = (body.get("metadata") or {}).get("resourceVersion")
            if sent and sent != current["metadata"].get("resourceVersion"):
                raise statuses.conflict(request.resource.plural, request.name, request.resource.group or "")
            return body
        content_type = request.headers.get("Content-Type", "")
        if "apply-patch" in content_type:
            raise statuses.APIError(415, "UnsupportedMediaType", "server-side apply is not served by this test cluster")
        if isinstance(request.data, list):
            return json_patch(current, request.data)
        patch = request.data if isinstance(request.data, Mapping) else {}
        sent = (patch.get("metadata") or {}).get("resourceVersion")
        if sent and sent != current["metadata"].get("resourceVersion"):
            raise statuses.conflict(request.resource.plural, request.name, request.resource.group or "")
        return merge_patch(current, patch)

    async def _update(self, request: kmock.Request, user: auth.User) -> aiohttp.web.StreamResponse:
        key = self._key(request)
        current = self._live(key)
        if current is None:
            raise statuses.not_found(request.resource.plural, request.name, request.resource.group or "")
        if (definition := self._definition(request)) is not None:
            current = crd.read_back(definition, current)
        updated = self._patched(request, current)
        updated.setdefault("metadata", {})
        if request.subresource == "status":
            updated = {**current, "status": updated.get("status")}
            if updated["status"] is None:
                updated.pop("status")
        elif self._has_status(request):
            updated = {k: v for k, v in updated.items() if k != "status"}
            if "status" in current:
                updated["status"] = current["status"]
        for frozen in ("uid", "creationTimestamp", "namespace", "name", "generation", "deletionTimestamp"):
            if frozen in current["metadata"]:
                updated["metadata"][frozen] = current["metadata"][frozen]
        updated["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        updated, warnings = self._admit(request, user, updated, current)
        if updated == current:
            return self._respond(current, 200, warnings)  # no-op writes change nothing, not even the version
        if {k: v for k, v in updated.items() if k not in ("metadata", "status")} != {
            k: v for k, v in current.items() if k not in ("metadata", "status")
        }:
            updated["metadata"]["generation"] = int(current["metadata"].get("generation") or 1) + 1
        self._stamp(updated)
        self.objects[key].create(updated)
        if request.resource.plural == "customresourcedefinitions":
            self.register(crd.Definition.of(updated))
        await self._emit(request.resource, "MODIFIED", updated)
        return self._respond(updated, 200, warnings)

    async def _bind(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        """POST pods/<name>/binding: what a scheduler does to put a pod on a node."""
        key = self._key(request)
        current = self._live(key)
        if current is None:
            raise statuses.not_found("pods", request.name)
        target = ((request.data or {}).get("target") or {}).get("name")
        if not target:
            raise statuses.invalid("Binding", "", request.name, [statuses.FieldError("target.name", "Required value")])
        await self.bind(key, current, str(target))
        body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
        return aiohttp.web.json_response(body, status=201)

    async def bind(self, key: Any, pod: dict[str, Any], node: str) -> None:
        if (pod.get("spec") or {}).get("nodeName"):
            raise statuses.APIError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on pods/binding "{pod["metadata"]["name"]}": pod '
                f'{pod["metadata"]["name"]} is already assigned to node "{pod["spec"]["nodeName"]}"',
            )
        pod["spec"]["nodeName"] = node
        status = pod.setdefault("status", {})
        status.setdefault("phase", "Pending")
        conditions = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
        status["conditions"] = [
            *conditions,
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": self.now()},
        ]
        await self.replace_stored(key, pod)

    async def _delete(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        key = self._key(request)
        current = self._live(key)
        if current is None:
            raise statuses.not_found(request.resource.plural, request.name, request.resource.group or "")
        force = str(request.params.get("gracePeriodSeconds", "")) == "0"
        if force and request.resource.plural == "pods":
            self.force_deleted.append(str(request.name))
        return aiohttp.web.json_response(await self._delete_object(key, current, force=force))

    async def _delete_object(self, key: Any, current: dict[str, Any], *, force: bool = False) -> dict[str, Any]:
        """Delete as the API server does: a pod on a node first turns Terminating, anything else goes."""
        if key[0].plural != "pods" or not (current.get("spec") or {}).get("nodeName") or force:
            await self._remove(key, current)
            return current
        if current["metadata"].get("deletionTimestamp"):
            return current  # already terminating: a second graceful delete changes nothing
        grace = (current.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
        current["metadata"]["deletionTimestamp"] = self.now()
        current["metadata"]["deletionGracePeriodSeconds"] = grace
        self._stamp(current)
        self.objects[key].create(current)
        await self._emit(key[0], "MODIFIED", current)
        if not self.kubelet_confirms_deletion:
            asyncio.get_running_loop().call_later(self.termination_seconds, self._kubelet_confirms, key)
        return current

    def _kubelet_confirms(self, key: Any) -> None:
        asyncio.get_running_loop().create_task(self.finish_termination(key))

    async def finish_termination(self, key: Any, *, locked: bool = False) -> None:
        """The kubelet stopped the containers: the pod object goes, unless its node is dead."""
        if not locked:
            async with self._lock:
                return await self.finish_termination(key, locked=True)
        current = self._live(key)
        if current is None or not current["metadata"].get("deletionTimestamp"):
            return None
        if self.kubelet_alive(current["spec"]["nodeName"]):
            await self._remove(key, current)
        return None

    def kubelet_alive(self, node: str) -> bool:
        found = self.lookup("nodes", "", node)
        if found is None:
            return False
        conditions = (found.get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    async def _remove(self, key: Any, current: dict[str, Any]) -> None:
        self.objects[key].delete()
        self._unindex(key)
        self._stamp(current)  # the deletion is a change of its own, after every earlier one
        await self._emit(key[0], "DELETED", current)
        if key[0].plural == "serviceaccounts":
            self.tokens.revoke(key[1] or "", key[2])
        uid = current["metadata"].get("uid")
        if self.gc_delay:
            asyncio.get_running_loop().call_later(self.gc_delay, self._collect_later, uid)
        else:
            await self._collect(uid)

    def _collect_later(self, uid: str) -> None:
        asyncio.get_running_loop().create_task(self._collect_locked(uid))

    async def _collect_locked(self, uid: str) -> None:
        async with self._lock:
            await self._collect(uid)

    async def _collect(self, uid: str | None) -> None:
        """The garbage collector: dependents go with their owner (foreground details aside)."""
        for other_key, obj in list(self.objects.items()):
            if obj.deleted:
                continue
            owners = (obj.raw.get("metadata") or {}).get("ownerReferences") or []
            if any(ref.get("uid") == uid for ref in owners):
                await self._delete_object(other_key, copy.deepcopy(obj.raw))

    # -- reads -----------------------------------------------------------------------------------------

    async def _fetch_subresource(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        current = self._live(self._key(request))
        if current is None:
            raise statuses.not_found(request.resource.plural, request.name, request.resource.group or "")
        return aiohttp.web.json_response(current)

    def _wants_table(self, request: kmock.Request) -> crd.Definition | None:
        """The CRD whose printer columns answer this request, when the client asks for a Table (kubectl get)."""
        if "as=Table" not in request.headers.get("Accept", ""):
            return None
        return self._definition(request)

    async def _serve_fetch(self, request: kmock.Request) -> Any:
        found = await super()._serve_fetch(request)
        if (definition := self._wants_table(request)) is not None:
            return crd.table(definition, [found], str(found["metadata"].get("resourceVersion", "")))
        return found

    async def _watch(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        """A watch stream as kube-apiserver sends it: JSON lines under a JSON content type (kmock's stream is
        octet-stream, which kubectl refuses), filtered by labelSelector, with Table objects when asked."""
        definition = self._wants_table(request)
        selector = request.params.get("labelSelector") or ""
        fields = request.params.get("fieldSelector") or ""
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request._raw_request)
        since = str(request.params.get("resourceVersion") or "")
        stream = self._watch_since(request, int(since)) if since.isdigit() and since != "0" else None
        try:
            async for event in stream or self._serve_watch(request):
                obj = event.get("object") if isinstance(event, dict) else None
                if not isinstance(obj, dict) or request.resource.plural in self.muted:
                    continue
                if selector and not matches_selector((obj.get("metadata") or {}).get("labels") or {}, selector):
                    continue
                if fields and not matches_fields(obj, fields):
                    continue
                if definition is not None:
                    version = str((obj.get("metadata") or {}).get("resourceVersion", ""))
                    event = {**event, "object": crd.table(definition, [obj], version)}
                await response.write(json.dumps(event).encode() + b"\n")
        except ConnectionResetError:
            pass
        return response

    async def _watch_since(self, request: kmock.Request, since: int) -> Any:
        """A watch from a resourceVersion, as the real server serves it: every change after that version (a
        deletion between a client's list and its watch included), then the live ones; 410 Gone when that
        version is older than the changes kept."""
        bus = self._buses[request.resource]
        async with self._lock:  # no change lands between the backlog and the mark
            marker = await bus.mark()
            backlog = [event for version, event in self._changes[request.resource] if version > since]
            expired = since < self._forgotten.get(request.resource, 0)
        try:
            if expired:
                yield {
                    "type": "ERROR",
                    "object": statuses.status_body(410, "Expired", f"too old resource version: {since}"),
                }
                return
            last = since
            for event in backlog:
                last = _version_of(event)
                if self._in_scope(request, event):
                    yield event
            async for event in bus.stream(since=marker):
                if _version_of(event) > last and self._in_scope(request, event):
                    yield event
        finally:
            await bus.unmark(marker)

    @staticmethod
    def _in_scope(request: kmock.Request, event: Mapping[str, Any]) -> bool:
        return not request.namespace or (event["object"].get("metadata") or {}).get("namespace") == request.namespace

    async def _serve_list(self, request: kmock.Request) -> Any:
        listing = await super()._serve_list(request)
        selector = request.params.get("labelSelector")
        items = listing["items"]
        if selector:
            items = [i for i in items if matches_selector((i.get("metadata") or {}).get("labels") or {}, selector)]
        if fields := request.params.get("fieldSelector"):
            items = [i for i in items if matches_fields(i, fields)]
        info = self.resources.get(request.resource)
        group, version = request.resource.group, request.resource.version
        if (definition := self._wants_table(request)) is not None:
            return crd.table(definition, items, str(next(self._versions)))
        items, token = self._page(items, request.params.get("limit"), request.params.get("continue"))
        return {
            "apiVersion": f"{group}/{version}" if group else version,
            "kind": f"{info.kind if info and info.kind else 'Object'}List",
            "metadata": {"resourceVersion": str(next(self._versions)), **({"continue": token} if token else {})},
            "items": items,
        }

    @staticmethod
    def _page(items: list[Any], limit: str | None, token: str | None) -> tuple[list[Any], str | None]:
        """`limit` and `continue` as kube-apiserver pages a list: in key order, the token naming the last key
        served, so objects created or deleted between pages shift nothing."""
        if not limit or int(limit) <= 0:
            return items, None

        def key(item: Any) -> str:
            meta = item.get("metadata") or {}
            return f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"

        ordered = sorted((i for i in items if not token or key(i) > token), key=key)
        page = ordered[: int(limit)]
        return page, (key(page[-1]) if len(ordered) > len(page) else None)


class _LargeBodyServer(aiohttp.web.Server):
    """aiohttp's low-level server with kube-apiserver's body limit (aiohttp's own is 1 MiB, below the API's)."""

    def _make_request(self, message: Any, payload: Any, protocol: Any, writer: Any, task: Any) -> Any:
        limit = admission.REQUEST_MAX_BYTES + 1024 * 1024  # read past the limit, so the API's 413 can answer
        return aiohttp.web.BaseRequest(message, payload, protocol, writer, task, self._loop, client_max_size=limit)


class _HTTPServer(aiohttp.test_utils.RawTestServer):
    ssl_context: ssl.SSLContext | None = None

    async def start_server(self, **kwargs: Any) -> None:
        await super().start_server(ssl=self.ssl_context, **kwargs)

    async def _make_runner(self, debug: bool = True, **kwargs: Any) -> aiohttp.web.ServerRunner:
        server = _LargeBodyServer(self._handler, loop=self._loop, debug=debug, **kwargs)
        return aiohttp.web.ServerRunner(server, debug=debug, **kwargs)


@attrs.define
class HTTPServer(kmock.Server):
    """kmock's server on a real port, with TLS and the API's request size limit."""

    _server_cls: type[aiohttp.test_utils.RawTestServer] = _HTTPServer


class Controller:
    """A control loop of the cluster (the scheduler, a kubelet): woken whenever an object of one of `plurals`
    changes, it runs `sync` under the store's lock until stopped."""

    plurals: frozenset[str] = frozenset()

    def __init__(self, server: APIServer) -> None:
        self.server = server
        self._wake = asyncio.Event()
        server.watchers.append(self._changed)

    def _changed(self, plural: str) -> None:
        if plural in self.plurals:
            self._wake.set()

    async def sync(self) -> None:
        raise NotImplementedError

    async def run(self) -> None:
        self._wake.set()
        while True:
            await self._wake.wait()
            self._wake.clear()
            async with self.server._lock:
                await self.sync()

    def stop(self) -> None:
        self.server.watchers.remove(self._changed)


class ClusterThread:
    """The API server on 127.0.0.1:<port> in a background thread, with kubeconfigs for it.

    `components` are started on the server's loop once it serves (a scheduler, a kubelet): each is a callable
    taking the server and returning an object with an async `run()` and a `stop()`.
    """

    def __init__(
        self,
        workdir: Path,
        server_class: type[APIServer] = APIServer,
        *,
        crds: Sequence[Path] = PROJECT_CRDS,
        components: Sequence[Callable[[APIServer], Any]] = (),
        **options: Any,
    ) -> None:
        self.workdir = workdir
        self.server_class = server_class
        self.crds, self.options = crds, options
        self.component_factories = list(components)
        self.components: list[Any] = []
        self.loop = asyncio.new_event_loop()
        self.emulator: APIServer | None = None
        self.port = 0
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self.loop.run_until_complete, args=(self._serve(),), daemon=True)

    @property
    def server(self) -> APIServer:
        assert self.emulator is not None, "the cluster is not started"
        return self.emulator

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        async with (
            self.server_class(crds=self.crds, **self.options) as server,
            HTTPServer(server, server_cls=self._https_server()) as http,
        ):
            self.emulator = server
            self.port = server.port = int(http.url.port or 0)
            self.components = [factory(server) for factory in self.component_factories]
            tasks = [asyncio.create_task(component.run()) for component in self.components]
            self._ready.set()
            await self._stop.wait()
            for component in self.components:
                component.stop()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _https_server(self) -> type[_HTTPServer]:
        context = certificates.serving_certificates().server_context()
        return type("HTTPSServer", (_HTTPServer,), {"ssl_context": context})

    def start(self) -> ClusterThread:
        kmock_parsing.parse_path = parse_path_with_namespace_lists
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the Kubernetes API server did not start")
        self.write_kubeconfig(self.kubeconfig, "admin", self.server.tokens.admin_token)
        return self

    def stop(self) -> None:
        if self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(15)
        kmock_parsing.parse_path = KMOCK_PARSE_PATH

    def call(self, coroutine: Any, timeout: float = 30) -> Any:
        """Run a coroutine on the server's loop from the test's thread."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def ca(self) -> Path:
        """The CA that signed the server's certificate (ca.crt in a pod's ServiceAccount mount)."""
        return certificates.serving_certificates().ca

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig"

    def token_for(self, namespace: str, account: str) -> str:
        """The token minted for a ServiceAccount that exists."""
        return self.server.tokens.token_of(namespace, account)

    def kubeconfig_for(self, namespace: str, account: str) -> Path:
        """A kubeconfig that authenticates as the ServiceAccount `namespace/account`."""
        path = self.workdir / f"kubeconfig-{namespace}-{account}"
        self.write_kubeconfig(path, f"system:serviceaccount:{namespace}:{account}", self.token_for(namespace, account))
        return path

    def write_kubeconfig(self, path: Path, user: str, token: str) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "strict-cluster", "cluster": {"server": self.url, "certificate-authority": str(self.ca)}}
            ],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "strict-cluster", "context": {"cluster": "strict-cluster", "user": user}}],
            "current-context": "strict-cluster",
        }
        path.write_text(json.dumps(config))
