"""The operator killed right after it wrote the attempt record and before the status that reports it (issue 39,
the two endings test_kill_loop_nodes.py found). The record goes first (`k8s.apply`): it is what the next pass acts
on, so the move or the admission it holds is carried on; the status must follow it all the same, though no later
step of that decision writes it again:

- a hot spare took a lost node rank: the pass that made its pod again wrote the record that ends the move, and was
  killed before `status.placement` named the spare (seed 1264395891);
- a gang restarted shrunk (`allowDataShrink`): the admission wrote the attempt's ConfigMap at 2x4x1, and was
  killed before the status said `layout: 2x4x1` (the run of seed 2601426391).

The kill is exact: the proxy carries out the pass's next ConfigMap patch (the record) and refuses every later
request, as if the process had died there.
"""

from __future__ import annotations

import time
from typing import Any

import kubernetes

from paralleljob.handlers import reconcile
from paralleljob.k8s import session as k8s_session
from paralleljob.manifests import labels, records
from tests.operator.helpers import Cluster, install_operator_rbac, job_doc
from tests.operator.killing import one_pass

SETTINGS = reconcile.Settings(image="trainer:test", force_delete_after_seconds=1.0, restart_hold_seconds=0.0)
PARALLELISM = {"pipeline": 2, "tensor": 4, "data": 2}  # four 4-GPU node ranks
RECORD_WRITE = ("patch", "configmaps")


def _record(cluster: Cluster) -> records.AttemptRecord:
    found = cluster.core.read_namespaced_config_map(labels.config_map_name("gpt"), "research").to_dict()
    record = records.record_of(found)
    assert record is not None
    return record


def _placed_nodes(status: dict[str, Any]) -> list[str]:
    return [entry["node"] for entry in sorted(status.get("placement") or (), key=lambda entry: entry["nodeRank"])]


def _kubelets(cluster: Cluster) -> None:
    """The scheduler binds each new pod to its pinned node and its kubelet starts it (a pod being deleted, or
    gone meanwhile, is left alone)."""
    for pod in cluster.pods("gpt"):
        name = pod["metadata"]["name"]
        if pod["metadata"].get("deletionTimestamp") or (pod.get("status") or {}).get("phase") == "Running":
            continue
        try:
            if not pod["spec"].get("nodeName"):
                cluster.bind(name, pod["metadata"]["labels"]["paralleljob.io/node"])
            cluster.set_pod_phase(name, "Running")
        except kubernetes.client.ApiException as error:
            if error.status != 404:
                raise


def _pass(session: Any, cluster: Cluster, apiserver: Any, *, kill_after_record: bool = False) -> bool:
    """One pass of a fresh operator, the scheduler and kubelets acting first; True when it was killed."""
    _kubelets(cluster)
    apiserver.proxy.outage_after_request = RECORD_WRITE if kill_after_record else None
    try:
        return one_pass(session, SETTINGS, cluster, apiserver, "gpt", None)
    finally:
        apiserver.proxy.outage_after_request = None


def _running(cluster: Cluster, pods: int, away_from: str | None = None) -> bool:
    live = [p for p in cluster.pods("gpt") if not p["metadata"].get("deletionTimestamp")]
    running = [p for p in live if (p.get("status") or {}).get("phase") == "Running"]
    status = cluster.status("gpt")
    settled = status.get("phase") == "Running" and status.get("podsReady") == pods == len(running) == len(live)
    return settled and all(p["spec"].get("nodeName") != away_from for p in running)


def _passes_until(session: Any, cluster: Cluster, apiserver: Any, done: Any, what: str, **kill: bool) -> None:
    """Passes until `done()`: within 30 s, since a pod on a lost node is force-deleted only once overdue."""
    deadline = time.monotonic() + 30.0
    while not done():
        assert time.monotonic() < deadline, f"{what}: not reached in 30 s; status {cluster.status('gpt')}"
        _pass(session, cluster, apiserver, **kill)


def _start(cluster: Cluster, apiserver: Any, nodes: int, policy: dict[str, Any]) -> Any:
    apiserver.termination_seconds = 0.0
    session = k8s_session.connect(str(install_operator_rbac(apiserver, cluster.client)))
    cluster.add_nodes(nodes)
    cluster.apply(job_doc("gpt", parallelism=PARALLELISM, failurePolicy=policy))
    _passes_until(session, cluster, apiserver, lambda: _running(cluster, 4), "the gang running")
    # The report of the record writes nothing while the status says what the record does.
    before = len(apiserver.proxy.requests)
    _pass(session, cluster, apiserver)
    quiet = [r for r in apiserver.proxy.requests[before:] if (r.verb, r.resource) == ("patch", "paralleljobs/status")]
    assert quiet == []
    return session


def test_killed_after_the_record_ends_a_spare_move_the_placement_still_names_the_spare(cluster, apiserver):
    session = _start(cluster, apiserver, 6, {"backoffLimit": 1, "spareNodes": 1})
    status = cluster.status("gpt")
    (spare,) = status["spareNodes"]
    lost = _placed_nodes(status)[1]
    cluster.core.delete_node(lost)
    # The move: the record names the spare for node rank 1 and the rank is `replacing` until its pod is made again.
    _passes_until(session, cluster, apiserver, lambda: bool(_record(cluster).replacing), "the move begun")
    # Every pass from now on is killed right after its first record write: the one that ends the move, too.
    _passes_until(
        session, cluster, apiserver, lambda: not _record(cluster).replacing, "the move", kill_after_record=True
    )
    # The kill landed in the window: the record ended the move, the status was not yet written.
    assert _record(cluster).nodes[1] == spare
    assert lost in _placed_nodes(cluster.status("gpt"))
    _passes_until(session, cluster, apiserver, lambda: _running(cluster, 4, away_from=lost), "the gang re-formed")
    _pass(session, cluster, apiserver)
    assert _placed_nodes(cluster.status("gpt")) == list(_record(cluster).nodes)
    assert spare in _placed_nodes(cluster.status("gpt")) and lost not in _placed_nodes(cluster.status("gpt"))
    assert cluster.status("gpt").get("restarts", 0) == 0


def test_killed_after_a_shrunk_admission_the_status_reports_the_smaller_layout(cluster, apiserver):
    session = _start(cluster, apiserver, 4, {"backoffLimit": 1, "allowDataShrink": True})
    before = cluster.status("gpt")
    assert before["layout"] == "2x4x2"
    cluster.core.delete_node(_placed_nodes(before)[1])
    # The gang restarts (the record no longer live), its old pods go, and the admission of attempt 1 shrinks it.
    _passes_until(session, cluster, apiserver, lambda: not _record(cluster).live, "the gang restarted")
    # Every pass from now on is killed right after its first ConfigMap write: the admission's, too.
    _passes_until(session, cluster, apiserver, lambda: _record(cluster).live, "the admission", kill_after_record=True)
    # The kill landed in the window: attempt 1's ConfigMap is written at the smaller DP, its status is not.
    assert _record(cluster).attempt == 1 and len(_record(cluster).nodes) == 2
    assert cluster.status("gpt").get("layout") == "2x4x2"
    _passes_until(session, cluster, apiserver, lambda: _running(cluster, 2), "the shrunk gang running")
    status = cluster.status("gpt")
    assert (status["layout"], status["worldSize"], status["nodes"], status.get("restarts")) == ("2x4x1", 8, 2, 1)
    assert _placed_nodes(status) == list(_record(cluster).nodes)
    assert [entry["ranks"] for entry in status["placement"]] == ["0-3", "4-7"]
