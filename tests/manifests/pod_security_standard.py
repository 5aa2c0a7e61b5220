"""The Kubernetes Pod Security Standards (kubernetes.io/docs/concepts/security/pod-security-standards, as of
Kubernetes 1.34) as a table of rules over a pod dict, for the tests: no Python library implements them (Pod
Security admission is Go code in the API server), so each control of the "baseline" and "restricted" levels
is one function here, named as the standard names it. `violations(pod, level)` lists what a level refuses.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal

Level = Literal["baseline", "restricted"]
Pod = Mapping[str, Any]

BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    }
)
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})
RESTRICTED_VOLUMES = frozenset(
    {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"}
)
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"


def containers(pod: Pod) -> Iterator[Mapping[str, Any]]:
    spec = pod["spec"]
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from spec.get(key) or ()


def _context(container: Mapping[str, Any]) -> Mapping[str, Any]:
    return container.get("securityContext") or {}


def _pod_context(pod: Pod) -> Mapping[str, Any]:
    return pod["spec"].get("securityContext") or {}


# -- baseline ----------------------------------------------------------------------------------------------


def host_process(pod: Pod) -> str | None:
    contexts = [_pod_context(pod), *(_context(c) for c in containers(pod))]
    if any((ctx.get("windowsOptions") or {}).get("hostProcess") for ctx in contexts):
        return "windowsOptions.hostProcess must not be true"
    return None


def host_namespaces(pod: Pod) -> str | None:
    used = [key for key in ("hostNetwork", "hostPID", "hostIPC") if pod["spec"].get(key)]
    return f"{', '.join(used)} must not be true" if used else None


def privileged_containers(pod: Pod) -> str | None:
    return "privileged must not be true" if any(_context(c).get("privileged") for c in containers(pod)) else None


def capabilities_baseline(pod: Pod) -> str | None:
    added = {cap for c in containers(pod) for cap in (_context(c).get("capabilities") or {}).get("add") or ()}
    extra = sorted(added - BASELINE_CAPABILITIES)
    return f"capabilities {', '.join(extra)} are beyond the baseline set" if extra else None


def host_path_volumes(pod: Pod) -> str | None:
    used = [v["name"] for v in pod["spec"].get("volumes") or () if "hostPath" in v]
    return f"hostPath volumes {used}" if used else None


def host_ports(pod: Pod) -> str | None:
    ports = [p.get("hostPort") for c in containers(pod) for p in c.get("ports") or () if p.get("hostPort")]
    return f"hostPorts {ports}" if ports else None


def apparmor(pod: Pod) -> str | None:
    profiles = [
        _pod_context(pod).get("appArmorProfile"),
        *(_context(c).get("appArmorProfile") for c in containers(pod)),
    ]
    if any(p and p.get("type") not in ("RuntimeDefault", "Localhost") for p in profiles):
        return "appArmorProfile.type must be RuntimeDefault or Localhost"
    annotations = pod["metadata"].get("annotations") or {}
    bad = [k for k, v in annotations.items() if k.startswith(APPARMOR_ANNOTATION) and not _apparmor_ok(v)]
    return f"AppArmor annotations {bad} must be runtime/default or localhost/*" if bad else None


def _apparmor_ok(value: str) -> bool:
    return value == "runtime/default" or value.startswith("localhost/")


def selinux(pod: Pod) -> str | None:
    options = [_pod_context(pod).get("seLinuxOptions"), *(_context(c).get("seLinuxOptions") for c in containers(pod))]
    for found in filter(None, options):
        if found.get("type", "") not in SELINUX_TYPES or found.get("user") or found.get("role"):
            return "seLinuxOptions may set only an allowed type"
    return None


def proc_mount(pod: Pod) -> str | None:
    bad = [c["name"] for c in containers(pod) if _context(c).get("procMount", "Default") != "Default"]
    return f"procMount of {bad} must be Default" if bad else None


def seccomp_baseline(pod: Pod) -> str | None:
    profiles = [_pod_context(pod).get("seccompProfile"), *(_context(c).get("seccompProfile") for c in containers(pod))]
    return (
        "seccompProfile must not be Unconfined" if any(p and p.get("type") == "Unconfined" for p in profiles) else None
    )


def sysctls(pod: Pod) -> str | None:
    unsafe = [s.get("name") for s in _pod_context(pod).get("sysctls") or () if s.get("name") not in SAFE_SYSCTLS]
    return f"unsafe sysctls {unsafe}" if unsafe else None


# -- restricted --------------------------------------------------------------------------------------------


def volume_types(pod: Pod) -> str | None:
    bad = [v["name"] for v in pod["spec"].get("volumes") or () if not set(v) - {"name"} <= RESTRICTED_VOLUMES]
    return f"volumes {bad} are of types restricted does not allow" if bad else None


def privilege_escalation(pod: Pod) -> str | None:
    bad = [c["name"] for c in containers(pod) if _context(c).get("allowPrivilegeEscalation") is not False]
    return f"allowPrivilegeEscalation of {bad} must be false" if bad else None


def running_as_non_root(pod: Pod) -> str | None:
    pod_level = _pod_context(pod).get("runAsNonRoot")
    for c in containers(pod):
        own = _context(c).get("runAsNonRoot")
        if own is False or (own is None and pod_level is not True):
            return f"runAsNonRoot of {c['name']} must be true"
    return None


def running_as_non_root_user(pod: Pod) -> str | None:
    contexts = [_pod_context(pod), *(_context(c) for c in containers(pod))]
    return "runAsUser must not be 0" if any(ctx.get("runAsUser") == 0 for ctx in contexts) else None


def seccomp_restricted(pod: Pod) -> str | None:
    pod_profile = (_pod_context(pod).get("seccompProfile") or {}).get("type")
    for c in containers(pod):
        own = (_context(c).get("seccompProfile") or {}).get("type")
        if (own or pod_profile) not in ("RuntimeDefault", "Localhost"):
            return f"seccompProfile of {c['name']} must be RuntimeDefault or Localhost"
    return None


def capabilities_restricted(pod: Pod) -> str | None:
    for c in containers(pod):
        caps = _context(c).get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or ()) or set(caps.get("add") or ()) - {"NET_BIND_SERVICE"}:
            return f"{c['name']} must drop ALL capabilities and add at most NET_BIND_SERVICE"
    return None


Rule = Callable[[Pod], "str | None"]
BASELINE: dict[str, Rule] = {
    "HostProcess": host_process,
    "Host Namespaces": host_namespaces,
    "Privileged Containers": privileged_containers,
    "Capabilities": capabilities_baseline,
    "HostPath Volumes": host_path_volumes,
    "Host Ports": host_ports,
    "AppArmor": apparmor,
    "SELinux": selinux,
    "/proc Mount Type": proc_mount,
    "Seccomp": seccomp_baseline,
    "Sysctls": sysctls,
}
RESTRICTED: dict[str, Rule] = {
    **BASELINE,
    "Volume Types": volume_types,
    "Privilege Escalation": privilege_escalation,
    "Running as Non-root": running_as_non_root,
    "Running as Non-root user": running_as_non_root_user,
    "Seccomp (restricted)": seccomp_restricted,
    "Capabilities (restricted)": capabilities_restricted,
}


def violations(pod: Pod, level: Level) -> dict[str, str]:
    """Control -> why, for every control of `level` that refuses the pod."""
    rules = BASELINE if level == "baseline" else RESTRICTED
    return {name: why for name, rule in rules.items() if (why := rule(pod)) is not None}
