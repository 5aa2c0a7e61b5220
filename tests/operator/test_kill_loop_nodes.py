"""The operator killed at random moments of the decisions a lost node brings (issue 39): a hot spare taking the
lost node's rank (its pod alone made again) and the spare topped up, and, without a spare, the gang shrunk to a
smaller DP (`allowDataShrink`). Kills as in test_kill_loop.py (tests/operator/killing.py): a pass cut off after
a random number of requests, in half of them the last request carried out and only its answer lost; the next
pass starts from the cluster alone.

After every job: Succeeded, with the restarts the decision costs (none for a spare, one for a shrink), on the
layout it should end on, the spare's node in the placement; never two generations of pods alive at once, never
a pod name created twice while it lived, never a GPU booked twice. `PARALLELJOB_KILL_SEED` replays a failure.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import random
from typing import Any

import pytest

from paralleljob.handlers import reconcile
from paralleljob.k8s import session as k8s_session
from tests.operator.helpers import Cluster, generations_overlapping, gpus_oversubscribed, install_operator_rbac, job_doc
from tests.operator.killing import duplicate_pods, one_pass

SETTINGS = reconcile.Settings(image="trainer:test", force_delete_after_seconds=1.0, restart_hold_seconds=0.0)
PARALLELISM = {"pipeline": 2, "tensor": 4, "data": 2}  # four 4-GPU node ranks


@dataclasses.dataclass(frozen=True)
class Scenario:
    failure_policy: dict[str, Any]
    pods_after: int  # the gang's size once the lost node is dealt with
    restarts: int
    layout: str
    kills: int


SCENARIOS = {
    "spare": Scenario({"backoffLimit": 1, "spareNodes": 1}, pods_after=4, restarts=0, layout="2x4x2", kills=30),
    "shrink": Scenario(
        {"backoffLimit": 1, "allowDataShrink": True}, pods_after=2, restarts=1, layout="2x4x1", kills=30
    ),
}


@dataclasses.dataclass
class World:
    """The scheduler, the kubelets and the node's loss, played between the operator's passes."""

    cluster: Cluster
    job: str
    rng: random.Random
    lost: str | None = None
    spare: str | None = None

    def act(self, scenario: Scenario) -> None:
        pods = [p for p in self.cluster.pods(self.job) if not p["metadata"].get("deletionTimestamp")]
        if any(not p["spec"].get("nodeName") for p in pods):
            self.cluster.bind_all(self.job)
            return
        status = self.cluster.status(self.job)
        running = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
        if status.get("phase") != "Running" or self.rng.random() < 0.3:
            return
        if self.lost is None and len(running) == 4:
            self.spare = next(iter(status.get("spareNodes") or ()), None)
            self.lost = self.rng.choice(running)["spec"]["nodeName"]
            self.cluster.core.delete_node(self.lost)
        elif self.lost is not None and self._settled(running, status, scenario):
            self.cluster.set_pod_phase(f"{self.job}-0", "Succeeded")

    def _settled(self, running: list[dict[str, Any]], status: dict[str, Any], scenario: Scenario) -> bool:
        """The gang on its new nodes, every pod Running."""
        ready = len(running) == scenario.pods_after == status.get("podsReady")
        return ready and all(p["spec"]["nodeName"] != self.lost for p in running)


@pytest.mark.parametrize("name", SCENARIOS)
def test_killed_while_a_lost_node_is_dealt_with_the_operator_converges_without_doubles(cluster, apiserver, name):
    scenario = SCENARIOS[name]
    seed = int(os.environ.get("PARALLELJOB_KILL_SEED") or random.SystemRandom().randrange(2**32))
    rng = random.Random(seed)
    replay = f"(replay with PARALLELJOB_KILL_SEED={seed})"
    apiserver.termination_seconds = 0.0
    session = k8s_session.connect(str(install_operator_rbac(apiserver, cluster.client)))
    kills = iterations = added = 0
    killed_in: collections.Counter[str] = collections.Counter()
    jobs: list[str] = []
    while kills < scenario.kills:
        # Each job finds exactly the nodes it needs: four ranks, and the spare when it has one, and one more
        # to top the spare up again; the lost node is gone for good.
        wanted = 4 + (2 if scenario.failure_policy.get("spareNodes") else 0)
        live = len(cluster.core.list_node().items)
        if wanted > live:
            cluster.add_nodes(wanted - live, start=added)
            added += wanted - live
        job = f"gpt{len(jobs)}"
        jobs.append(job)
        cluster.apply(job_doc(job, parallelism=PARALLELISM, failurePolicy=scenario.failure_policy))
        world = World(cluster, job, rng)
        for _ in range(400):
            world.act(scenario)
            phase = cluster.status(job).get("phase") or "new"
            if phase == "Succeeded":
                one_pass(session, SETTINGS, cluster, apiserver, job, None)
                break
            kill_after = rng.randint(0, 24) if rng.random() < 0.6 else None
            answer_lost = bool(kill_after) and rng.random() < 0.5
            if one_pass(session, SETTINGS, cluster, apiserver, job, kill_after, answer_lost):
                kills += 1
                killed_in[
                    ", ".join(
                        [phase, *(["lost node"] if world.lost else []), *(["answer lost"] if answer_lost else [])]
                    )
                ] += 1
            iterations += 1
        status = cluster.status(job)
        assert status.get("phase") == "Succeeded", f"{job} {status.get('phase')}: {status.get('message')} {replay}"
        assert status.get("restarts", 0) == scenario.restarts, replay
        assert status.get("layout") == scenario.layout, replay
        if world.spare is not None:
            assert world.spare in {entry["node"] for entry in status["placement"]}, replay
        assert generations_overlapping(apiserver, job) == [], replay
    print(f"{name} kill loop: seed={seed} iterations={iterations} kills={kills} jobs={len(jobs)} in {dict(killed_in)}")
    assert duplicate_pods(apiserver) == [], replay
    assert gpus_oversubscribed(apiserver) == [], replay
