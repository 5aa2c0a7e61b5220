"""The API's rules for built-in objects, checked on every create, update and patch, as kube-apiserver checks them:
names per kind, label and annotation syntax, size limits, immutable fields, and the OpenAPI schemas of core kinds
(shipped by kubernetes-validate; unknown fields, types, required fields).

`check_object` returns the object as it will be stored (unknown fields pruned unless the request asked for strict
field validation, which refuses them), or raises a `statuses.APIError` with the real code and message.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from collections.abc import Callable, Mapping
from typing import Any

import jsonschema
import referencing
from kubernetes_validate import utils as kv_utils

from tests.cluster import statuses
from tests.cluster.statuses import FieldError

# The Kubernetes version whose schemas apply (kubectl from scripts/install-k8s-tools.sh is 1.34).
SCHEMA_VERSION = "1.34.0"

DNS1123_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1123_SUBDOMAIN = rf"{DNS1123_LABEL}(\.{DNS1123_LABEL})*"
DNS1035_LABEL = "[a-z]([-a-z0-9]*[a-z0-9])?"
QUALIFIED_NAME = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
LABEL_VALUE = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?"
CONFIG_KEY = "[-._a-zA-Z0-9]+"

SUBDOMAIN_MESSAGE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start "
    f"and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '{DNS1123_SUBDOMAIN}')"
)
LABEL_MESSAGE = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end "
    f"with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '{DNS1123_LABEL}')"
)
DNS1035_MESSAGE = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic "
    "character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation "
    f"is '{DNS1035_LABEL}')"
)
QUALIFIED_NAME_MESSAGE = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    f"alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is "
    f"'{QUALIFIED_NAME}')"
)
LABEL_VALUE_MESSAGE = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start "
    "and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for "
    f"validation is '{LABEL_VALUE}')"
)
CONFIG_KEY_MESSAGE = (
    "a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or "
    f"'KEY_NAME',  or 'key-name', regex used for validation is '{CONFIG_KEY}')"
)

ANNOTATIONS_MAX_BYTES = 256 * 1024
CONFIGMAP_MAX_BYTES = 1024 * 1024
# etcd refuses a value over 1.5 MiB; kube-apiserver refuses a request body over 3 MiB before decoding it.
STORED_OBJECT_MAX_BYTES = 1536 * 1024
REQUEST_MAX_BYTES = 3 * 1024 * 1024

POD_UPDATABLE = (
    "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,"
    "`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),"
    "`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)"
)


# -- names, labels, annotations ------------------------------------------------------------------------------


def _matches(pattern: str, text: str) -> bool:
    return re.fullmatch(pattern, text) is not None


def subdomain_errors(name: str) -> list[str]:
    errors = ["must be no more than 253 characters"] if len(name) > 253 else []
    return errors + ([] if _matches(DNS1123_SUBDOMAIN, name) else [SUBDOMAIN_MESSAGE])


def label_name_errors(name: str) -> list[str]:
    errors = ["must be no more than 63 characters"] if len(name) > 63 else []
    return errors + ([] if _matches(DNS1123_LABEL, name) else [LABEL_MESSAGE])


def dns1035_errors(name: str) -> list[str]:
    errors = ["must be no more than 63 characters"] if len(name) > 63 else []
    return errors + ([] if _matches(DNS1035_LABEL, name) else [DNS1035_MESSAGE])


def path_segment_errors(name: str) -> list[str]:
    """RBAC objects may be named anything that is one URL path segment."""
    if name in (".", ".."):
        return [f"may not be '{name}'"]
    return [f"may not contain '{c}'" for c in ("/", "%") if c in name]


# The name rule of each kind (kube-apiserver's per-kind ValidateName functions); unlisted kinds use subdomains.
NAME_RULES: dict[str, Callable[[str], list[str]]] = {
    "namespaces": label_name_errors,
    "services": dns1035_errors,
    "roles": path_segment_errors,
    "rolebindings": path_segment_errors,
    "clusterroles": path_segment_errors,
    "clusterrolebindings": path_segment_errors,
}


def qualified_name_errors(key: str) -> list[str]:
    """A label or annotation key: an optional DNS subdomain prefix and `/`, then a name of at most 63 characters."""
    prefix, _, name = key.rpartition("/") if "/" in key else ("", "", key)
    errors = []
    if "/" in key and not prefix:
        errors.append("prefix part must be non-empty")
    elif prefix:
        errors += [f"prefix part {e}" for e in subdomain_errors(prefix)]
    if not name:
        errors.append("name part must be non-empty")
    else:
        if len(name) > 63:
            errors.append("name part must be no more than 63 characters")
        if not _matches(QUALIFIED_NAME, name):
            errors.append(QUALIFIED_NAME_MESSAGE)
    return errors


def label_value_errors(value: str) -> list[str]:
    errors = ["must be no more than 63 characters"] if len(value) > 63 else []
    return errors + ([] if _matches(LABEL_VALUE, value) else [LABEL_VALUE_MESSAGE])


def metadata_errors(plural: str, meta: Mapping[str, Any]) -> list[FieldError]:
    name = str(meta.get("name") or "")
    if not name:
        return [FieldError("metadata.name", "Required value", "name or generateName is required")]
    rule = NAME_RULES.get(plural, subdomain_errors)
    errors = [FieldError("metadata.name", "Invalid value", e, name) for e in rule(name)]
    for key, value in (meta.get("labels") or {}).items():
        errors += [FieldError("metadata.labels", "Invalid value", e, key) for e in qualified_name_errors(key)]
        if not isinstance(value, str):
            continue  # the schema check names the type
        errors += [FieldError("metadata.labels", "Invalid value", e, value) for e in label_value_errors(value)]
    annotations = meta.get("annotations") or {}
    for key in annotations:
        errors += [FieldError("metadata.annotations", "Invalid value", e, key) for e in qualified_name_errors(key)]
    size = sum(len(k) + len(str(v)) for k, v in annotations.items())
    if size > ANNOTATIONS_MAX_BYTES:
        errors.append(
            FieldError("metadata.annotations", "Too long", f"must have at most {ANNOTATIONS_MAX_BYTES} bytes")
        )
    return errors


# -- per-kind rules ------------------------------------------------------------------------------------------


def configmap_errors(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[FieldError]:
    data, binary = obj.get("data") or {}, obj.get("binaryData") or {}
    errors = [
        FieldError(f"{field}[{key}]", "Invalid value", CONFIG_KEY_MESSAGE, key)
        for field, values in (("data", data), ("binaryData", binary))
        for key in values
        if not _matches(CONFIG_KEY, key)
    ]
    size = sum(len(k) + len(str(v).encode()) for k, v in data.items()) + sum(len(k) + len(v) for k, v in binary.items())
    if size > CONFIGMAP_MAX_BYTES:
        errors.append(FieldError("[]", "Too long", f"must have at most {CONFIGMAP_MAX_BYTES} bytes"))
    if old and old.get("immutable") and (old.get("data"), old.get("binaryData")) != (data or None, binary or None):
        errors.append(FieldError("data", "Forbidden", "field is immutable when `immutable` is set"))
    return errors


def _mutable_part_removed(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A pod spec without what an update may change: images, activeDeadlineSeconds, tolerations, grace period."""
    stripped = copy.deepcopy(dict(spec))
    for field in ("containers", "initContainers"):
        for container in stripped.get(field) or []:
            container.pop("image", None)
    for field in ("activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds"):
        stripped.pop(field, None)
    return stripped


def pod_update_errors(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[FieldError]:
    if old is None:
        return []
    new_spec, old_spec = obj.get("spec") or {}, old.get("spec") or {}
    errors = []
    if _mutable_part_removed(new_spec) != _mutable_part_removed(old_spec):
        errors.append(FieldError("spec", "Forbidden", POD_UPDATABLE))
    old_tolerations = old_spec.get("tolerations") or []
    if new_spec.get("tolerations", [])[: len(old_tolerations)] != old_tolerations:
        errors.append(
            FieldError(
                "spec.tolerations", "Forbidden", "existing toleration can not be modified except its tolerationSeconds"
            )
        )
    return errors


def service_update_errors(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[FieldError]:
    if old is None:
        return []
    old_ip = (old.get("spec") or {}).get("clusterIP")
    new_ip = (obj.get("spec") or {}).get("clusterIP")
    if old_ip and new_ip != old_ip:
        return [FieldError("spec.clusterIP", "Invalid value", "field is immutable", new_ip if new_ip else "")]
    return []


KIND_RULES: dict[str, Callable[[Mapping[str, Any], Mapping[str, Any] | None], list[FieldError]]] = {
    "configmaps": configmap_errors,
    "pods": pod_update_errors,
    "services": service_update_errors,
}


# -- OpenAPI schemas of core kinds ---------------------------------------------------------------------------


@functools.cache
def _definitions() -> referencing.Registry:
    defs = kv_utils.schema_contents(
        f"kubernetes-json-schema/v{SCHEMA_VERSION}-local-strict/_definitions.json", SCHEMA_VERSION
    )
    return referencing.Resource.from_contents(defs) @ referencing.Registry()


@functools.cache
def schema_validator(kind: str, api_version: str) -> jsonschema.protocols.Validator | None:
    """kubernetes-validate's strict schema of a built-in kind, compiled once (it recompiles on every call)."""
    version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    path = f"kubernetes-json-schema/v{SCHEMA_VERSION}-local-strict/{kind.lower()}-{version}.json"
    try:
        schema = kv_utils.schema_contents(path, SCHEMA_VERSION)
    except FileNotFoundError:
        return None
    return jsonschema.Draft202012Validator(schema, registry=_definitions())


def field_path(parts: Any) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _unknown_fields(error: jsonschema.ValidationError) -> list[str]:
    extra = sorted(set(error.instance) - set((error.schema or {}).get("properties") or {}))
    base = field_path(error.absolute_path)
    return [f"{base}.{key}" if base else key for key in extra]


def _prune(obj: dict[str, Any], path: Any, key: str) -> None:
    node: Any = obj
    for part in path:
        node = node[part]
    node.pop(key, None)


JSON_TYPES = {str: "string", bool: "bool", int: "number", float: "number", list: "array", dict: "object"}


def schema_errors(obj: dict[str, Any], strict_fields: bool) -> tuple[dict[str, Any], list[str]]:
    """Validates a built-in object; returns it with unknown fields pruned and the warnings for them.

    Raises 400 BadRequest for an unknown field under strict field validation or a value of the wrong JSON type
    (the decoder refuses both), and 422 Invalid for the rest (required fields, enums).
    """
    kind = str(obj.get("kind") or "")
    validator = schema_validator(kind, str(obj.get("apiVersion") or ""))
    if validator is None:
        return obj, []
    pruned, warnings, invalid = copy.deepcopy(obj), [], []
    for error in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path))):
        if error.validator == "additionalProperties":
            unknown = _unknown_fields(error)
            if strict_fields:
                raise statuses.bad_request(f'strict decoding error: unknown field "{unknown[0]}"')
            warnings += [f'unknown field "{path}"' for path in unknown]
            for path in unknown:
                _prune(pruned, list(error.absolute_path), path.rsplit(".", 1)[-1])
        elif error.validator == "type":
            expected = error.validator_value
            expected = [t for t in expected if t != "null"] if isinstance(expected, list) else [expected]
            got = JSON_TYPES.get(type(error.instance), "value")
            raise statuses.bad_request(
                f'{kind} in version "{obj.get("apiVersion")}" cannot be handled as a {kind}: json: cannot unmarshal '
                f"{got} into Go struct field {field_path(error.absolute_path)} of type {expected[0]}"
            )
        elif error.validator == "required":
            missing = re.findall(r"'([^']+)' is a required property", error.message)
            base = field_path(error.absolute_path)
            invalid += [FieldError(f"{base}.{m}" if base else m, "Required value") for m in missing]
        elif error.validator == "enum":
            supported = ", ".join(json.dumps(v) for v in error.validator_value if v is not None)
            invalid.append(
                FieldError(
                    field_path(error.absolute_path),
                    "Unsupported value",
                    f"supported values: {supported}",
                    error.instance,
                )
            )
        else:
            invalid.append(FieldError(field_path(error.absolute_path), "Invalid value", error.message, error.instance))
    if invalid:
        raise _InvalidFields(invalid)
    return pruned, warnings


class _InvalidFields(Exception):
    def __init__(self, errors: list[FieldError]) -> None:
        super().__init__(errors)
        self.errors = errors


def check_object(
    plural: str,
    group: str,
    obj: dict[str, Any],
    old: Mapping[str, Any] | None,
    *,
    strict_fields: bool = False,
    validate_schema: bool = True,
) -> tuple[dict[str, Any], list[str]]:
    """The object to store and the warnings to send, or a refusal (`statuses.APIError`)."""
    kind = str(obj.get("kind") or "")
    name = str((obj.get("metadata") or {}).get("name") or "")
    warnings: list[str] = []
    errors = metadata_errors(plural, obj.get("metadata") or {})
    if validate_schema:
        try:
            obj, warnings = schema_errors(obj, strict_fields)
        except _InvalidFields as refused:
            errors += refused.errors
    errors += KIND_RULES.get(plural, lambda _o, _p: [])(obj, old)
    if errors:
        raise statuses.invalid(kind, group, name, errors)
    if len(json.dumps(obj)) > STORED_OBJECT_MAX_BYTES:
        raise statuses.APIError(500, "InternalError", "etcdserver: request is too large")
    return obj, warnings
