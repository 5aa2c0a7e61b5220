"""kmock's Kubernetes emulator, hardened into a small API server good enough for kopf and our client.

kmock stores objects and streams watch events; this subclass adds what a real kube-apiserver does and the
operator relies on (see /work/shared/reference/toolbox.md): server-filled metadata (uid, resourceVersion,
creationTimestamp, generation), the namespace from the URL, AlreadyExists/NotFound with standard reasons,
JSON merge patch (null deletes), status-subresource isolation, labelSelector on lists, List kinds,
`GET /api/v1/namespaces` (kmock's path parser answers 500 to it), core discovery's groupVersion ("v1", not
"/v1", which kubectl needs), and cascade deletion through ownerReferences (the garbage collector's job).
It also records every request as (verb, group, resource, namespace, user agent) so tests can count API calls and the
chart's RBAC can be checked against what the operator really does.

`EmulatorThread` runs it on a real TCP port in a background thread and writes a kubeconfig for it.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import itertools
import json
import threading
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp.web
import attrs
import kmock
from kmock._internal import enums
from kmock._internal import parsing as kmock_parsing

from paralleljob.api import crd as api_crd
from paralleljob.api import types as api_types

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
    # Seconds each create of a resource (by plural) takes, to hold a test's window open (a slow API server).
    create_latency: dict[str, float] = attrs.field(factory=dict)
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

    def _record(self, request: kmock.Request) -> None:
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
        self.calls.append((verb, request.resource.group or "", plural, request.namespace or "", agent))

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
        if self._live(key) is not None:
            return status_response(409, "AlreadyExists", f'{request.resource.plural} "{meta["name"]}" already exists')
        meta.update(
            uid=str(uuid.uuid4()),
            generation=1,
            creationTimestamp=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
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
        await self._remove(key, current)
        return aiohttp.web.json_response(current)

    async def _remove(self, key: Any, current: dict[str, Any]) -> None:
        self.objects[key].delete()
        await self._emit(key[0], "DELETED", current)
        uid = current["metadata"].get("uid")
        # The garbage collector: dependents go with their owner (foreground details aside).
        for other_key, obj in list(self.objects.items()):
            if obj.deleted:
                continue
            owners = (obj.raw.get("metadata") or {}).get("ownerReferences") or []
            if any(ref.get("uid") == uid for ref in owners):
                await self._remove(other_key, copy.deepcopy(obj.raw))

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
        self._record(request)
        if request.action == enums.action.CREATE:
            await asyncio.sleep(self.create_latency.get(request.resource.plural or "", 0.0))
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

    def register_crd(self) -> None:
        """Nothing to do: the ParallelJob resource is declared by the emulator (kept for readability)."""
        assert api_crd.build_crd()["spec"]["names"]["plural"] == api_types.PLURAL
