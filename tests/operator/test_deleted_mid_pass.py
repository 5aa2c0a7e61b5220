"""A job deleted while a pass is acting on it: the pass's next write finds its objects gone (404), and that is an
ordinary end of the pass, logged at debug level, never an ERROR with a traceback and a retry."""

from __future__ import annotations

import pytest

from tests.operator.helpers import Operator, job_doc, made_here, wait_for

# Said at debug level by the pass that finds the job gone (paralleljob.handlers.reconcile).
ENDED_QUIETLY = "was deleted during the pass"


@pytest.fixture
def operator_args():
    return [*Operator.ARGS, "--log-level", "debug"]


def test_a_gang_restart_racing_the_jobs_deletion_ends_quietly(cluster, operator, apiserver, tmp_path):
    cluster.add_nodes(16)
    cluster.apply(job_doc())
    cluster.start_running()
    server = apiserver
    # A gang restart's first write is its attempt record (a patch of the job's ConfigMap): hold it there, delete
    # the job meanwhile (the garbage collector deletes the ConfigMap with it), then let the patch through.
    server.held.add(("patch", "configmaps"))
    cluster.set_pod_phase("gpt-5", "Failed", reason="Error")
    wait_for(lambda: ("patch", "configmaps", "research") in server.holding, what="the restart's record")
    cluster.custom.delete_namespaced_custom_object("paralleljob.io", "v1alpha1", "research", "paralleljobs", "gpt")
    wait_for(
        lambda: made_here(cluster.core.list_namespaced_config_map("research")) == [], what="the ConfigMap collected"
    )
    server.held.discard(("patch", "configmaps"))
    log = tmp_path / "operator.log"
    ended = wait_for(
        lambda: (ENDED_QUIETLY in log.read_text() or "Traceback" in log.read_text()) and log.read_text(),
        what="the restart's end",
    )
    assert "Traceback" not in ended, "the pass logged a traceback:\n" + ended[ended.index("Traceback") - 300 :][:1500]
