"""One pass per job at a time, whoever runs it: a job's supervision pass (its watch events, timers and resyncs,
on the coalescer's threads) and its admission pass (the admission queue's one worker) never run beside each
other, so no job gets two Events or two status writes for one change."""

from __future__ import annotations

import kubernetes

from tests.operator.helpers import OPERATOR_AGENTS, finish_operator_passes, job_doc, wait_for

# An admission policy refusal (the chart allows no PriorityClass by default) that also puts the job first in
# every admission round it is offered to.
INVALID_AND_FIRST = {"template": {"priorityClassName": "high"}}


def operator_calls(server, verb: str, plural: str, namespace: str, since: int = 0) -> int:
    return sum(
        1
        for call in server.calls[since:]
        if call[:4] == (verb, call[1], plural, namespace) and call[4].startswith(OPERATOR_AGENTS)
    )


def test_a_node_change_never_runs_a_second_pass_beside_an_invalid_jobs_own(cluster, apiserver, operator):
    server = apiserver
    priorities = kubernetes.client.SchedulingV1Api(cluster.client)
    priorities.create_priority_class({"metadata": {"name": "high"}, "value": 1000})
    # A job that waits for GPUs, in a namespace of its own (the recorded calls name namespaces, not objects).
    cluster.create_namespace("waiting")
    cluster.apply(job_doc("gpt", "waiting"))
    wait_for(
        lambda: any(c.get("reason") == "Unschedulable" for c in cluster.status("gpt", "waiting").get("conditions", [])),
        what="the waiting job Unschedulable",
    )
    # The invalid job's own pass is held at its one status write...
    server.held.add(("patch", "paralleljobs/status"))
    cluster.apply(job_doc("gpt", "research", **INVALID_AND_FIRST))
    wait_for(lambda: ("patch", "paralleljobs/status", "research") in server.holding, what="the invalid job's pass")
    # ... while a node change asks every waiting job to try again. Its admission round begins with the first job
    # in order it is given: proof that the recheck has reached the admission worker.
    mark = len(server.calls)
    cluster.add_nodes(1)
    wait_for(
        lambda: (
            operator_calls(server, "get", "paralleljobs", "research", mark)
            or operator_calls(server, "get", "paralleljobs", "waiting", mark)
        ),
        what="the admission round after the node change",
    )
    server.held.clear()
    wait_for(lambda: [e for e in cluster.events() if e["reason"] == "InvalidSpec"], what="the InvalidSpec Event")
    finish_operator_passes(cluster)
    events = [e for e in cluster.events() if e["reason"] == "InvalidSpec"]
    writes = operator_calls(server, "patch", "paralleljobs/status", "research")
    assert (len(events), writes) == (1, 1), f"{len(events)} InvalidSpec Events and {writes} status writes"
