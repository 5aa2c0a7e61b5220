"""List-then-watch of one cluster-wide kind (Pods or Nodes), in a thread of its own, into a sink that keeps
only what the planner needs.

The operator starts one `Informer` for bound pods (feeding `planning.usage.UsageIndex`), one for Nodes
(feeding `handlers.nodes.NodeWatch`) and one for the pods of ParallelJobs (each event asks for a pass over
its job). Each lists in pages of `page_size` (so a listing of 50,000 pods is never
in memory at once: the sink turns each page into small records before the next is read), then watches from
the listing's resourceVersion with watch bookmarks, and lists again every `relist_seconds` to correct drift,
after a watch that expired (410 Gone), and after any error (with backoff). Pods are selected server-side
(bound, not finished), so neither unbound nor finished pods cross the wire; the sink checks again, so a server
that ignores field selectors (a test double) costs bytes, never a wrong count.

`synced` is set once the first listing is in: admission waits for it, so an operator that just started never
plans on an empty cluster. `on_change` is called (from this thread) when an event changed what the planner sees.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

import kubernetes

from paralleljob.k8s.session import Session, raw_json
from paralleljob.manifests import labels

log = logging.getLogger(__name__)

PAGE_SIZE = 500
RELIST_SECONDS = 600.0
WATCH_SECONDS = 300
FIRST_RETRY_SECONDS = 1.0
MAX_RETRY_SECONDS = 30.0


class Sink(Protocol):
    def replace(self, objects: Iterable[Mapping[str, Any]]) -> int:
        """Become exactly these objects; returns how many records changed."""
        ...

    def observe(self, event_type: str, obj: Mapping[str, Any]) -> bool:
        """Apply one watch event; True when it changes what the planner sees."""
        ...


@dataclasses.dataclass(frozen=True)
class Source:
    """One cluster-wide kind: the CoreV1Api list method and the server-side field and label selectors."""

    kind: str
    method: str
    field_selector: str | None = None
    label_selector: str | None = None

    def selectors(self) -> dict[str, str]:
        found = {"field_selector": self.field_selector, "label_selector": self.label_selector}
        return {key: value for key, value in found.items() if value}


# Bound pods that still run: the only ones that hold GPUs.
BOUND_PODS = Source(
    "pods", "list_pod_for_all_namespaces", "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
)
NODES = Source("nodes", "list_node")
# The pods of ParallelJobs (selected server-side: kopf would list and watch every pod of the cluster).
JOB_PODS = Source("pods", "list_pod_for_all_namespaces", label_selector=labels.JOB_LABEL)


class Expired(Exception):
    """The watch's resourceVersion is too old (410 Gone): list again."""


@dataclasses.dataclass
class Informer:
    session: Session
    source: Source
    sink: Sink
    on_change: Callable[[], None] = lambda: None
    page_size: int = PAGE_SIZE
    relist_seconds: float = RELIST_SECONDS
    watch_seconds: int = WATCH_SECONDS
    synced: threading.Event = dataclasses.field(default_factory=threading.Event)
    relists: int = 0
    drift: int = 0
    _stop: threading.Event = dataclasses.field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _response: Any = None

    def start(self) -> Informer:
        self._thread = threading.Thread(target=self._run, name=f"informer-{self.source.kind}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop at once: a watch blocked on the socket is woken by shutting the socket down (never `close()`,
        which waits for the reading thread's lock)."""
        self._stop.set()
        response = self._response
        if response is not None and hasattr(response, "shutdown"):
            response.shutdown()

    def _run(self) -> None:
        delay = FIRST_RETRY_SECONDS
        while not self._stop.is_set():
            try:
                version = self.relist()
                delay = FIRST_RETRY_SECONDS
                deadline = time.monotonic() + self.relist_seconds
                while not self._stop.is_set() and time.monotonic() < deadline:
                    version = self._watch(version, deadline)
            except Expired:
                log.info("%s watch expired; listing again", self.source.kind)
            except Exception as error:  # the API is down or the connection died: list again after a pause
                if self._stop.is_set():
                    return
                log.warning(
                    "%s informer: %s: %s; listing again in %.0fs", self.source.kind, type(error).__name__, error, delay
                )
                self._stop.wait(delay)
                delay = min(delay * 2, MAX_RETRY_SECONDS)

    def relist(self) -> str:
        """List every object into the sink (page by page); returns the listing's resourceVersion."""
        versions: list[str] = []
        drift = self.sink.replace(self._pages(versions))
        self.relists += 1
        if self.synced.is_set() and drift:
            log.info("%s relist corrected %d records", self.source.kind, drift)
            self.drift += drift
            self.on_change()
        self.synced.set()
        return versions[-1] if versions else ""

    def _pages(self, versions: list[str]) -> Iterator[Mapping[str, Any]]:
        """Every object, page by page; the listing's resourceVersion is appended to `versions`."""
        token: str | None = None
        while True:
            page = self._call(limit=self.page_size, _continue=token or None)
            metadata = page.get("metadata") or {}
            versions.append(str(metadata.get("resourceVersion") or ""))
            yield from page.get("items") or ()
            token = metadata.get("continue")
            if not token:
                return

    def _call(self, **kwargs: Any) -> dict[str, Any]:
        method = getattr(self.session.core, self.source.method)
        kwargs.update(self.source.selectors())
        try:
            response = method(**{k: v for k, v in kwargs.items() if v is not None}, **self.session.options)
        except kubernetes.client.ApiException as error:
            if error.status == 410:
                raise Expired from None
            raise
        return dict(raw_json(response) or {})

    def _watch(self, version: str, deadline: float) -> str:
        """Apply events until the server ends the watch or the relist is due; returns the last version seen."""
        seconds = max(1, min(self.watch_seconds, int(deadline - time.monotonic())))
        method = getattr(self.session.core, self.source.method)
        # Only the label selector: a pod leaving a field selector (Running -> Succeeded) must still reach the
        # sink, and a test API server may drop such an event where kube-apiserver sends DELETED.
        extra = {k: v for k, v in self.source.selectors().items() if k == "label_selector"}
        response = method(
            watch=True,
            resource_version=version or None,
            allow_watch_bookmarks=True,
            timeout_seconds=seconds,
            _preload_content=False,
            _request_timeout=(self.session.timeout[0], seconds + 30),
            **extra,
        )
        self._response = response
        try:
            for line in _lines(response):
                version = self._apply(json.loads(line), version)
                if self._stop.is_set() or time.monotonic() >= deadline:
                    break
        finally:
            self._response = None
            response.close()
        return version

    def _apply(self, event: Mapping[str, Any], version: str) -> str:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Expired
            raise RuntimeError(f"watch error: {obj.get('message') or obj}")
        if kind != "BOOKMARK" and self.sink.observe(str(kind), obj) and self.synced.is_set():
            self.on_change()
        return str((obj.get("metadata") or {}).get("resourceVersion") or version)


def _lines(response: Any) -> Iterator[bytes]:
    """The newline-delimited JSON lines of a watch response, as they arrive."""
    pending = b""
    for chunk in response.stream(1 << 16, decode_content=False):
        pending += chunk
        *lines, pending = pending.split(b"\n")
        yield from (line for line in lines if line.strip())
    if pending.strip():
        yield pending
