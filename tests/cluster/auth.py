"""Authentication and RBAC as kube-apiserver does them: bearer tokens name a user (or a ServiceAccount), and
every resource request is authorised against the Roles, ClusterRoles and bindings in the store.

Tokens are minted by the server: the admin's at start, and one for each ServiceAccount that exists. A request
without a known token gets 401; a request no rule allows gets 403 with the API's message. Creating or changing
a Role or binding is refused, as RBAC's escalation check refuses it, unless the requester already holds every
permission it would grant.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from tests.cluster import statuses

ADMIN = "admin"
MASTERS = "system:masters"


@dataclasses.dataclass(frozen=True)
class User:
    name: str
    groups: tuple[str, ...]

    @classmethod
    def service_account(cls, namespace: str, name: str) -> User:
        groups = ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated")
        return cls(f"system:serviceaccount:{namespace}:{name}", groups)


@dataclasses.dataclass(frozen=True)
class Attributes:
    """What a request does, in the authorizer's terms."""

    verb: str  # get list watch create update patch delete deletecollection
    group: str
    resource: str  # "pods" or "pods/status"
    namespace: str  # "" at the cluster scope
    name: str = ""


class Tokens:
    """Bearer token -> User; the admin's token, and one minted per ServiceAccount."""

    def __init__(self) -> None:
        self.admin_token = secrets.token_hex(16)
        self._users: dict[str, User] = {self.admin_token: User(ADMIN, (MASTERS, "system:authenticated"))}
        self._accounts: dict[tuple[str, str], str] = {}

    def user(self, authorization: str) -> User | None:
        scheme, _, token = authorization.partition(" ")
        return self._users.get(token) if scheme.lower() == "bearer" else None

    def mint(self, namespace: str, name: str) -> str:
        token = self._accounts.get((namespace, name))
        if token is None:
            token = secrets.token_hex(16)
            self._accounts[(namespace, name)] = token
            self._users[token] = User.service_account(namespace, name)
        return token

    def revoke(self, namespace: str, name: str) -> None:
        token = self._accounts.pop((namespace, name), None)
        if token is not None:
            self._users.pop(token, None)

    def token_of(self, namespace: str, name: str) -> str:
        return self._accounts[(namespace, name)]


Lookup = Callable[[str, str, str], Mapping[str, Any] | None]  # (plural, namespace, name) -> stored object


def _subject_matches(subject: Mapping[str, Any], user: User, binding_namespace: str) -> bool:
    kind = subject.get("kind")
    if kind == "ServiceAccount":
        namespace = subject.get("namespace") or binding_namespace
        return user.name == f"system:serviceaccount:{namespace}:{subject.get('name')}"
    if kind == "User":
        return user.name == subject.get("name")
    if kind == "Group":
        return subject.get("name") in user.groups
    return False


def _in(values: Iterable[str], wanted: str) -> bool:
    values = list(values)
    return "*" in values or wanted in values


def rule_allows(rule: Mapping[str, Any], attributes: Attributes) -> bool:
    if not _in(rule.get("verbs") or [], attributes.verb):
        return False
    if not _in(rule.get("apiGroups") or [], attributes.group):
        return False
    resources = rule.get("resources") or []
    base = attributes.resource.split("/")[0]
    if not (_in(resources, attributes.resource) or (base != attributes.resource and f"{base}/*" in resources)):
        return False
    names = rule.get("resourceNames") or []
    return not names or attributes.name in names


class Authorizer:
    """RBAC over the store: a binding's rules apply in its namespace; a ClusterRoleBinding's everywhere."""

    def __init__(self, objects: Callable[[str], Iterable[Mapping[str, Any]]], lookup: Lookup) -> None:
        self._objects, self._lookup = objects, lookup

    def rules_for(self, user: User, namespace: str) -> list[Mapping[str, Any]]:
        """The rules that apply to `user` in `namespace` ("" for cluster-scoped requests)."""
        rules: list[Mapping[str, Any]] = []
        bindings = [(b, "") for b in self._objects("clusterrolebindings")]
        if namespace:
            bindings += [
                (b, namespace)
                for b in self._objects("rolebindings")
                if (b.get("metadata") or {}).get("namespace") == namespace
            ]
        for binding, scope in bindings:
            if not any(_subject_matches(s, user, scope) for s in binding.get("subjects") or []):
                continue
            ref = binding.get("roleRef") or {}
            plural = "clusterroles" if ref.get("kind") == "ClusterRole" else "roles"
            role = self._lookup(plural, scope if plural == "roles" else "", str(ref.get("name") or ""))
            rules += list((role or {}).get("rules") or [])
        return rules

    def allows(self, user: User, attributes: Attributes) -> bool:
        if MASTERS in user.groups:
            return True
        return any(rule_allows(rule, attributes) for rule in self.rules_for(user, attributes.namespace))

    def check(self, user: User, attributes: Attributes) -> None:
        if not self.allows(user, attributes):
            raise forbidden(user, attributes)

    def check_escalation(self, user: User, plural: str, obj: Mapping[str, Any], namespace: str) -> None:
        """RBAC refuses a Role (or a binding to one) granting what its author does not hold (no `escalate`/`bind`)."""
        if MASTERS in user.groups:
            return
        if plural in ("roles", "clusterroles"):
            rules = obj.get("rules") or []
            verb = "escalate"
        else:
            ref = obj.get("roleRef") or {}
            ref_plural = "clusterroles" if ref.get("kind") == "ClusterRole" else "roles"
            role = self._lookup(ref_plural, namespace if ref_plural == "roles" else "", str(ref.get("name") or ""))
            rules = (role or {}).get("rules") or []
            verb = "bind"
        group = "rbac.authorization.k8s.io"
        name = str((obj.get("metadata") or {}).get("name") or "")
        if self.allows(user, Attributes(verb, group, plural, namespace, name)):
            return
        missing = [r for r in _expanded(rules) if not self.allows(user, dataclasses.replace(r, namespace=namespace))]
        if missing:
            groups = " ".join(f'"{g}"' for g in user.groups)
            held = "\n".join(
                f'{{APIGroups:["{m.group}"], Resources:["{m.resource}"], Verbs:["{m.verb}"]}}' for m in missing
            )
            raise statuses.APIError(
                403,
                "Forbidden",
                f'{plural}.{group} "{name}" is forbidden: user "{user.name}" (groups=[{groups}]) is attempting '
                f"to grant RBAC permissions not currently held:\n{held}",
            )


def _expanded(rules: Iterable[Mapping[str, Any]]) -> list[Attributes]:
    return [
        Attributes(verb, group, resource, "", name)
        for rule in rules
        for verb in rule.get("verbs") or []
        for group in rule.get("apiGroups") or []
        for resource in rule.get("resources") or []
        for name in (rule.get("resourceNames") or [""])
    ]


def forbidden(user: User, attributes: Attributes) -> statuses.APIError:
    """403 with the message kube-apiserver sends, e.g. `pods "gpt-0" is forbidden: User "..." cannot delete
    resource "pods" in API group "" in the namespace "research"`."""
    base = attributes.resource.split("/")[0]
    resource = f"{base}.{attributes.group}" if attributes.group else base
    subject = f'{resource} "{attributes.name}"' if attributes.name else resource
    where = f'in the namespace "{attributes.namespace}"' if attributes.namespace else "at the cluster scope"
    message = (
        f'{subject} is forbidden: User "{user.name}" cannot {attributes.verb} resource "{attributes.resource}" '
        f'in API group "{attributes.group}" {where}'
    )
    details = {"name": attributes.name, "group": attributes.group, "kind": base}
    return statuses.APIError(403, "Forbidden", message, details)


def unauthorized() -> statuses.APIError:
    return statuses.APIError(401, "Unauthorized", "Unauthorized")
