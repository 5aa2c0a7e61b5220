"""A lost node, noticed by its gang: the nodes of a placed gang that break it now on two signals together.

The gang's signal: node rank 0's coordinator reports the nodes it no longer hears from in the progress channel
(`lostPeers`, `paralleljob_contract.peers`). The Node's own: its kubelet's Lease in kube-node-lease, no longer
renewed for `--lost-node-lease` seconds. A node with both breaks its gang at once, without waiting for the
node-lifecycle controller to mark it NotReady and for `--not-ready-grace` after that; a node with only one (a
slow coordinator, a kubelet that missed a renewal, a network blip shorter than the threshold) costs nothing.
`decide` is the policy, pure, with a table test; `observe` reads what it needs: the progress ConfigMap, and the
Lease of each reported node of the gang only (so a quiet gang costs no Lease read).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping

from paralleljob.handlers.passes import Pass
from paralleljob.k8s import reads
from paralleljob.manifests import labels, timestamps
from paralleljob.manifests import progress as progress_channel


@dataclasses.dataclass(frozen=True)
class Evidence:
    """The nodes lost on both signals, each with why (the wording of a lost node's reason: "node X <why>"),
    and in how many seconds a reported node's Lease reaches the threshold (None: nothing falls due)."""

    lost: Mapping[str, str] = dataclasses.field(default_factory=dict)
    recheck_in: float | None = None


def decide(reported: Mapping[str, float], lease_age: Mapping[str, float | None], threshold: float) -> Evidence:
    """Of the nodes the gang reports (with seconds silent), those whose Lease has gone `threshold` seconds or
    more unrenewed (`lease_age`: seconds since its renewTime; None for no Lease, which is no signal: the node
    is then judged as before). Threshold 0 turns the gang's report off."""
    if threshold <= 0:
        return Evidence()
    lost: dict[str, str] = {}
    due: float | None = None
    for node, silent in sorted(reported.items()):
        age = lease_age.get(node)
        if age is None:
            continue
        if age >= threshold:
            lost[node] = (
                f"stopped answering its gang ({silent:.0f}s) and its Lease was last renewed {age:.0f}s ago "
                f"(threshold {threshold:.0f}s)"
            )
        else:
            due = min(due if due is not None else threshold, threshold - age + 0.5)
    return Evidence(lost, due)


def weighed(p: Pass, nodes: Collection[str | None]) -> Pass:
    """The pass with the evidence on these nodes (every node its steps judge: the gang's, its spares', its
    pods') fixed, so that `observe` answers from it. Read twice, a report landing or a Lease going stale between
    the reads made the spare step see nothing and supervision a lost node, which restarted the whole gang where
    the spare should have taken one node rank (seen in a CI rehearsal)."""
    found = observe(p, nodes)
    return dataclasses.replace(p, gang_lost=(found.lost, found.recheck_in))


def observe(p: Pass, nodes: Collection[str | None]) -> Evidence:
    """The evidence on these nodes (a gang's, its spares'): the gang's report read from the progress ConfigMap
    (the job's own), and the Lease of each node it names among them; the pass's own when it was `weighed`."""
    if p.gang_lost is not None:
        lost, recheck_in = p.gang_lost
        return Evidence({node: why for node, why in lost.items() if node in nodes}, recheck_in)
    if p.settings.lost_node_lease_seconds <= 0:
        return Evidence()
    found = reads.get_config_map(p.session, p.namespace, labels.progress_config_map_name(p.name))
    if found is None or not labels.owned_by(found, p.uid):
        return Evidence()
    reported = {node: silent for node, silent in progress_channel.lost_peers_of(found).items() if node in nodes}
    now = p.session.server_now()
    ages = {node: timestamps.seconds_since(reads.node_lease_renewed(p.session, node), now) for node in reported}
    return decide(reported, ages, p.settings.lost_node_lease_seconds)
