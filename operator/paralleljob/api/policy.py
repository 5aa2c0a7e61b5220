"""The administrator's admission policy: what a ParallelJob may ask of the pods the operator creates for it.

Pure. Creating a ParallelJob makes the operator create pods, so a user who may create ParallelJobs but not pods
must not get, through the job, what a pod would give: a hostPath volume, a Secret, another ServiceAccount's
token, code injected through the dynamic loader, a priority class that preempts other teams, or annotations that
change how the node confines the container (AppArmor, seccomp). The operator checks every job against its
`AdmissionPolicy` (set by `paralleljob operator` flags, chart values `policy.*`) before it creates anything; a
job outside it is `Valid=False` with one `spec.path: message` per finding, naming the rule.

Secrets are governed by the volume type `secret`: it allows secret volumes, secret sources of projected
volumes and `valueFrom.secretKeyRef` in env alike. hostPath is allowed only when listed as a volume type.
A ParallelJob has no field for host networking, host PID/IPC or privileged containers, so those are never
possible. The chart's optional ValidatingAdmissionPolicy enforces the same rules at `kubectl apply`.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from paralleljob.api import rules
from paralleljob.api import types as t
from paralleljob.api.problems import Problem, error

DEFAULT_VOLUME_TYPES = ("configMap", "emptyDir", "persistentVolumeClaim", "ephemeral", "projected")
DEFAULT_SERVICE_ACCOUNTS = ("default",)
DEFAULT_FORBIDDEN_ENV = ("LD_*",)
DEFAULT_METADATA_DOMAINS = ("app.kubernetes.io",)
# Sources of a projected volume that expose nothing a pod of the job does not already have.
HARMLESS_PROJECTIONS = frozenset({"configMap", "downwardAPI", "serviceAccountToken", "clusterTrustBundle"})
SECRET = "secret"
ASK = "ask the cluster administrator to change the ParallelJob policy if you need it"


@dataclasses.dataclass(frozen=True)
class AdmissionPolicy:
    """What the administrator allows. Empty `priority_classes`: a job may name none (the cluster default)."""

    volume_types: tuple[str, ...] = DEFAULT_VOLUME_TYPES
    # Besides these, a job may leave serviceAccountName unset and get its per-job progress account.
    service_accounts: tuple[str, ...] = DEFAULT_SERVICE_ACCOUNTS
    # Names or `PREFIX*` patterns, for spec.template.env and spec.network.ncclEnv.
    forbidden_env: tuple[str, ...] = DEFAULT_FORBIDDEN_ENV
    priority_classes: tuple[str, ...] = ()
    # Domains (and their subdomains) allowed as key prefixes of template labels and annotations; keys without a
    # prefix are always allowed.
    metadata_domains: tuple[str, ...] = DEFAULT_METADATA_DOMAINS


def check_policy(spec: t.ParallelJobSpec, policy: AdmissionPolicy) -> list[Problem]:
    """Every finding of the policy in this spec."""
    return [
        *_volume_problems(spec, policy),
        *_secret_env_problems(spec, policy),
        *_service_account_problems(spec, policy),
        *_env_problems(spec, policy),
        *_priority_problems(spec, policy),
        *_metadata_problems(spec, policy),
    ]


def _allowed(items: Sequence[str]) -> str:
    return ", ".join(items) if items else "none"


def volume_type(volume: Mapping[str, Any]) -> str:
    """The source type of a volume: its one key besides `name`."""
    keys = [key for key in volume if key != "name"]
    return keys[0] if len(keys) == 1 else "+".join(sorted(keys)) or "none"


def _volumes(spec: t.ParallelJobSpec) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for index, volume in enumerate(spec.template.volumes or ()):
        yield f"spec.template.volumes[{index}]", volume
    if spec.checkpoint is not None and spec.checkpoint.volume:
        yield "spec.checkpoint.volume", spec.checkpoint.volume


def _volume_problems(spec: t.ParallelJobSpec, policy: AdmissionPolicy) -> Iterator[Problem]:
    for path, volume in _volumes(spec):
        kind = volume_type(volume)
        if kind not in policy.volume_types:
            yield error(
                f"{path}.{kind}",
                f"{kind} volumes are not allowed by the ParallelJob policy (volume types allowed: "
                f"{_allowed(policy.volume_types)}); {ASK}.",
            )
        elif kind == "projected" and SECRET not in policy.volume_types:
            yield from _projected_secrets(f"{path}.projected", volume["projected"])


def _projected_secrets(path: str, projected: Any) -> Iterator[Problem]:
    sources = projected.get("sources") if isinstance(projected, Mapping) else None
    for index, source in enumerate(sources or ()):
        for kind in source if isinstance(source, Mapping) else ():
            if kind not in HARMLESS_PROJECTIONS:
                yield error(
                    f"{path}.sources[{index}].{kind}",
                    f"projecting a {kind} is not allowed by the ParallelJob policy (projected sources allowed: "
                    f"{', '.join(sorted(HARMLESS_PROJECTIONS))}); {ASK}.",
                )


def _secret_env_problems(spec: t.ParallelJobSpec, policy: AdmissionPolicy) -> Iterator[Problem]:
    if SECRET in policy.volume_types:
        return
    for index, item in enumerate(spec.template.env or ()):
        source = item.get("valueFrom")
        if isinstance(source, Mapping) and "secretKeyRef" in source:
            yield error(
                f"spec.template.env[{index}].valueFrom.secretKeyRef",
                f"reading Secrets is not allowed by the ParallelJob policy (volume type {SECRET} not allowed); {ASK}.",
            )


def _not_allowed(path: str, value: str | None, allowed: Sequence[str], what: str, unset: str = "") -> Iterator[Problem]:
    """A named value (an account, a PriorityClass) the policy does not list."""
    if value is not None and value not in allowed:
        yield error(
            path,
            f"{value} is not allowed by the ParallelJob policy ({what} allowed: {_allowed(allowed)}{unset}); {ASK}.",
        )


def _service_account_problems(spec: t.ParallelJobSpec, policy: AdmissionPolicy) -> Iterator[Problem]:
    account, unset = spec.template.service_account_name, ", or leave it unset for the per-job account"
    yield from _not_allowed("spec.template.serviceAccountName", account, policy.service_accounts, "accounts", unset)


def forbidden_env_pattern(name: str, policy: AdmissionPolicy) -> str | None:
    """The pattern of `policy.forbidden_env` that `name` matches, or None."""
    return next((pattern for pattern in policy.forbidden_env if fnmatch.fnmatchcase(name, pattern)), None)


def _env_names(spec: t.ParallelJobSpec) -> Iterator[tuple[str, str]]:
    for index, item in enumerate(spec.template.env or ()):
        yield f"spec.template.env[{index}].name", str(item.get("name", ""))
    for name in spec.network.nccl_env or {}:
        yield f"spec.network.ncclEnv.{name}", name


def _env_problems(spec: t.ParallelJobSpec, policy: AdmissionPolicy) -> Iterator[Problem]:
    for path, name in _env_names(spec):
        pattern = forbidden_env_pattern(name, policy)
        if pattern is not None:
            yield error(path, f"{name} is forbidden by the ParallelJob policy (forbidden env: {pattern}); {ASK}.")


def _priority_problems(spec: t.ParallelJobSpec, policy: AdmissionPolicy) -> Iterator[Problem]:
    name = spec.template.priority_class_name
    yield from _not_allowed("spec.template.priorityClassName", name, policy.priority_classes, "priority classes")


def domain_allowed(key: str, policy: AdmissionPolicy) -> bool:
    """Whether a label or annotation key's prefix is an allowed domain or a subdomain of one."""
    domain, slash, _ = key.partition("/")
    if not slash:
        return True
    return any(domain == allowed or domain.endswith("." + allowed) for allowed in policy.metadata_domains)


def _metadata_problems(spec: t.ParallelJobSpec, policy: AdmissionPolicy) -> Iterator[Problem]:
    for kind, keys in (("labels", spec.template.labels), ("annotations", spec.template.annotations)):
        # The operator's own keys are refused by the API's rules, whatever the policy.
        refused = sorted(k for k in keys or {} if not domain_allowed(k, policy) and not rules.is_operator_key(k))
        if refused:
            yield error(
                f"spec.template.{kind}",
                f"{', '.join(refused)}: key domains not allowed by the ParallelJob policy (domains allowed: "
                f"{_allowed(policy.metadata_domains)}, and keys without a domain); {ASK}.",
            )
