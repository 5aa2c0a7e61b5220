"""A job that gives a GPU budget: the operator chooses its layout once, at first admission, records it with a
LayoutChosen condition and an Event, and a gang restart re-places that layout without choosing again."""

from __future__ import annotations

from tests.operator.helpers import job_doc, restarted, wait_for


def budget_job() -> dict:
    doc = job_doc(parallelism={"nodes": 4})
    doc["spec"]["deepspeed"] = {"train_batch_size": 32}
    return doc


def test_the_layout_is_chosen_once_at_admission_and_kept_across_a_restart(cluster, operator):
    cluster.add_nodes(5)
    cluster.apply(budget_job())
    wait_for(lambda: len(cluster.pods()) == 4, what="4 pods of the chosen layout")
    status = cluster.status()
    choice = status["layoutChoice"]
    assert choice["pipeline"] * choice["tensor"] * choice["data"] == 16 == choice["gpus"]
    assert status["layout"] == f"{choice['pipeline']}x{choice['tensor']}x{choice['data']}"
    chosen = {c["type"]: c for c in status["conditions"]}["LayoutChosen"]
    assert (chosen["status"], chosen["reason"]) == ("True", "LayoutChosen")
    assert chosen["message"].startswith("1. the model fits one GPU")
    # The Event is posted after the status write it goes with.
    wait_for(lambda: "LayoutChosen" in [e["reason"] for e in cluster.events()], what="the LayoutChosen Event")
    assert [e["reason"] for e in cluster.events()].count("LayoutChosen") == 1

    wait_for(lambda: cluster.status().get("message", "").startswith("4 pods"), what="placed")
    cluster.bind_all()
    wait_for(lambda: cluster.status().get("phase") == "Running", what="Running")
    cluster.set_pod_phase(cluster.pods()[1]["metadata"]["name"], "Failed", reason="Error")
    wait_for(lambda: restarted(cluster, 1, pods=4), what="a new generation of 4 pods")
    assert cluster.status()["layoutChoice"] == choice
    assert [e["reason"] for e in cluster.events()].count("LayoutChosen") == 1
