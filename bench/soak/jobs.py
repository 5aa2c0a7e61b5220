"""The ParallelJob documents the soak streams in, one builder per kind of `schedule.JOBS`: the quickstart's small
GPT, on kwok's nodes (pool=fake: their pods are Running and never train) or on the process kubelet's (pool=real:
the trainer runs and checkpoints). Pure; called by `run`.
"""

from __future__ import annotations

import copy
from typing import Any

from testcluster.quickstart import cluster_quickstart

FAKE, REAL, QUEUED = "soak", "soak-real", "soak-queued"
NAMESPACES = (FAKE, REAL, QUEUED)
QUEUE = "soak"
CLAIM = "soak-checkpoints"
REAL_STEPS, REAL_CHECKPOINT_EVERY = 12, 4
FAKE_GPUS_PER_NODE = 8


def namespace_of(kind: str) -> str:
    return {"real": REAL, "kueue": QUEUED}.get(kind, FAKE)


def document(kind: str, name: str) -> dict[str, Any]:
    """The job of `kind` named `name` in its namespace (`namespace_of`)."""
    job = copy.deepcopy(cluster_quickstart(REAL_STEPS, REAL_CHECKPOINT_EVERY))
    job["metadata"] = {"name": name, "namespace": namespace_of(kind), "labels": {"soak/kind": kind}}
    spec = job["spec"]
    spec["failurePolicy"] = {"backoffLimit": 20}
    if kind == "real":
        spec["parallelism"] = {"pipeline": 1, "tensor": 1, "data": 2}
        spec["gpusPerNode"] = 2
        spec["checkpoint"]["volume"] = {"persistentVolumeClaim": {"claimName": CLAIM}}
        spec["template"] = {"nodeSelector": {"pool": "real"}}
        return job
    spec["checkpoint"]["volume"] = {"emptyDir": {}}
    spec["template"] = {"nodeSelector": {"pool": "fake"}}
    spec["gpusPerNode"] = FAKE_GPUS_PER_NODE
    spec["parallelism"] = {"pipeline": 1, "tensor": 1, "data": 16}
    if kind == "invalid":
        spec["parallelism"] = {"pipeline": 1, "tensor": 3, "data": 8}  # 4 attention heads do not split in 3
    elif kind == "budget":
        spec["parallelism"] = {"gpus": 16}
        spec["deepspeed"] = {k: v for k, v in spec["deepspeed"].items() if "micro" not in k and "accumulation" not in k}
        spec["deepspeed"]["train_batch_size"] = 256
    elif kind == "kueue":
        job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = QUEUE
    elif kind == "spares":
        spec["failurePolicy"]["spareNodes"] = 1
    elif kind == "shrink":
        spec["parallelism"]["data"] = 32
        spec["failurePolicy"].update(allowDataShrink=True, minData=8)
    return job
