"""Node rank 0's coordinator as it closes: the end of a job that trained to its last step must not fail its pod.

Found by CI on a96319c: a 2x1x2 job trained all 8 steps, then node rank 0's supervisor died at interpreter exit
("Fatal Python error: _enter_buffered_busy ... possibly due to daemon threads", after two "Exception occurred
during processing of request from" lines naming the other pods), so the attempt failed and the job spent its
restarts. The other nodes' gang followers leave a long poll of `/state` in flight when they exit; the last
`/finished` settles it, and the coordinator's daemon handler threads answered callers that had gone, printing
their tracebacks to stderr while the interpreter shut down.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from paralleljob_contract.coordinator import Coordinator, CoordinatorClient, GangState
from tests.contract.helpers import ROOT, free_port_pair


def handler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if "process_request_thread" in t.name]


def test_a_long_poll_in_flight_when_the_coordinator_closes_is_answered_and_its_thread_ends_with_close() -> None:
    port = free_port_pair()
    state = GangState(nodes=2, in_place_restarts=0)
    coordinator = Coordinator(state, "127.0.0.1", port)
    answers: list[dict[str, object]] = []
    poll = threading.Thread(
        target=lambda: answers.append(CoordinatorClient("127.0.0.1", port, 1).post("/state", 0, wait=10))
    )
    poll.start()
    deadline = time.monotonic() + 10
    while 1 not in state.last_seen:  # the poll is in its handler, waiting for the gang to settle
        assert time.monotonic() < deadline, "the long poll never reached the coordinator"
        time.sleep(0.01)

    coordinator.close()

    assert handler_threads() == [], "a handler thread outlived close(): it may write at interpreter exit"
    poll.join(timeout=5)
    assert answers and answers[0]["finished"] == 0, answers


def test_a_lost_peers_report_in_flight_when_the_coordinator_closes_ends_and_logs_before_close_returns(
    capsys: pytest.CaptureFixture[str],
) -> None:
    entered = threading.Event()

    def report(text: str) -> None:  # a progress hook whose API call is slow, then fails
        entered.set()
        time.sleep(2)  # longer than the server's shutdown (its loop looks every 0.5 s)
        raise RuntimeError("the API server went away")

    coordinator = Coordinator(GangState(nodes=2, in_place_restarts=0), "127.0.0.1", free_port_pair(), report)
    assert entered.wait(10), "the first report ('[]') was never sent"

    coordinator.close()

    assert [t for t in threading.enumerate() if t.name == "peers"] == [], "the report outlived close()"
    assert "could not report the peers not answering (RuntimeError" in capsys.readouterr().err


GONE_CALLER = """
import socket, struct, sys, time
from paralleljob_contract.coordinator import Coordinator, CoordinatorClient, GangState
port = int(sys.argv[1])
state = GangState(nodes=1, in_place_restarts=0)
coordinator = Coordinator(state, "127.0.0.1", port)
# A gang follower's long poll of /state, whose node then exits: its connection is reset.
body = b'{"generation": 0, "node": 0, "wait": 10}'
caller = socket.create_connection(("127.0.0.1", port))
caller.sendall(b"POST /state HTTP/1.1\\r\\nHost: x\\r\\nContent-Length: %d\\r\\n\\r\\n%s" % (len(body), body))
while 0 not in state.last_seen:
    time.sleep(0.01)
caller.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
caller.close()
# The last node finishes: the poll settles, and its answer goes to a caller that has gone.
CoordinatorClient("127.0.0.1", port, 0).post("/finished", 0)
time.sleep(0.5)
coordinator.close()
print("closed", flush=True)
"""


def test_an_answer_to_a_caller_that_has_gone_is_dropped_without_a_traceback() -> None:
    done = subprocess.run(
        [sys.executable, "-c", GONE_CALLER, str(free_port_pair())],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout) == (0, "closed\n"), done.stderr
    assert "Traceback" not in done.stderr and "Exception occurred" not in done.stderr, done.stderr
