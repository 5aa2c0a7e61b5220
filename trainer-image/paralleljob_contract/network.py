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
