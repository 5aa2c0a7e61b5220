"""The operator's defaults, written once.

`paralleljob operator`'s flags (`commands.operator`) take their defaults from here, so does the reconcile pass's
`Settings` (`handlers.passes`), and the chart's values.yaml states the same numbers, which
tests/chart/test_defaults.py holds equal. Change a default here and in values.yaml together.
"""

from __future__ import annotations

# The trainer image of a job without spec.template.image (the chart's: its trainerImage at the appVersion).
TRAINER_IMAGE = "ghcr.io/paralleljob/trainer:0.1.0"
# The fabric of a job whose spec.network.fabric is auto or absent: detect it from the nodes.
FABRIC = "auto"
# A pod the scheduler refuses, or whose container cannot be created, fails its attempt after this long.
START_TIMEOUT_SECONDS = 600.0
# A pod still ContainerCreating this long after being scheduled (a mount that fails) fails its attempt.
CONTAINER_CREATING_TIMEOUT_SECONDS = 1800.0
# A pod whose image failed to pull this many times fails its attempt, blaming its node.
IMAGE_PULL_RETRIES = 3
# A pod stuck Terminating on a NotReady or deleted node is force-deleted this long after its deletion deadline.
FORCE_DELETE_AFTER_SECONDS = 120.0
# A restarting gang keeps its old nodes (less the one blamed) from other jobs this long.
RESTART_HOLD_SECONDS = 30.0
# Every unfinished placed gang gets a pass this often without an event.
RESYNC_SECONDS = 60.0
# A NotReady node breaks its gang only after this long: Kubernetes' default not-ready toleration.
NOT_READY_GRACE_SECONDS = 300.0
# A node whose gang reports it lost (node rank 0's coordinator no longer hears from it) breaks the gang once its
# Lease in kube-node-lease has gone this long unrenewed (the kubelet renews it every 10 s), without waiting out the
# NotReady grace. 0: the gang's report is not acted on.
LOST_NODE_LEASE_SECONDS = 20.0
# Before Kueue's eviction stops a gang, rank 0 is asked for a checkpoint when its last one is older than this.
KUEUE_CHECKPOINT_GRACE_SECONDS = 300.0
# Prometheus metrics port (0: off).
METRICS_PORT = 9090
# The leader's Lease duration.
LEASE_SECONDS = 15
# Every operator shares one admission lock unless told otherwise, so that releases installed per team and left
# at their defaults take turns. kube-system exists in every cluster, so the default needs no namespace to be
# created first; only this Lease of ours is written there.
ADMISSION_LOCK = "kube-system/paralleljob-admission"
