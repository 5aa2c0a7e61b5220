"""`paralleljob operator`: run the ParallelJob operator (kopf) against the cluster of the kubeconfig or pod.

Flags choose the watched namespaces, the liveness endpoint, the metrics port, logging, the default trainer
image and the default fabric, the admission policy every job is checked against (`api.policy`), the security
context of every job's pods (`manifests.security`) and leader election on a Lease (`k8s.leadership`). The handlers live in `paralleljob.handlers.registry`.
"""

from __future__ import annotations

import argparse
import logging
import re
import socket
from typing import TYPE_CHECKING, Any

from paralleljob import defaults
from paralleljob.api import policy
from paralleljob.manifests import security
from paralleljob.manifests.nccl import FABRICS

if TYPE_CHECKING:
    from paralleljob.k8s import admission_lock, leadership

DEFAULT_ADMISSION_LOCK = defaults.ADMISSION_LOCK
NO_ADMISSION_LOCK = "none"
NAMESPACE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def register(sub: Any) -> None:
    parser = sub.add_parser("operator", help="run the ParallelJob operator (kopf)")
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "-n",
        "--namespace",
        action="append",
        dest="namespaces",
        metavar="NS",
        type=namespace_name,
        help="watch this namespace (repeatable; exact names, no globs)",
    )
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace (default)")
    parser.add_argument(
        "--liveness",
        default="http://0.0.0.0:8080/healthz",
        metavar="URL",
        help="kopf liveness endpoint ('' turns it off)",
    )
    parser.add_argument(
        "--metrics-port", type=int, default=defaults.METRICS_PORT, help="Prometheus metrics port (0: off)"
    )
    parser.add_argument("--log-format", choices=("plain", "full", "json"), default="full")
    parser.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info")
    parser.add_argument(
        "--trainer-image", default=defaults.TRAINER_IMAGE, help="image of jobs without spec.template.image"
    )
    parser.add_argument(
        "--default-fabric",
        choices=("auto", *FABRICS),
        default=defaults.FABRIC,
        help="fabric of jobs with spec.network.fabric: auto (auto: detect from the nodes)",
    )
    parser.add_argument(
        "--default-nccl-env",
        action="append",
        default=[],
        type=nccl_pair,
        metavar="NAME=VALUE",
        help="NCCL variable for every job (repeatable); a job's spec.network.ncclEnv overrides it",
    )
    parser.add_argument(
        "--start-timeout",
        type=positive_seconds,
        default=defaults.START_TIMEOUT_SECONDS,
        metavar="SECONDS",
        help="fail an attempt whose pod stays unschedulable or cannot create its container this long",
    )
    parser.add_argument(
        "--container-creating-timeout",
        type=positive_seconds,
        default=defaults.CONTAINER_CREATING_TIMEOUT_SECONDS,
        metavar="SECONDS",
        help="fail an attempt whose pod is still ContainerCreating this long after being scheduled",
    )
    parser.add_argument(
        "--image-pull-retries",
        type=int,
        default=defaults.IMAGE_PULL_RETRIES,
        metavar="COUNT",
        help="fail an attempt, blaming the node, once a pod's image failed to pull this many times",
    )
    parser.add_argument(
        "--force-delete-after",
        type=positive_seconds,
        default=defaults.FORCE_DELETE_AFTER_SECONDS,
        metavar="SECONDS",
        help="force-delete a pod stuck Terminating on a NotReady or deleted node this long after its deletion "
        "was asked",
    )
    parser.add_argument(
        "--not-ready-grace",
        type=nonnegative_seconds,
        default=defaults.NOT_READY_GRACE_SECONDS,
        metavar="SECONDS",
        help="a NotReady node breaks its gang only after this long, unless its pods fail first "
        "(default: Kubernetes' not-ready toleration)",
    )
    parser.add_argument(
        "--lost-node-lease",
        type=nonnegative_seconds,
        default=defaults.LOST_NODE_LEASE_SECONDS,
        metavar="SECONDS",
        help="a node its gang reports lost breaks the gang once its Lease in kube-node-lease has gone this long "
        "unrenewed, without the NotReady grace (0: the gang's report is not acted on)",
    )
    parser.add_argument(
        "--slow-node-label",
        default="",
        metavar="KEY",
        help="label a node named slow (a straggler, the SlowNode Event) KEY=true for administrators; needs patch "
        "on Nodes (chart: slowNodeLabel.enabled). Default: no label",
    )
    parser.add_argument(
        "--resync-period",
        type=positive_seconds,
        default=defaults.RESYNC_SECONDS,
        metavar="SECONDS",
        help="look at every unfinished placed job this often even without a watch event",
    )
    add_policy_flags(parser)
    add_pod_security_flags(parser)
    parser.add_argument(
        "--restart-hold",
        type=nonnegative_seconds,
        default=defaults.RESTART_HOLD_SECONDS,
        metavar="SECONDS",
        help="a restarting gang keeps its old nodes (less the one blamed) from other jobs this long (0: not at all)",
    )
    parser.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: in-cluster, then KUBECONFIG)")
    add_kueue_flags(parser)
    add_leader_election_flags(parser)
    parser.set_defaults(run=run)


def add_kueue_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("Kueue (jobs labelled kueue.x-k8s.io/queue-name; docs/install.md)")
    group.add_argument(
        "--kueue",
        action="store_true",
        help="queue jobs labelled kueue.x-k8s.io/queue-name through Kueue and watch their Workloads (needs the "
        "chart's kueue.enabled RBAC); without it such a job waits, Queued with the reason KueueNotEnabled",
    )
    group.add_argument(
        "--kueue-checkpoint-grace",
        type=nonnegative_seconds,
        default=defaults.KUEUE_CHECKPOINT_GRACE_SECONDS,
        metavar="SECONDS",
        help="before Kueue's eviction stops a gang, ask rank 0 for a checkpoint when its last one is older than "
        "this (it waits 120 s for it at most)",
    )


def add_leader_election_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("leader election (one active replica per Lease; the chart turns it on)")
    group.add_argument(
        "--leader-elect",
        action="store_true",
        help="act only while holding a coordination.k8s.io Lease; a replica without it stands by",
    )
    group.add_argument(
        "--leader-election-namespace",
        default=None,
        metavar="NS",
        type=namespace_name,
        help="namespace of the Lease (default: the operator's own namespace)",
    )
    group.add_argument(
        "--leader-election-lease",
        default="paralleljob-operator",
        metavar="NAME",
        help="name of the Lease; the replicas of one operator share it",
    )
    group.add_argument(
        "--lease-seconds",
        type=int,
        default=defaults.LEASE_SECONDS,
        metavar="SECONDS",
        help="Lease duration (at least 3); a leader that cannot renew within 2/3 of it exits",
    )
    group.add_argument(
        "--admission-lock",
        default=DEFAULT_ADMISSION_LOCK,
        metavar="NS[/NAME]",
        help="take this coordination.k8s.io Lease (name default paralleljob-admission) around every admission, "
        "so that operators installed per namespace never plan onto the same free GPUs at once; every operator of "
        f"the cluster must name the same one (default: {DEFAULT_ADMISSION_LOCK}, as the chart's; "
        f"'{NO_ADMISSION_LOCK}' for no lock)",
    )
    # kopf's peering pauses kopf's handlers only, not the operator's informers, timers and admission worker,
    # and pauses every replica when they share a priority: it never made several replicas safe.
    group.add_argument("--peering", default=None, help=argparse.SUPPRESS)


def lease_settings(args: argparse.Namespace) -> leadership.LeaseSettings | None:
    """The Lease of `--leader-elect`, announcing the namespaces this operator manages; None without it."""
    if not args.leader_elect:
        return None
    from paralleljob.k8s import leadership  # imported here: other subcommands must not pay for the client

    namespace = args.leader_election_namespace or leadership.own_namespace()
    managed = tuple(args.namespaces) if args.namespaces else None
    lock = admission_lock_settings(args)
    return leadership.LeaseSettings.timed(
        args.leader_election_lease, namespace, args.lease_seconds, managed, lock.where if lock else ""
    )


def admission_lock_settings(args: argparse.Namespace) -> admission_lock.LockSettings | None:
    """The Lease of `--admission-lock`; None with `--admission-lock=none`."""
    if args.admission_lock.strip() == NO_ADMISSION_LOCK:
        return None
    from paralleljob.k8s import admission_lock  # imported here: other subcommands must not pay for the client

    try:
        return admission_lock.LockSettings.parse(args.admission_lock)
    except ValueError as error:
        raise SystemExit(f"paralleljob operator: {error}") from None


def add_policy_flags(parser: argparse.ArgumentParser) -> None:
    """The admission policy: comma-separated lists; an empty value is an empty list."""
    group = parser.add_argument_group("admission policy (what a ParallelJob may ask of its pods)")
    lists = (
        ("--allowed-volume-types", policy.DEFAULT_VOLUME_TYPES, "volume types of template and checkpoint volumes"),
        ("--allowed-service-accounts", policy.DEFAULT_SERVICE_ACCOUNTS, "accounts spec.template may name"),
        ("--forbidden-env", policy.DEFAULT_FORBIDDEN_ENV, "env names or PREFIX* patterns a job may not set"),
        ("--allowed-priority-classes", (), "priority classes spec.template may name"),
        ("--allowed-metadata-domains", policy.DEFAULT_METADATA_DOMAINS, "key domains of template labels/annotations"),
    )
    for flag, default, what in lists:
        group.add_argument(
            flag, type=comma_list, default=tuple(default), metavar="A,B", help=f"{what} (default: {','.join(default)})"
        )


def add_pod_security_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("pod security (what every job's pods run as)")
    defaults = security.PodSecurity()
    group.add_argument("--pod-run-as-user", type=int, default=defaults.run_as_user, metavar="UID")
    group.add_argument("--pod-run-as-group", type=int, default=defaults.run_as_group, metavar="GID")
    group.add_argument("--pod-fs-group", type=int, default=defaults.fs_group, metavar="GID", help="owner of volumes")
    group.add_argument(
        "--pod-read-only-root-filesystem",
        action=argparse.BooleanOptionalAction,
        default=defaults.read_only_root_filesystem,
        help="read-only root filesystem, with emptyDirs at /tmp and $HOME",
    )
    group.add_argument(
        "--rdma-ipc-lock",
        action=argparse.BooleanOptionalAction,
        default=defaults.rdma_ipc_lock,
        help="add IPC_LOCK to pods using RDMA devices (off: the runtime's RLIMIT_MEMLOCK must be unlimited)",
    )


def comma_list(text: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in text.split(",") if item.strip())


def policy_of(args: argparse.Namespace) -> policy.AdmissionPolicy:
    return policy.AdmissionPolicy(
        volume_types=args.allowed_volume_types,
        service_accounts=args.allowed_service_accounts,
        forbidden_env=args.forbidden_env,
        priority_classes=args.allowed_priority_classes,
        metadata_domains=args.allowed_metadata_domains,
    )


def pod_security_of(args: argparse.Namespace) -> security.PodSecurity:
    return security.PodSecurity(
        run_as_user=args.pod_run_as_user,
        run_as_group=args.pod_run_as_group,
        fs_group=args.pod_fs_group,
        read_only_root_filesystem=args.pod_read_only_root_filesystem,
        rdma_ipc_lock=args.rdma_ipc_lock,
    )


def nccl_pair(text: str) -> tuple[str, str]:
    """NAME=VALUE, split at the first '=' (values may hold '=', as NCCL_IB_HCA==mlx5_0 does)."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=VALUE, e.g. NCCL_DEBUG=INFO")
    return name, value


def namespace_name(text: str) -> str:
    """An exact namespace name. Globs are refused: the operator lists jobs by namespace name, so a pattern
    would silently match nothing."""
    if not NAMESPACE_NAME.match(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a namespace name (a DNS-1123 label); globs and negations are not supported: "
            "repeat --namespace for each namespace, or use --all-namespaces"
        )
    return text


def _seconds(text: str, *, zero_allowed: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value < 0 or (value == 0 and not zero_allowed):
        expected = "a number of seconds, 0 or more" if zero_allowed else "a positive number of seconds"
        raise argparse.ArgumentTypeError(f"{text!r}: expected {expected}")
    return value


def nonnegative_seconds(text: str) -> float:
    return _seconds(text, zero_allowed=True)


def positive_seconds(text: str) -> float:
    return _seconds(text, zero_allowed=False)


def run(args: argparse.Namespace) -> int:
    import kopf  # imported here: other subcommands must not pay for kopf

    from paralleljob.handlers import reconcile, registry

    if args.peering is not None:
        raise SystemExit(
            "paralleljob operator: --peering is not supported (kopf peering pauses kopf's handlers, not the "
            "operator's timers and admission worker): run replicas with --leader-elect"
        )
    namespaces = tuple(args.namespaces) if args.namespaces else None
    settings = reconcile.Settings(
        image=args.trainer_image,
        default_fabric=args.default_fabric,
        default_nccl_env=tuple(args.default_nccl_env),
        namespaces=namespaces,
        start_timeout_seconds=args.start_timeout,
        container_creating_timeout_seconds=args.container_creating_timeout,
        image_pull_retries=max(1, args.image_pull_retries),
        force_delete_after_seconds=args.force_delete_after,
        admission_policy=policy_of(args),
        pod_security=pod_security_of(args),
        restart_hold_seconds=args.restart_hold,
        not_ready_grace_seconds=args.not_ready_grace,
        lost_node_lease_seconds=args.lost_node_lease,
        slow_node_label=args.slow_node_label,
        resync_seconds=args.resync_period,
        kueue=args.kueue,
        kueue_checkpoint_grace_seconds=args.kueue_checkpoint_grace,
    )
    registry.configure(
        settings,
        metrics_port=args.metrics_port,
        kubeconfig=args.kubeconfig,
        lease=lease_settings(args),
        admission_lock=admission_lock_settings(args),
    )
    kopf.configure(
        debug=args.log_level == "debug",
        verbose=args.log_level in ("debug", "info"),
        log_format={"plain": kopf.LogFormat.PLAIN, "full": kopf.LogFormat.FULL, "json": kopf.LogFormat.JSON}[
            args.log_format
        ],
    )
    logging.getLogger().setLevel(args.log_level.upper())
    kopf.run(
        standalone=True,  # one active replica comes from the Lease (--leader-elect), not from kopf's peering
        namespaces=list(namespaces or ()),
        clusterwide=namespaces is None,
        liveness_endpoint=args.liveness or None,
        # kopf's default identity is user@host, and the user is looked up in /etc/passwd, where the image's
        # numeric user (65532, as runAsNonRoot wants it) has no entry: the lookup fails and the operator exits.
        identity=f"paralleljob@{socket.gethostname()}",  # type: ignore[arg-type]  # kopf does not export its Identity NewType
    )
    return 0
