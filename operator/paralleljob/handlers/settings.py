"""The operator's settings (`Settings`), from its command line: what every pass decides with.

Pure. `commands.operator` builds it; `handlers.passes` re-exports it for the passes.
"""

from __future__ import annotations

import dataclasses

from paralleljob import defaults
from paralleljob.api import policy
from paralleljob.manifests import security


@dataclasses.dataclass(frozen=True)
class Settings:
    """Operator-wide settings from the command line; the defaults are `paralleljob.defaults`'."""

    image: str = defaults.TRAINER_IMAGE
    default_fabric: str = defaults.FABRIC
    # NCCL variables every job gets unless its spec.network.ncclEnv sets the same name.
    default_nccl_env: tuple[tuple[str, str], ...] = ()
    namespaces: tuple[str, ...] | None = None  # None: all namespaces
    # A pod the scheduler refuses, or whose container cannot be created, fails its attempt after this long
    # (from the API server's times: `handlers.start_failures`).
    start_timeout_seconds: float = defaults.START_TIMEOUT_SECONDS
    # A pod still ContainerCreating this long after being scheduled (a mount that fails) fails its attempt.
    container_creating_timeout_seconds: float = defaults.CONTAINER_CREATING_TIMEOUT_SECONDS
    # A pod whose image failed to pull this many times fails its attempt, blaming its node.
    image_pull_retries: int = defaults.IMAGE_PULL_RETRIES
    # A pod stuck Terminating on a NotReady or deleted node is force-deleted this long after its deletion
    # deadline (deletionTimestamp): its kubelet cannot confirm that the containers stopped.
    force_delete_after_seconds: float = defaults.FORCE_DELETE_AFTER_SECONDS
    # What a job may ask of its pods, and what its pods run as: the administrator's, never the job's.
    admission_policy: policy.AdmissionPolicy = dataclasses.field(default_factory=policy.AdmissionPolicy)
    pod_security: security.PodSecurity = dataclasses.field(default_factory=security.PodSecurity)
    # A restarting gang keeps its old nodes (less the one blamed) from other jobs this long.
    restart_hold_seconds: float = defaults.RESTART_HOLD_SECONDS
    # Every unfinished placed gang gets a pass this often without an event, so a watch event missed while a
    # watch restarted (a deleted pod, a lost node) cannot strand it; a pass over a quiet gang writes nothing.
    resync_seconds: float = defaults.RESYNC_SECONDS
    # A NotReady node breaks its gang only after this long (Kubernetes' default not-ready toleration), unless
    # its pods fail first: a kubelet that misses a few heartbeats does not cost a gang restart.
    not_ready_grace_seconds: float = defaults.NOT_READY_GRACE_SECONDS
    # A node its gang reports lost breaks the gang at once when its Lease has gone this long unrenewed: two
    # signals, so a blip of either costs nothing (`handlers.lost_peers`); 0: the gang's report is not acted on.
    lost_node_lease_seconds: float = defaults.LOST_NODE_LEASE_SECONDS
    # The label key (set to "true") on a node the operator names slow, for administrators; "": none.
    slow_node_label: str = ""
    # Kueue (`handlers.queueing`): watch the Workloads of jobs labelled with a queue; before an evicted gang
    # stops, ask rank 0 for a checkpoint when its last one is older than this.
    kueue: bool = False
    kueue_checkpoint_grace_seconds: float = defaults.KUEUE_CHECKPOINT_GRACE_SECONDS
