"""Faults the real API server does not offer, injected from outside it: a TLS proxy on loopback in front of
kube-apiserver that forwards every request as it is (the client's own bearer token, so authentication and
RBAC stay the server's) and streams every answer back, watches included, unless a fault says otherwise.

Faults (attributes of `FaultProxy`, safe to set from the test's thread):
- `outage_after`: after this many more requests from a user agent starting with `outage_agent` (the operator's,
  `paralleljob-operator`, by default), every further one is answered 503, as for an operator killed mid-pass;
  with `lose_last_answer`, the last request before the outage is carried out and its answer lost (503): the
  process died awaiting the reply to a write that took effect;
- `outage_after_request`: a (verb, resource) pair, e.g. ("patch", "configmaps"): the next such request from that
  agent is carried out and answered, and every later one is refused as by `outage_after` (the operator killed
  right after a given write, between it and the next one);
- `held`: (method, resource) pairs, e.g. ("POST", "configmaps"), whose requests wait until the pair is removed:
  an API server that stalls;
- `muted`: resources whose watch streams carry no events (the connection stays open): a watch that lost events;
- `clock_offset`: seconds added to every answer's `Date` header: a server whose clock is skewed;
- by RBAC verb and resource (`verb_of`; a subresource as "pods/binding"), for faults that must tell a list from
  a get or a status patch from a patch: `latency` (seconds a request waits before it is forwarded: a slow
  server), `held_verbs` (as `held`), and `rejects` (creates of a resource answered with this (HTTP status,
  reason, message) and never forwarded: an admission webhook or a quota that refuses).

A held request is in `holding` as (verb, resource, namespace) while it waits; `end_holds` (a test's end) lifts
every hold and delay and answers what they kept with 503, never sending it on. Every request is recorded in
`calls` as (method, resource, namespace, user agent, status), and in `requests` with its verb, group,
subresource, name, and whether it was a delete with `gracePeriodSeconds=0` (a force delete): in the lists of the
test it arrived in (`begin`), never in the next one's.
"""

from __future__ import annotations

import asyncio
import datetime
import email.utils
import json
import re
import ssl
import threading
from pathlib import Path
from typing import Any, NamedTuple

import aiohttp
import aiohttp.web
import yaml

from testcluster import controlplane, pki

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "upgrade"}
PATH = re.compile(r"^/(?:api/v1|apis/[^/]+/[^/]+)(?:/namespaces/(?P<namespace>[^/]+))?/(?P<resource>[^/]+)")


class Call(NamedTuple):
    method: str
    resource: str
    namespace: str
    agent: str
    status: int


def resource_of(path: str) -> tuple[str, str]:
    """(resource, namespace) of an API path; `/api/v1/namespaces/x` is the namespace x itself."""
    match = PATH.match(path)
    if match is None:
        return "", ""
    namespace, resource = match.group("namespace") or "", match.group("resource")
    if resource == "namespaces" or (namespace and path.rstrip("/").endswith(f"/namespaces/{namespace}")):
        return "namespaces", ""
    return resource, namespace


class Request(NamedTuple):
    """A request as RBAC sees it (the verb, the resource with its subresource), with the proxy's answer."""

    verb: str
    group: str
    resource: str
    namespace: str
    agent: str
    status: int
    name: str
    force: bool  # a delete with gracePeriodSeconds=0


ANY_PATH = re.compile(r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/[^/]+)(?P<rest>(?:/[^/]+)*)/?$")


def verb_of(method: str, path: str, watching: bool) -> tuple[str, str, str, str, str]:
    """(verb, group, resource[/subresource], namespace, name) of an API path, as RBAC names them; ("", ...)
    for discovery and other paths that name no resource."""
    match = ANY_PATH.match(path)
    parts = [p for p in (match.group("rest") if match else "").split("/") if p]
    if not match or not parts:
        return "", "", "", "", ""
    group, namespace = match.group("group") or "", ""
    if parts[0] == "namespaces" and len(parts) >= 3:
        namespace, parts = parts[1], parts[2:]
    resource = parts[0]
    name = parts[1] if len(parts) > 1 else ""
    if len(parts) > 2:
        resource = f"{resource}/{parts[2]}"
    if watching:
        verb = "watch"
    elif method == "GET":
        verb = "get" if name else "list"
    elif method == "DELETE":
        verb = "delete" if name else "deletecollection"
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, method.lower())
    return verb, group, resource, namespace, name


def _force(method: str, query: Any, body: bytes) -> bool:
    if method != "DELETE":
        return False
    if query.get("gracePeriodSeconds") == "0":
        return True
    try:
        return bool(body) and json.loads(body).get("gracePeriodSeconds") == 0
    except (ValueError, AttributeError):
        return False


def _message(body: bytes) -> str:
    try:
        return str(json.loads(body).get("message", ""))
    except (ValueError, AttributeError):
        return body.decode(errors="replace")


class FaultProxy:
    def __init__(self, state: controlplane.State) -> None:
        self.state = state
        self.calls: list[Call] = []
        self.outage_after: int | None = None
        self.outage_agent = "paralleljob-operator"
        self.lose_last_answer = False
        self.outage_after_request: tuple[str, str] | None = None
        self.held: set[tuple[str, str]] = set()
        self.muted: set[str] = set()
        self.clock_offset = 0.0
        self.requests: list[Request] = []
        self.denied: list[str] = []  # the message of every 403 the server answered
        self.latency: dict[tuple[str, str], float] = {}
        self.held_verbs: set[tuple[str, str]] = set()
        self.holding: list[tuple[str, str, str]] = []
        self.rejects: dict[str, tuple[int, str, str]] = {}
        # Moved on by `end_holds`: a request held across it is answered 503 here, never sent on.
        self.epoch = 0
        # Moved on by `begin`: a request that arrived in an earlier test is not recorded in this one's lists.
        self.test = 0
        self.port = 0
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._runner: aiohttp.web.AppRunner | None = None

    # -- lifecycle ----------------------------------------------------------------------------------------

    def start(self) -> FaultProxy:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the fault proxy did not start")
        return self

    def stop(self) -> None:
        if self._runner is not None:
            # The upstream session first: closing it ends the watches the proxy still relays, which the runner's
            # cleanup would otherwise wait out.
            asyncio.run_coroutine_threadsafe(self._upstream.close(), self.loop).result(10)
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)

    def kubeconfig_for(self, user: str, folder: Path) -> Path:
        """A kubeconfig of one of the cluster's users, through the proxy."""
        token = self.state.tokens[user]
        server = f"https://127.0.0.1:{self.port}"
        path = folder / f"kubeconfig-proxy-{user}"
        path.write_text(yaml.safe_dump(controlplane.kubeconfig_document(server, self.state.ca, user, token)))
        return path

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._serve())
        self._ready.set()
        self.loop.run_forever()

    async def _serve(self) -> None:
        keys = pki.Keys(self.state.folder / "pki")
        serving = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        serving.load_cert_chain(keys.serving_certificate, keys.serving_key)
        self._upstream = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=ssl.create_default_context(cafile=str(keys.ca)), limit=200),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            auto_decompress=False,
        )
        app = aiohttp.web.Application(client_max_size=8 * 2**20)
        app.router.add_route("*", "/{path:.*}", self._forward)
        # A second for the handlers still relaying at `stop` (aiohttp waits a minute by default).
        self._runner = aiohttp.web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = aiohttp.web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=serving)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    # -- forwarding ---------------------------------------------------------------------------------------

    def _date(self) -> str:
        moment = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=self.clock_offset)
        return email.utils.format_datetime(moment, usegmt=True)

    def _refusal(self, message: str, code: int = 503, reason: str = "ServiceUnavailable") -> aiohttp.web.Response:
        body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "reason": reason}
        return aiohttp.web.json_response(body | {"code": code}, status=code, headers={"Date": self._date()})

    def _outage(self, agent: str, verb: str, resource: str) -> tuple[bool, bool]:
        """(refuse now, this is the last request and its answer is lost)."""
        if not agent.startswith(self.outage_agent):
            return False, False
        if self.outage_after is None:
            if self.outage_after_request == (verb, resource):
                self.outage_after_request, self.outage_after = None, 0  # this one goes through, no later one
            return False, False
        if self.outage_after <= 0:
            return True, False
        self.outage_after -= 1
        return False, self.outage_after == 0 and self.lose_last_answer

    async def _forward(self, request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        agent = request.headers.get("User-Agent", "")
        resource, namespace = resource_of(request.path)
        watching = request.query.get("watch") in ("1", "true")
        verb, group, full_resource, _, name = verb_of(request.method, request.path, watching)
        body = await request.read()
        force = _force(request.method, request.query, body)
        arrived = self.test

        def record(status: int) -> None:
            if self.test != arrived:
                return  # an earlier test's request (delayed or held, or its answer late): not this test's
            self.calls.append(Call(request.method, resource, namespace, agent, status))
            self.requests.append(Request(verb, group, full_resource, namespace, agent, status, name, force))

        refuse, lose_answer = self._outage(agent, verb, full_resource)
        if refuse:
            record(503)
            return self._refusal("the operator was killed here")
        epoch = self.epoch
        await asyncio.sleep(self.latency.get((verb, full_resource), 0.0))
        await self._wait_while_held(request.method, resource, verb, full_resource, namespace)
        if self.epoch != epoch:
            record(503)
            return self._refusal("held until the test that held it ended")
        if verb == "create" and full_resource in self.rejects:
            code, reason, message = self.rejects[full_resource]
            record(code)
            return self._refusal(message, code, reason)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        url = self.state.server + request.path_qs
        # Only the client's own headers: aiohttp would add a Content-Type of its own to a body without one.
        forwarded = self._upstream.request(
            request.method, url, headers=headers, data=body or None, skip_auto_headers=("Content-Type",)
        )
        async with forwarded as upstream:
            record(upstream.status)
            if lose_answer:
                await upstream.read()
                return self._refusal("the operator was killed awaiting this answer")
            answer_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP}
            answer_headers["Date"] = self._date()
            if upstream.status == 403:  # a short Status: read whole, to keep its message
                refused = await upstream.read()
                if self.test == arrived:
                    self.denied.append(_message(refused))
                return aiohttp.web.Response(status=403, body=refused, headers=answer_headers)
            response = aiohttp.web.StreamResponse(status=upstream.status, headers=answer_headers)
            await response.prepare(request)
            try:
                async for chunk in self._chunks(upstream, watching):
                    if watching and resource in self.muted:
                        continue  # the stream stays open and carries nothing
                    await response.write(chunk)
                await response.write_eof()
            except ConnectionResetError:
                pass  # the client went away (a stopped operator's watch): nothing is left to answer
            return response

    def begin(self) -> None:
        """A test begins: nothing recorded yet, and a request of an earlier test answered from now on (one delayed
        by `latency`, held, or awaiting the server's answer when that test ended) is not recorded in this one's
        `calls`, `requests` or `denied`."""
        self.test += 1
        self.calls.clear()
        self.requests.clear()
        self.denied.clear()

    def end_holds(self) -> None:
        """Lift every hold and delay without sending on what they kept: a request held or delayed until now is
        answered 503 (its client is a test's operator, stopped or about to be), never sent to the server, where
        the next test would meet it."""
        self.epoch += 1
        self.held.clear()
        self.held_verbs.clear()
        self.latency.clear()

    async def _wait_while_held(self, method: str, resource: str, verb: str, full_resource: str, namespace: str) -> None:
        def held() -> bool:
            return (method, resource) in self.held or (verb, full_resource) in self.held_verbs

        if not held():
            return
        waiting = (verb, full_resource, namespace)
        self.holding.append(waiting)
        try:
            while held():
                await asyncio.sleep(0.05)
        finally:
            self.holding.remove(waiting)

    async def _chunks(self, upstream: aiohttp.ClientResponse, by_line: bool) -> Any:
        """The answer's body as it arrives; a watch's one event (line) at a time, so muting drops whole events."""
        if by_line:
            while line := await upstream.content.readline():
                yield line
        else:
            async for chunk in upstream.content.iter_any():
                yield chunk
