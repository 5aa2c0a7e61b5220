"""The in-pod supervisors' coordinator: node rank 0's small shared state of the gang, and every node's client.

Node rank 0's supervisor serves a `GangState` over HTTP (JSON) on the job's rendezvous port: the generation the
gang runs, which nodes are ready for it, which have finished, and whether the gang gave up. Supervisors
long-poll it (`wait`) so that a new generation reaches every node at once. `paralleljob_contract.supervisor`
owns when the generation moves on; this module only keeps and serves the state. Standard library only.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from paralleljob_contract import peers

POLL_SECONDS = 0.2
# The longest a long poll of the coordinator is held.
MAX_WAIT_SECONDS = 10.0
# How long a supervisor waits for the coordinator (node rank 0's pod) before it takes the node as lost.
COORDINATOR_TIMEOUT_SECONDS = 60.0
# How often node rank 0 looks for peers that stopped answering (`paralleljob_contract.peers`).
PEER_CHECK_SECONDS = 1.0
# How long a request's thread waits on a caller that stops sending (its socket timeout).
REQUEST_TIMEOUT_SECONDS = 5.0


def log(node_rank: int, message: str) -> None:
    print(f"paralleljob-supervisor[node {node_rank}]: {message}", file=sys.stderr, flush=True)


@dataclasses.dataclass
class GangState:
    """What the nodes agree on: the generation they run, who is ready for it, who finished, and whether the
    gang gave up (`failed`, with the reason)."""

    nodes: int
    in_place_restarts: int
    generation: int = 0
    ready: dict[int, set[int]] = dataclasses.field(default_factory=dict)
    finished: set[int] = dataclasses.field(default_factory=set)
    failed: str | None = None
    reasons: list[str] = dataclasses.field(default_factory=list)
    # When each node rank last sent a request, and its node's name (time.monotonic()), and when the current
    # generation began: what `peers.not_answering` reads.
    last_seen: dict[int, float] = dataclasses.field(default_factory=dict)
    names: dict[int, str] = dataclasses.field(default_factory=dict)
    generation_since: float = dataclasses.field(default_factory=time.monotonic)

    def heard_from(self, node: int, name: str) -> None:
        self.last_seen[node] = time.monotonic()
        if name:
            self.names[node] = name

    def not_answering(self) -> dict[int, float]:
        """The node ranks that stopped answering (`peers.not_answering`), with seconds since last heard."""
        ready = self.ready.get(self.generation, set())
        args = (self.nodes, self.last_seen, ready, self.finished, self.generation, self.generation_since)
        return peers.not_answering(*args, time.monotonic())

    def report_failure(self, generation: int, node: int, reason: str, permanent: bool) -> None:
        """A rank of `node` failed in `generation`: restart in place while the budget lasts, else give up.
        A report from an older generation is about a failure already acted on."""
        if self.failed is not None or generation != self.generation:
            return
        if permanent or self.generation >= self.in_place_restarts:
            spent = "" if permanent else f" (in-place restarts spent: {self.in_place_restarts})"
            self.failed = f"node {node}: {reason}{spent}"
            return
        self.generation += 1
        self.generation_since = time.monotonic()
        self.reasons.append(f"node {node}: {reason}")
        # The one line per in-place restart, in node rank 0's log, that `paralleljob run` reads (IN_PLACE_LINE).
        log(0, f"in-place restart {self.generation}/{self.in_place_restarts}: node {node}: {reason}")

    def report_ready(self, generation: int, node: int) -> None:
        self.ready.setdefault(generation, set()).add(node)

    def settled(self, path: str, generation: int) -> bool:
        """What a long poll at `generation` waits for: the gang gave up or moved on, and for `/ready` every
        node ready, for `/state` every node finished."""
        if self.failed is not None or self.generation != generation:
            return True
        if path == "/ready":
            return len(self.ready.get(generation, ())) >= self.nodes
        return len(self.finished) >= self.nodes

    def view(self, generation: int) -> dict[str, Any]:
        return {
            "generation": self.generation,
            "ready": len(self.ready.get(generation, ())),
            "nodes": self.nodes,
            "finished": len(self.finished),
            "failed": self.failed,
            "reasons": self.reasons,
        }


class Coordinator:
    """Serves a GangState over HTTP on (host, port), in a thread of node rank 0's supervisor; with
    `report_peers`, calls it with the `lostPeers` report (`peers.encode`) each time the report changes."""

    def __init__(
        self, state: GangState, host: str, port: int, report_peers: Callable[[str], None] | None = None
    ) -> None:
        self.state = state
        changed = threading.Condition()
        self.changed = changed

        self.closed = threading.Event()
        closed = self.closed

        class Handler(BaseHTTPRequestHandler):
            # A caller that stops sending mid-request holds its thread (and close()) this long at most.
            timeout = REQUEST_TIMEOUT_SECONDS

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
                with changed:
                    answer = apply_request(state, self.path, body)
                    changed.notify_all()
                    # A long poll: held until what the caller waits for happens, so that hundreds of nodes
                    # learn of a new generation at once without polling node rank 0 several times a second.
                    wait = min(float(body.get("wait", 0)), MAX_WAIT_SECONDS)
                    if wait > 0:
                        generation = int(body.get("generation", 0))
                        settled = lambda: closed.is_set() or state.settled(self.path, generation)  # noqa: E731
                        changed.wait_for(settled, timeout=wait)
                        answer = state.view(generation)
                payload = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = _Server((host, port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, name="coordinator", daemon=True)
        self.thread.start()
        self.watch: threading.Thread | None = None
        if report_peers is not None:
            self.watch = threading.Thread(target=self.watch_peers, args=(report_peers,), name="peers", daemon=True)
            self.watch.start()

    def watch_peers(self, report: Callable[[str], None]) -> None:
        """Report the peers not answering whenever they change ("[]" first, so that no report of an earlier
        gang stays in the channel); a report that raises is logged and tried again on the next change."""
        sent: list[int] | None = None
        while not self.closed.wait(0 if sent is None else PEER_CHECK_SECONDS):
            with self.changed:
                quiet = self.state.not_answering()
                text = peers.encode(quiet, self.state.names)
            if sorted(quiet) == sent:  # the same nodes: their growing silence is not news
                continue
            sent = sorted(quiet)
            try:
                report(text)
            except Exception as error:  # reporting must never cost the gang its coordinator
                log(0, f"could not report the peers not answering ({type(error).__name__}: {error})")
            if quiet:
                log(0, f"peers not answering: {text}")

    def close(self) -> None:
        """Stop serving: the long polls in flight are answered now, and every request's thread has ended when
        this returns, so that none is left writing to stderr while the interpreter exits."""
        self.closed.set()
        with self.changed:
            self.changed.notify_all()
        self.server.shutdown()
        self.server.server_close()  # joins the request threads (_Server.block_on_close)
        if self.watch is not None:  # a report in flight may log when it ends: let it, before the exit
            self.watch.join(timeout=REQUEST_TIMEOUT_SECONDS)


class _Server(ThreadingHTTPServer):
    """The coordinator's server. Its request threads are joined on close rather than left as daemon threads: a
    daemon thread still answering at interpreter exit (a traceback half written to stderr) aborted node rank 0's
    supervisor ("Fatal Python error: _enter_buffered_busy"), failing a job that had trained to its last step."""

    daemon_threads = False
    block_on_close = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A caller that has gone (its node finished or died with a long poll in flight) needs no answer; any
        other error is one line in node rank 0's log, not a traceback."""
        error = sys.exc_info()[1]
        if isinstance(error, ConnectionError):
            return
        log(0, f"coordinator: a request from {client_address[0]} failed ({type(error).__name__}: {error})")


def apply_request(state: GangState, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """One request to the coordinator: `/fail`, `/ready`, `/finished` or `/state`; the answer is the state."""
    generation, node = int(body.get("generation", 0)), int(body.get("node", -1))
    state.heard_from(node, str(body.get("nodeName") or ""))
    if path == "/fail":
        state.report_failure(generation, node, str(body.get("reason", "")), bool(body.get("permanent")))
    elif path == "/ready":
        state.report_ready(generation, node)
    elif path == "/finished":
        state.finished.add(node)
    return state.view(generation)


class CoordinatorClient:
    """A supervisor's view of the coordinator; `post` raises OSError when it cannot be reached."""

    def __init__(self, host: str, port: int, node_rank: int, node_name: str = "") -> None:
        self.url = f"http://{host}:{port}"
        self.host, self.port = host, port
        self.node_rank, self.node_name = node_rank, node_name
        # The coordinator's last answer.
        self.last: dict[str, Any] = {}

    def post(self, path: str, generation: int, **fields: Any) -> dict[str, Any]:
        sender = {"generation": generation, "node": self.node_rank, "nodeName": self.node_name}
        body = json.dumps({**sender, **fields}).encode()
        request = urllib.request.Request(self.url + path, data=body, method="POST")
        request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=10 + float(fields.get("wait", 0))) as answer:
            result: dict[str, Any] = json.loads(answer.read())
        self.last = result
        return result

    def post_patiently(self, path: str, generation: int, **fields: Any) -> dict[str, Any]:
        """`post`, retried while the coordinator is starting or briefly unreachable; OSError after the
        coordinator timeout (its pod is gone)."""
        deadline = time.monotonic() + COORDINATOR_TIMEOUT_SECONDS
        while True:
            try:
                return self.post(path, generation, **fields)
            except (OSError, urllib.error.URLError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(POLL_SECONDS)
