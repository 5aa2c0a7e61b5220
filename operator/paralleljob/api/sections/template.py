"""spec.template: what the pods get beyond the operator's own (resources, tolerations, env, volumes, claims),
the volume and env sources the CRD declares for CEL, and the metadata keys the operator owns.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Literal

from paralleljob.api.fields import RawObject, api_field
from paralleljob.api.problems import Problem, error
from paralleljob.api.rule import Rule

if TYPE_CHECKING:
    from paralleljob.api import types as t

# Every volume source of a core/v1 Volume. The CRD declares them (as preserved objects) so that CEL, in the
# chart's ValidatingAdmissionPolicy, can see which one a volume uses: fields preserved as unknown are invisible
# to CEL. The projected sources a volume can combine are declared for the same reason.
VOLUME_SOURCES = (
    "awsElasticBlockStore", "azureDisk", "azureFile", "cephfs", "cinder", "configMap", "csi", "downwardAPI",
    "emptyDir", "ephemeral", "fc", "flexVolume", "flocker", "gcePersistentDisk", "gitRepo", "glusterfs",
    "hostPath", "image", "iscsi", "nfs", "persistentVolumeClaim", "photonPersistentDisk", "portworxVolume",
    "projected", "quobyte", "rbd", "scaleIO", "secret", "storageos", "vsphereVolume",
)  # fmt: skip


PROJECTED_SOURCES = (
    "clusterTrustBundle",
    "configMap",
    "downwardAPI",
    "podCertificate",
    "secret",
    "serviceAccountToken",
)


PRESERVED: dict[str, Any] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}


def _volume_source_properties() -> dict[str, Any]:
    sources = {name: {**PRESERVED, "description": f"A {name} volume source."} for name in VOLUME_SOURCES}
    projection = {name: {**PRESERVED, "description": f"A {name} projection."} for name in PROJECTED_SOURCES}
    sources["projected"] = {
        **PRESERVED,
        "description": "A projected volume source.",
        "properties": {
            "sources": {
                "type": "array",
                "description": "The projections.",
                "items": {**PRESERVED, "properties": projection},
            }
        },
    }
    return sources


VOLUME_SOURCE_PROPERTIES = _volume_source_properties()


VOLUME_KNOWN_PROPERTIES: dict[str, Any] = {
    "name": {"type": "string", "description": "Volume name."},
    **VOLUME_SOURCE_PROPERTIES,
}


ENV_KNOWN_PROPERTIES: dict[str, Any] = {
    "name": {"type": "string", "description": "Variable name."},
    "valueFrom": {
        **PRESERVED,
        "description": "Where the value comes from.",
        "properties": {"secretKeyRef": {**PRESERVED, "description": "A key of a Secret."}},
    },
}


@dataclasses.dataclass(frozen=True)
class PodResourceClaim:
    """One dynamic resource claim of every pod (a Kubernetes PodResourceClaim)."""

    name: str = api_field(
        "Name of the claim in the pod; the training container lists it in resources.claims.",
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        max_length=63,
    )
    resource_claim_template_name: str | None = api_field(
        "ResourceClaimTemplate each pod gets its own claim from, e.g. the channel template of a ComputeDomain "
        "(its spec.channel.resourceClaimTemplate.name).",
        default=None,
        json_name="resourceClaimTemplateName",
    )
    resource_claim_name: str | None = api_field(
        "An existing ResourceClaim that every pod shares.", default=None, json_name="resourceClaimName"
    )


@dataclasses.dataclass(frozen=True)
class PodTemplate:
    """What every pod of the job gets besides what the operator derives."""

    image: str | None = api_field(
        "Container image with the trainer (or your script). Default: the operator's configured trainer image.",
        default=None,
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = api_field(
        "Image pull policy of the training container.", default=None
    )
    resources: RawObject | None = api_field(
        "Extra resource requests and limits ({requests: {cpu: ..., memory: ...}, limits: {...}}). "
        "nvidia.com/gpu and the RDMA resource are set by the operator.",
        default=None,
    )
    node_selector: dict[str, str] | None = api_field(
        "Only nodes with all of these labels are considered by the planner and the scheduler.", default=None
    )
    tolerations: list[RawObject] | None = api_field(
        "Tolerations of the pods; the planner skips nodes whose NoSchedule/NoExecute taints are not tolerated.",
        default=None,
    )
    env: list[RawObject] | None = api_field(
        "Extra environment variables of the training container.", default=None, schema_properties=ENV_KNOWN_PROPERTIES
    )
    volumes: list[RawObject] | None = api_field(
        "Extra pod volumes (e.g. the training data). The operator's admission policy lists the volume types allowed.",
        default=None,
        schema_properties=VOLUME_KNOWN_PROPERTIES,
    )
    volume_mounts: list[RawObject] | None = api_field(
        "Where the extra volumes are mounted in the training container.", default=None
    )
    service_account_name: str | None = api_field(
        "ServiceAccount of the pods. Default: a per-job account, mounted on node rank 0 only, that may only update "
        "this job's progress ConfigMap (<name>-progress). The operator's admission policy lists the accounts "
        "a job may name.",
        default=None,
    )
    priority_class_name: str | None = api_field("PriorityClass of the pods.", default=None)
    labels: dict[str, str] | None = api_field("Extra labels of the pods.", default=None)
    annotations: dict[str, str] | None = api_field("Extra annotations of the pods.", default=None)
    resource_claims: list[PodResourceClaim] | None = api_field(
        "Dynamic resource claims of every pod, e.g. a ComputeDomain's IMEX channel or DRA network devices; "
        "each is also given to the training container (resources.claims).",
        default=None,
    )


# Metadata keys the operator sets on every pod and selects its pods by: the paralleljob.io domain (and its
# subdomains) and app.kubernetes.io/managed-by. A user key there would blind the operator to its own pods, or
# to another job's.
OPERATOR_DOMAIN = "paralleljob.io"


MANAGED_BY_KEY = "app.kubernetes.io/managed-by"


_OWNED_KEY_CEL = "k.matches('^([^/]*[.])?paralleljob[.]io/') || k == 'app.kubernetes.io/managed-by'"


def is_operator_key(key: str) -> bool:
    """Whether a label or annotation key belongs to the operator (its domain, or app.kubernetes.io/managed-by)."""
    domain, slash, _ = key.partition("/")
    owned_domain = bool(slash) and (domain == OPERATOR_DOMAIN or domain.endswith("." + OPERATOR_DOMAIN))
    return owned_domain or key == MANAGED_BY_KEY


def _operator_keys(kind: str, keys: dict[str, str] | None) -> Problem | None:
    owned = sorted(key for key in keys or {} if is_operator_key(key))
    if not owned:
        return None
    return error(
        f"spec.template.{kind}",
        f"{', '.join(owned)}: keys in the {OPERATOR_DOMAIN}/ domain and {MANAGED_BY_KEY} are set by the "
        "operator, which finds its pods by them; remove them or use a key of your own domain.",
    )


def _operator_labels(spec: t.ParallelJobSpec) -> Problem | None:
    return _operator_keys("labels", spec.template.labels)


def _operator_annotations(spec: t.ParallelJobSpec) -> Problem | None:
    return _operator_keys("annotations", spec.template.annotations)


def _metadata_cel(kind: str) -> str:
    return f"!has(self.template) || !has(self.template.{kind}) || self.template.{kind}.all(k, !({_OWNED_KEY_CEL}))"


RULES: tuple[Rule, ...] = (
    Rule(
        "operator-owned-labels",
        ".template.labels",
        _metadata_cel("labels"),
        "labels in the paralleljob.io/ domain and app.kubernetes.io/managed-by are set by the operator",
        _operator_labels,
    ),
    Rule(
        "operator-owned-annotations",
        ".template.annotations",
        _metadata_cel("annotations"),
        "annotations in the paralleljob.io/ domain and app.kubernetes.io/managed-by are set by the operator",
        _operator_annotations,
    ),
)
