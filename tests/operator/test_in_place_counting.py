"""In-place restarts are counted even when the gang breaks before the operator saw them: rank 0 reports an
in-place restart in its progress ConfigMap, and a pod is lost before the operator's next pass over the running
gang. The pass that restarts the gang reads the report first, so the in-place restart counts against backoffLimit
and shows in `inPlaceRestarts` and a RestartedInPlace Event (the 4-node upstream bench saw it lost: restarts 1,
inPlaceRestarts 0, after one in-place restart and one pod loss)."""

from __future__ import annotations

from paralleljob.manifests import labels, timestamps
from paralleljob_contract import progress as channel
from tests.operator.helpers import job_doc, wait_for


def test_an_in_place_restart_reported_just_before_a_pod_is_lost_is_counted(cluster, operator):
    cluster.add_nodes(16)
    cluster.apply(job_doc(failurePolicy={"backoffLimit": 5, "inPlaceRestarts": 3}))
    cluster.start_running()
    wait_for(lambda: cluster.status().get("startTime"), what="the running gang's record")
    # Rank 0's report and the lost pod reach the server while the operator is down, so its next pass sees both.
    operator.kill()
    progress = labels.progress_config_map_name("gpt")
    report = {channel.IN_PLACE_RESTARTS: "1", channel.UPDATED: timestamps.now(), channel.STEP: "12"}
    cluster.core.patch_namespaced_config_map(progress, "research", {"data": report})
    cluster.set_pod_phase("gpt-3", "Failed")
    operator.start()

    status = wait_for(lambda: cluster.status().get("phase") == "Restarting" and cluster.status(), what="the restart")
    assert (status["restarts"], status.get("inPlaceRestarts")) == (2, 1), status
    reasons = [e["reason"] for e in cluster.events()]
    assert reasons.count("RestartedInPlace") == 1, reasons
    # The Restarting Event follows the status write.
    restarting = wait_for(
        lambda: [e["message"] for e in cluster.events() if e["reason"] == "Restarting"], what="the Restarting Event"
    )
    assert restarting[-1].startswith("gang restart 2/5"), restarting
