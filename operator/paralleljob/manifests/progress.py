"""The progress channel: rank 0's own ConfigMap `<job>-progress`, and the numbers the operator takes from it.

Pure. Rank 0 reports progress by merge-patching the `data` of this one ConfigMap (`paralleljob_trainer.k8s_status`);
its ServiceAccount may patch nothing else (`manifests.rbac`): not the job, not its status, not another job's
object. The operator creates the ConfigMap empty, owned by the job, and copies from it only numbers it has
validated (`status_of`) into `status.progress`, `status.lastCheckpointStep` and `status.network`, which are for people and never
feed a decision: a value that is not a plain number in range is dropped, so whatever rank 0's token writes, the
operator's reservations, placement, phase and restarts cannot change. The one exception, `lost_peers_of`, moves
a node rank to a spare or restarts the gang only where the Node's own Lease agrees (`handlers.lost_peers`), so a
pod's token alone still cannot.
"""

from __future__ import annotations

import datetime
import math
import re
from collections.abc import Mapping
from typing import Any

from paralleljob.manifests import labels
from paralleljob_contract import peers as peer_channel
from paralleljob_contract import progress as channel
from paralleljob_contract import stragglers as straggler_channel
from paralleljob_contract.errors import ContractError

# The label the operator's watch selects progress ConfigMaps by (the job is found from the object's name).
PROGRESS_LABEL = "paralleljob.io/progress"
# Bounds of what a training run can report; anything outside is not progress.
MAX_VALUE_LENGTH = 32
MAX_STEP = 10**12
MAX_LOSS = 1e6
MAX_TOKENS_PER_SECOND = 1e12
# Efficiency bounds: above any device's TFLOP/s, MFU at most 1, and a step of at most a day.
MAX_TFLOPS = 1e5
MAX_STEP_SECONDS = 86400.0
# The most in-place restarts a report may claim (the operator also bounds it by the attempt's budget).
MAX_IN_PLACE_RESTARTS = 10**6
MAX_MESSAGE_LENGTH = 512
# status.progress's ratio of the measured to the modeled step time (computed here, not reported by rank 0).
STEP_OVER_MODELED = "stepOverModeled"
# The stragglers value: at most MAX_REPORTED entries of ~80 bytes each.
MAX_STRAGGLERS_LENGTH = 4096
REASON = re.compile(r"^[A-Z][A-Za-z]{0,31}$")
VERDICTS = ("True", "False", "Unknown")
LAYOUT = re.compile(r"^PP\d{1,5}xTP\d{1,5}xDP\d{1,6}$")
TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?Z$")


def job_of(config_map_name: str) -> str | None:
    """The job a progress ConfigMap belongs to, from its name (which, unlike its labels, rank 0 cannot change)."""
    return channel.job_of(config_map_name)


def build_config_map(owner: Mapping[str, Any]) -> dict[str, Any]:
    """The empty progress ConfigMap of a job, owned by it."""
    job = owner["metadata"]["name"]
    metadata = labels.child_metadata(owner, labels.progress_config_map_name(job), {PROGRESS_LABEL: "true"})
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": {}}


def _text(data: Mapping[str, Any], key: str) -> str | None:
    value = data.get(key)
    return value.strip() if isinstance(value, str) and len(value) <= MAX_VALUE_LENGTH else None


def _count(data: Mapping[str, Any], key: str, limit: int) -> int | None:
    text = _text(data, key)
    if text is None or not text.isdigit():
        return None
    value = int(text)
    return value if value <= limit else None


def _number(data: Mapping[str, Any], key: str, low: float, high: float) -> float | None:
    text = _text(data, key)
    try:
        value = float(text) if text is not None else math.nan
    except ValueError:
        return None
    return value if math.isfinite(value) and low <= value <= high else None


def status_of(
    config_map: Mapping[str, Any], total_steps: int, nodes: Mapping[int, str] | None = None
) -> dict[str, Any]:
    """`status.progress` and `status.lastCheckpointStep` from a progress ConfigMap, validated: a field rank 0
    wrote wrong is left out; without a valid step there is no progress at all. Steps cannot pass the job's
    spec.training.steps, and totalSteps comes from the spec, not from rank 0."""
    data = config_map.get("data") or {}
    if not isinstance(data, Mapping):
        return {}
    found: dict[str, Any] = {}
    step = _count(data, channel.STEP, total_steps)
    if step is not None:
        progress: dict[str, Any] = {"step": step, "totalSteps": total_steps}
        loss = _number(data, channel.LOSS, -MAX_LOSS, MAX_LOSS)
        throughput = _number(data, channel.TOKENS_PER_SECOND, 0.0, MAX_TOKENS_PER_SECOND)
        updated = _text(data, channel.UPDATED)
        if loss is not None:
            progress["loss"] = round(loss, 4)
        if throughput is not None:
            progress["tokensPerSecond"] = round(throughput, 1)
        validation = _number(data, channel.VALIDATION_LOSS, -MAX_LOSS, MAX_LOSS)
        if validation is not None:
            progress["validationLoss"] = round(validation, 4)
        if updated is not None and TIMESTAMP.match(updated):
            progress["updated"] = updated
        progress.update(efficiency_of(data))
        progress |= _resumed_layouts(data)
        named = stragglers_of(data, total_steps, nodes or {})
        if named is not None:
            progress["stragglers"] = named
        found["progress"] = progress
    checkpoint = _count(data, channel.LAST_CHECKPOINT_STEP, total_steps)
    if checkpoint is not None:
        found["lastCheckpointStep"] = checkpoint
        saved = _text(data, channel.LAST_CHECKPOINT_TIME)
        if saved is not None and TIMESTAMP.match(saved):
            found["lastCheckpointTime"] = saved
    if (network := network_of(data)) is not None:
        found["network"] = network
    return found


def efficiency_of(data: Mapping[str, Any]) -> dict[str, float]:
    """tflopsPerGpu, mfu, stepSeconds and modeledStepSeconds where valid, and their ratio stepsOverModeled
    (measured / modeled step time) when both times are there: the plan's promise checked by the run."""
    bounds = {
        channel.TFLOPS_PER_GPU: MAX_TFLOPS,
        channel.MFU: 1.0,
        channel.STEP_SECONDS: MAX_STEP_SECONDS,
        channel.MODELED_STEP_SECONDS: MAX_STEP_SECONDS,
    }
    found: dict[str, float] = {}
    for key, high in bounds.items():
        value = _number(data, key, 0.0, high)
        if value is not None and value > 0:
            found[key] = float(f"{value:.4g}")
    measured, modeled = found.get(channel.STEP_SECONDS), found.get(channel.MODELED_STEP_SECONDS)
    if measured is not None and modeled is not None:
        found[STEP_OVER_MODELED] = float(f"{measured / modeled:.4g}")
    return found


def _resumed_layouts(data: Mapping[str, Any]) -> dict[str, str]:
    """The layouts of the last resume (saved at, resumed at), when both are valid layout names."""
    saved, resumed = _text(data, channel.RESUMED_FROM_LAYOUT), _text(data, channel.RESUMED_AT_LAYOUT)
    if saved is None or resumed is None or not LAYOUT.match(saved) or not LAYOUT.match(resumed):
        return {}
    return {"resumedFromLayout": saved, "resumedAtLayout": resumed}


def stragglers_of(data: Mapping[str, Any], total_steps: int, nodes: Mapping[int, str]) -> list[dict[str, Any]] | None:
    """status.progress.stragglers from rank 0's last window (`nodes`: node rank to node name, from the placement);
    None when absent or malformed. Entries naming a node rank outside the placement are dropped, and so are those
    whose node (the trainer names the node each rank ran on) is not that node rank's now: a report about a
    gang before its node rank moved to a spare."""
    text = data.get(channel.STRAGGLERS)
    if not isinstance(text, str) or len(text) > MAX_STRAGGLERS_LENGTH:
        return None
    try:
        entries = straggler_channel.decode(text)
    except ContractError:
        return None
    named = []
    for entry in entries:
        rank, steps = entry["nodeRank"], entry["steps"]
        factor = float(entry["factor"])
        if (nodes and rank not in nodes) or not math.isfinite(factor) or max(steps) > total_steps:
            continue
        if entry.get("node") and nodes and entry["node"] != nodes[rank]:
            continue
        found = {"nodeRank": rank, "factor": round(factor, 2), "stage": entry["stage"], "steps": steps}
        named.append({**found, **({"node": nodes[rank]} if rank in nodes else {})})
    return named


def lost_peers_of(config_map: Mapping[str, Any] | None) -> dict[str, float]:
    """The nodes node rank 0's coordinator reports it no longer hears from, each with seconds silent; {} when
    none is reported or the report is malformed (a gang's word alone never moves a node: `handlers.lost_peers`
    also asks its Lease)."""
    data = (config_map or {}).get("data") or {}
    text = data.get(channel.LOST_PEERS) if isinstance(data, Mapping) else None
    if not isinstance(text, str) or len(text) > MAX_STRAGGLERS_LENGTH:
        return {}
    try:
        entries = peer_channel.decode(text)
    except ContractError:
        return {}
    return {e["node"]: float(e["silentSeconds"]) for e in entries if e["node"] and math.isfinite(e["silentSeconds"])}


def in_place_restarts_of(config_map: Mapping[str, Any], since: str | None, budget: int) -> int | None:
    """The in-place restarts rank 0 reports for the attempt whose gang has run since `since` (RFC 3339, the
    attempt record's startedAt): a count within the attempt's `budget`, in a report made after `since`, so a
    report left by the previous attempt's pods is not read as this one's. None when there is no such report.
    Each counts against backoffLimit, so a report can end its own job sooner, never another's."""
    data = config_map.get("data") or {}
    if not isinstance(data, Mapping) or since is None:
        return None
    count = _count(data, channel.IN_PLACE_RESTARTS, budget)
    updated = _text(data, channel.UPDATED)
    if count is None or updated is None or not TIMESTAMP.match(updated):
        return None
    reported, started = _instant(updated), _instant(since)
    return count if reported is not None and started is not None and reported >= started else None


def _instant(stamp: str) -> datetime.datetime | None:
    try:
        return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None


def network_of(data: Mapping[str, Any]) -> dict[str, str] | None:
    """`status.network` (verified, reason, message) from rank 0's verdict; None unless all three are well formed.
    It only feeds the NetworkVerified condition and its Event, never a decision."""
    verified, reason = _text(data, channel.NETWORK_VERIFIED), _text(data, channel.NETWORK_REASON)
    message = data.get(channel.NETWORK_MESSAGE)
    if verified not in VERDICTS or reason is None or not REASON.match(reason):
        return None
    if not isinstance(message, str) or len(message) > MAX_MESSAGE_LENGTH:
        return None
    return {"verified": verified, "reason": reason, "message": message.strip()}
