"""kmock's Kubernetes emulator, hardened into a small API server good enough for kopf and our client.

kmock stores objects and streams watch events; this subclass adds what a real kube-apiserver does and the
operator relies on: server-filled metadata (uid, resourceVersion,
creationTimestamp, generation), the namespace from the URL, AlreadyExists/NotFound with standard reasons,
JSON merge patch (null deletes), status-subresource isolation, labelSelector on lists, List kinds,
`GET /api/v1/namespaces` (kmock's path parser answers 500 to it), core discovery's groupVersion ("v1", not
"/v1", which kubectl needs), cascade deletion through ownerReferences (the garbage collector's job; optionally
late, as the real one is asynchronous), and graceful pod deletion: deleting a pod bound to a node marks it
Terminating (deletionTimestamp) and removes it only after `termination_seconds`, the kubelet's job, and never
while its node is NotReady or gone (a dead kubelet confirms nothing); `gracePeriodSeconds=0` removes it at once.
It records every request as (verb, group, resource, namespace, user agent) so tests can count API calls and the
chart's RBAC can be checked against what the operator really does, and every change as a `history` entry so
tests can check what existed at the same time.

`EmulatorThread` runs it on a real TCP port in a background thread and writes a kubeconfig for it.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import threading
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import aiohttp.web
import attrs
import kmock
from kmock._internal import enums
from kmock._internal import parsing as kmock_parsing

from paralleljob.api import types as api_types
from paralleljob.k8s import timestamps

CORE = {
    "pods": ("Pod", True, {"status"}),
    "services": ("Service", True, {"status"}),
    "configmaps": ("ConfigMap", True, set()),
    "serviceaccounts": ("ServiceAccount", True, set()),
    "events": ("Event", True, set()),
    "nodes": ("Node", False, {"status"}),
    "namespaces": ("Namespace", False, {"status"}),
}
RBAC = {"roles": ("Role", True, set()), "rolebindings": ("RoleBinding", True, set())}
VERBS = {"get", "list", "watch", "create", "patch", "update", "delete"}


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


def status_response(code: int, reason: str, message: str) -> aiohttp.web.Response:
    body = {
        "apiVersion": "v1",
        "kind": "Status",
        "metadata": {},
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    }
    return aiohttp.web.json_response(body, status=code)


class Change(NamedTuple):
    """One entry of the emulator's history: what changed, and the fields tests replay."""

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


def parse_path_with_namespace_lists(path: str) -> Any:
    """kmock's path parser, except that /api/v1/namespaces is the namespace list, not a namespaced prefix.

    kmock reads `namespaces` as the start of `/namespaces/<ns>/...` and fails (HTTP 500) on the bare list,
    which kopf requests when it watches listed namespaces. Installed only while an EmulatorThread serves.
    """
    if path.strip("/").split("/") == ["api", "v1", "namespaces"]:
        return kmock_parsing.ParsedPath("", "v1", "namespaces", None, None, None)
    return KMOCK_PARSE_PATH(path)


@attrs.define(kw_only=True)
class HardenedEmulator(kmock.KubernetesEmulator):
    """A KubernetesEmulator that behaves like an API server where our operator and kopf look."""

    calls: list[tuple[str, str, str, str, str]] = attrs.field(factory=list)
    # Every ADDED/MODIFIED/DELETED, in order.
    history: list[Change] = attrs.field(factory=list)
    # Names of the pods deleted with gracePeriodSeconds=0 (a force delete: on a real cluster their
    # containers may still be running).
    force_deleted: list[str] = attrs.field(factory=list)
    # Seconds a request takes, by (verb, plural), e.g. ("create", "pods"): a slow API server.
    latency: dict[tuple[str, str], float] = attrs.field(factory=dict)
    # Creates refused, by plural: (HTTP status, reason, message), e.g. an admission webhook or a quota.
    rejects: dict[str, tuple[int, str, str]] = attrs.field(factory=dict)
    # Seconds the kubelet takes to stop a deleted pod's containers before the pod object goes.
    termination_seconds: float = 0.2
    # Seconds before the garbage collector deletes the dependents of a deleted owner (0: at once).
    gc_delay: float = 0.0
    _versions: Any = attrs.field(factory=lambda: itertools.count(1))

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for plural, (kind, namespaced, subresources) in CORE.items():
            self.resources[f"v1/{plural}"] = kmock.ResourceInfo(
                kind=kind, namespaced=namespaced, verbs=VERBS, subresources=subresources
            )
        for plural, (kind, namespaced, subresources) in RBAC.items():
            self.resources[f"rbac.authorization.k8s.io/v1/{plural}"] = kmock.ResourceInfo(
                kind=kind, namespaced=namespaced, verbs=VERBS, subresources=subresources
            )
        self.resources[f"{api_types.API_VERSION}/{api_types.PLURAL}"] = kmock.ResourceInfo(
            kind=api_types.KIND,
            namespaced=True,
            verbs=VERBS,
            subresources={"status"},
            singular=api_types.SINGULAR,
            shortnames=set(api_types.SHORT_NAMES),
        )

    async def _serve_version(self, request: kmock.Request) -> Any:
        payload = await super()._serve_version(request)
        if payload.get("groupVersion") == "/v1":
            payload["groupVersion"] = "v1"
        return payload

    # -- recording -------------------------------------------------------------------------------------

    def _record(self, request: kmock.Request) -> tuple[str, str, str, str, str]:
        assert request.resource is not None
        verb = {
            enums.action.LIST: "list",
            enums.action.WATCH: "watch",
            enums.action.FETCH: "get",
            enums.action.CREATE: "create",
            enums.action.UPDATE: "patch",
            enums.action.DELETE: "delete",
        }.get(request.action, str(request.method).lower())
        plural = request.resource.plural or ""
        if request.subresource:
            plural = f"{plural}/{request.subresource}"
        agent = request.headers.get("User-Agent", "")
        call = (verb, request.resource.group or "", plural, request.namespace or "", agent)
        self.calls.append(call)
        return call

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
        await self._buses[resource].put({"type": kind, "object": copy.deepcopy(dict(obj))})

    def _stamp(self, obj: dict[str, Any]) -> None:
        obj["metadata"]["resourceVersion"] = str(next(self._versions))

    async def _create(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        body = copy.deepcopy(request.data or {})
        meta = body.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if request.namespace:
            meta["namespace"] = request.namespace
        key = self._key(request, meta.get("name"))
        if request.resource.plural in self.rejects:
            return status_response(*self.rejects[request.resource.plural])
        if self._live(key) is not None:
            return status_response(409, "AlreadyExists", f'{request.resource.plural} "{meta["name"]}" already exists')
        meta.update(
            uid=str(uuid.uuid4()),
            generation=1,
            creationTimestamp=timestamps.now(),
        )
        self._stamp(body)
        if key in self.objects:
            self.objects[key].create(body)
        else:
            self.objects[key] = body
        await self._emit(request.resource, "ADDED", body)
        return aiohttp.web.json_response(body, status=201)

    async def _patch(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        key = self._key(request)
        current = self._live(key)
        if current is None:
            return status_response(404, "NotFound", f'{request.resource.plural} "{request.name}" not found')
        patch = request.data if isinstance(request.data, Mapping) else {}
        if request.subresource == "status":
            patch = {"status": patch.get("status")} if "status" in patch else {}
        elif self._has_status(request):
            patch = {k: v for k, v in patch.items() if k != "status"}
        updated = merge_patch(current, patch)
        for frozen in ("uid", "creationTimestamp", "namespace", "name", "generation"):
            updated["metadata"][frozen] = current["metadata"].get(frozen)
        if updated == current:
            return aiohttp.web.json_response(current)  # no-op patches change nothing, not even the version
        if updated.get("spec") != current.get("spec"):
            updated["metadata"]["generation"] = int(current["metadata"].get("generation") or 1) + 1
        self._stamp(updated)
        self.objects[key].create(updated)
        await self._emit(request.resource, "MODIFIED", updated)
        return aiohttp.web.json_response(updated)

    async def _delete(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        key = self._key(request)
        current = self._live(key)
        if current is None:
            return status_response(404, "NotFound", f'{request.resource.plural} "{request.name}" not found')
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
        current["metadata"]["deletionTimestamp"] = timestamps.now()
        current["metadata"]["deletionGracePeriodSeconds"] = grace
        self._stamp(current)
        self.objects[key].create(current)
        await self._emit(key[0], "MODIFIED", current)
        asyncio.get_running_loop().call_later(self.termination_seconds, self._kubelet_confirms, key)
        return current

    def _kubelet_confirms(self, key: Any) -> None:
        asyncio.get_running_loop().create_task(self._finish_termination(key))

    async def _finish_termination(self, key: Any) -> None:
        """The kubelet stopped the containers: the pod object goes, unless its node is dead."""
        async with self._lock:
            current = self._live(key)
            if current is None or not current["metadata"].get("deletionTimestamp"):
                return
            if self._kubelet_alive(current["spec"]["nodeName"]):
                await self._remove(key, current)

    def _kubelet_alive(self, node: str) -> bool:
        found = next(
            (obj for (res, _, name), obj in self.objects.items() if res.plural == "nodes" and name == node), None
        )
        if found is None or found.deleted:
            return False
        conditions = (found.raw.get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    async def _remove(self, key: Any, current: dict[str, Any]) -> None:
        self.objects[key].delete()
        await self._emit(key[0], "DELETED", current)
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

    async def _serve_list(self, request: kmock.Request) -> Any:
        if request.resource is not None and request.resource.plural == "namespaces" and request.name is None:
            names = {ns for (_, ns, _), obj in self.objects.items() if ns and not obj.deleted} | {"default"}
            items = [{"metadata": {"name": n}} for n in sorted(names)]
            return {"apiVersion": "v1", "kind": "NamespaceList", "metadata": {}, "items": items}
        listing = await super()._serve_list(request)
        selector = request.params.get("labelSelector")
        items = listing["items"]
        if selector:
            items = [i for i in items if matches_selector((i.get("metadata") or {}).get("labels") or {}, selector)]
        info = self.resources.get(request.resource)
        group, version = request.resource.group, request.resource.version
        return {
            "apiVersion": f"{group}/{version}" if group else version,
            "kind": f"{info.kind if info and info.kind else 'Object'}List",
            "metadata": {"resourceVersion": str(next(self._versions))},
            "items": items,
        }

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        if request.resource is None:
            return await super()._handle(request)
        verb, _, plural, *_ = self._record(request)
        await asyncio.sleep(self.latency.get((verb, plural), 0.0))
        async with self._lock:
            if request.action == enums.action.CREATE:
                return await self._create(request)
            if request.action == enums.action.UPDATE and request.name:
                return await self._patch(request)
            if request.action == enums.action.DELETE and request.name:
                return await self._delete(request)
        return await super()._handle(request)


class EmulatorThread:
    """The hardened emulator on 127.0.0.1:<port> in a background thread, with a kubeconfig for it."""

    def __init__(self, workdir: Path, emulator_class: type[HardenedEmulator] = HardenedEmulator) -> None:
        self.workdir = workdir
        self.emulator_class = emulator_class
        self.loop = asyncio.new_event_loop()
        self.emulator: HardenedEmulator | None = None
        self.port = 0
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self.loop.run_until_complete, args=(self._serve(),), daemon=True)

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        async with self.emulator_class() as emulator, kmock.Server(emulator) as server:
            self.emulator = emulator
            self.port = server.url.port
            self._ready.set()
            await self._stop.wait()

    def start(self) -> EmulatorThread:
        kmock_parsing.parse_path = parse_path_with_namespace_lists
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the Kubernetes emulator did not start")
        self.kubeconfig.write_text(json.dumps(self._kubeconfig()))
        return self

    def stop(self) -> None:
        if self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
        kmock_parsing.parse_path = KMOCK_PARSE_PATH

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig"

    def _kubeconfig(self) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "emulator", "cluster": {"server": self.url}}],
            "users": [{"name": "tester", "user": {"token": "test"}}],
            "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "tester"}}],
            "current-context": "emulator",
        }
