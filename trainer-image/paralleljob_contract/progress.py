"""The progress channel between node rank 0 and the operator: one ConfigMap per job, and the keys of its data.

Rank 0's progress hook (paralleljob_trainer.k8s_status) merge-patches `data` with these keys, every value a
string; its ServiceAccount may patch this one ConfigMap and nothing else. The operator creates the ConfigMap,
owned by the job, validates what it finds there and copies it into `status.progress` and
`status.lastCheckpointStep` (and the network verdict into `status.network`), which are for people: the operator never acts on them,
except on the answer to its own checkpoint request, and on LOST_PEERS together with the Node's Lease.

The one key the operator writes is CHECKPOINT_REQUEST (an id), before it stops a gang that Kueue evicted. Rank 0
reads it in the answer to its own next patch (the API returns the object patched, so its account needs no
read right), and once the checkpoint it took for it is complete, reports CHECKPOINT_SERVED with that id.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from paralleljob_contract.errors import ContractError

CONFIG_MAP_SUFFIX = "-progress"
# The data keys, as rank 0 writes them.
STEP = "step"
LOSS = "loss"
TOKENS_PER_SECOND = "tokensPerSecond"
UPDATED = "updated"
# The held-out loss of the latest evaluation (spec.training.eval), repeated in every report after it.
VALIDATION_LOSS = "validationLoss"
LAST_CHECKPOINT_STEP = "lastCheckpointStep"
# When that checkpoint was complete (RFC 3339, UTC): the operator asks for a fresh one before Kueue's eviction
# stops a gang whose last checkpoint is older than its grace period.
LAST_CHECKPOINT_TIME = "lastCheckpointTime"
# The trainer's network verdict (NCCL's own choice after the warm-up collective), once per attempt; the
# operator turns it into the NetworkVerified condition.
NETWORK_VERIFIED = "networkVerified"
NETWORK_REASON = "networkReason"
NETWORK_MESSAGE = "networkMessage"
# In-place restarts of the gang since its pods started (the supervisor's generation, a non-negative integer):
# the operator counts each new one as a restart of the job.
IN_PLACE_RESTARTS = "inPlaceRestarts"
# The layout (PPpxTPtxDPd) of the checkpoint the current attempt resumed from, and the one it resumed at:
# reported with each resume, so that a resume at another layout shows in status.progress.
RESUMED_FROM_LAYOUT = "resumedFromLayout"
RESUMED_AT_LAYOUT = "resumedAtLayout"
# The operator's request for a checkpoint now, and rank 0's answer (the id served, once it is saved).
CHECKPOINT_REQUEST = "checkpointRequest"
CHECKPOINT_SERVED = "checkpointServed"
# Efficiency beside the loss (paralleljob_contract.efficiency): achieved model TFLOP/s per GPU, MFU (only where
# the GPU's peak is known), the median step time over the last log window, and the planner's modeled step time.
TFLOPS_PER_GPU = "tflopsPerGpu"
MFU = "mfu"
STEP_SECONDS = "stepSeconds"
MODELED_STEP_SECONDS = "modeledStepSeconds"
# The nodes the last window of compute times named as stragglers (paralleljob_contract.stragglers.encode: a
# compact JSON list, "[]" when none), sent at the end of each window.
STRAGGLERS = "stragglers"
# The nodes node rank 0's coordinator no longer hears from (paralleljob_contract.peers.encode: a compact JSON
# list, "[]" when every node answers), written by node rank 0's supervisor through the same hook. The operator
# acts on it, but only with the Node's own Lease also no longer renewed (docs/operator.md).
LOST_PEERS = "lostPeers"


def config_map_name(job: str) -> str:
    """The name of a job's progress ConfigMap."""
    return f"{job}{CONFIG_MAP_SUFFIX}"


def job_of(config_map: str) -> str | None:
    """The job a progress ConfigMap belongs to, from its name; None for any other name."""
    if not config_map.endswith(CONFIG_MAP_SUFFIX):
        return None
    return config_map[: -len(CONFIG_MAP_SUFFIX)] or None


def decode_list(
    key: str, text: str, checked: Callable[[object, int], dict[str, Any]], limit: int
) -> list[dict[str, Any]]:
    """A key whose value is a JSON list of objects (`stragglers`, `lostPeers`) read back: its first `limit`
    entries, each through `checked(entry, index)`; ContractError names the key and what is wrong."""
    try:
        entries = json.loads(text)
    except ValueError as error:
        raise ContractError(f"{key}: not JSON ({error}); expected a list such as []") from None
    if not isinstance(entries, list):
        raise ContractError(f"{key}: expected a JSON list of nodes")
    return [checked(entry, index) for index, entry in enumerate(entries[:limit])]
