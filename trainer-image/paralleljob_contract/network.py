"""The one line a rank writes when the network is not what the job planned, and its reader.

The bundled trainer writes it to the container's termination message (`environment.TERMINATION_LOG`) before it
exits 5; the operator reads it from `containerStatuses[].state.terminated.message` and `paralleljob run` from
each node's file, and both set the condition it names to False with its reason. The form is
`<Condition> <Reason>: <message>` on one line, e.g. `NetworkReady NoRdmaDevice: fabric infiniband but ...`.
"""

from __future__ import annotations

import dataclasses
import re

# NetworkReady: the trainer's preflight; NetworkVerified: what NCCL chose (spec.network.verify: fail).
CONDITIONS = ("NetworkReady", "NetworkVerified")
_LINE = re.compile(r"^(NetworkReady|NetworkVerified) ([A-Z][A-Za-z]+): (.+)$")
# The link check's reason (spec.network.preflight): its message starts with the nodes it names, so that the
# operator can exclude them (`slow_nodes`) and `paralleljob run` can say which node it was.
SLOW_LINK = "SlowLink"
_SLOW_NODES = re.compile(r"^slow nodes? ([^:\s]+): ")


@dataclasses.dataclass(frozen=True)
class NetworkFailure:
    """A rank's report that the network is not what the job planned."""

    condition: str
    reason: str
    message: str

    def line(self) -> str:
        """The termination message: one line, whitespace in the message collapsed."""
        return f"{self.condition} {self.reason}: {' '.join(self.message.split())}"

    def render(self) -> str:
        """For people: `NetworkReady=False NoRdmaDevice: ...`."""
        return f"{self.condition}=False {self.reason}: {self.message}"


def parse_failure(text: str | None) -> NetworkFailure | None:
    """The failure a termination message reports, or None for any other message (a log tail, say)."""
    lines = (text or "").strip().splitlines()
    match = _LINE.match(lines[0].strip()) if lines else None
    return NetworkFailure(match[1], match[2], match[3]) if match else None


def slow_link_message(nodes: list[str], detail: str) -> str:
    """The link check's message: `slow node a: ...` or `slow nodes a,b: ...`, then what was measured."""
    return f"slow node{'s' if len(nodes) > 1 else ''} {','.join(nodes)}: {detail}"


def slow_nodes(failure: NetworkFailure | None) -> list[str]:
    """The nodes a SlowLink failure names; [] for any other failure."""
    if failure is None or failure.reason != SLOW_LINK:
        return []
    match = _SLOW_NODES.match(failure.message)
    return match[1].split(",") if match else []
