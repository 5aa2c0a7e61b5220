"""What the supervisor tests share: the repository root (the supervisors' working folder) and a free port
pair (the coordinator's port and the ranks' rendezvous on the next one)."""

from __future__ import annotations

import pathlib
import socket

ROOT = pathlib.Path(__file__).resolve().parents[2]


def free_port_pair() -> int:
    while True:
        with socket.socket() as first, socket.socket() as second:
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1]
            try:
                second.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return int(port)
