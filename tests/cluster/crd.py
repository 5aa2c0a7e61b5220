"""CustomResourceDefinitions, enforced as kube-apiserver's apiextensions code enforces them on every write of a
custom resource: pruning of unknown fields (or refusal under strict field validation), schema defaults, the
structural schema (types, enums, bounds, lengths, patterns, required), and every `x-kubernetes-validations` rule,
transition rules with `oldSelf` included, evaluated with cel-python. Error messages keep the real forms, e.g.
`ParallelJob.paralleljob.io "gpt" is invalid: spec.parallelism.pipeline: Invalid value: 0: spec.parallelism.pipeline
in body should be greater than or equal to 1`.

The server calls `Definition.of(crd)` when a CRD is created and `admit(...)` on each write of one of its objects.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import functools
import json
import re
from collections.abc import Mapping
from typing import Any

import celpy

from tests.cluster import admission, statuses
from tests.cluster.statuses import FieldError

TOP_LEVEL = ("apiVersion", "kind", "metadata")


@dataclasses.dataclass(frozen=True)
class Definition:
    """What the server needs of one CRD: where its objects live and the schema of its storage version."""

    group: str
    version: str
    plural: str
    kind: str
    singular: str
    short_names: tuple[str, ...]
    namespaced: bool
    schema: Mapping[str, Any]
    status_subresource: bool
    printer_columns: tuple[Mapping[str, Any], ...] = ()

    @classmethod
    def of(cls, crd: Mapping[str, Any]) -> Definition:
        spec = crd["spec"]
        version = next(v for v in spec["versions"] if v.get("storage"))
        names = spec["names"]
        return cls(
            group=spec["group"],
            version=version["name"],
            plural=names["plural"],
            kind=names["kind"],
            singular=names.get("singular") or names["kind"].lower(),
            short_names=tuple(names.get("shortNames") or ()),
            namespaced=spec.get("scope", "Namespaced") == "Namespaced",
            schema=(version.get("schema") or {}).get("openAPIV3Schema") or {},
            status_subresource="status" in (version.get("subresources") or {}),
            printer_columns=tuple(version.get("additionalPrinterColumns") or ()),
        )


def crd_errors(crd: Mapping[str, Any]) -> list[FieldError]:
    """The CRD's own rule that matters here: its name is `<plural>.<group>`."""
    spec = crd.get("spec") or {}
    expected = f"{(spec.get('names') or {}).get('plural')}.{spec.get('group')}"
    name = (crd.get("metadata") or {}).get("name")
    if name != expected:
        return [FieldError("metadata.name", "Invalid value", 'must be spec.names.plural+"."+spec.group', name)]
    return []


# -- server-side printing (`kubectl get`) ------------------------------------------------------------------

NAME_COLUMN = {
    "name": "Name",
    "type": "string",
    "format": "name",
    "description": "Name must be unique within a namespace.",
    "priority": 0,
}


def _json_path(obj: Any, path: str) -> Any:
    """The simple JSONPaths printer columns use: `.status.progress.step`."""
    for part in [p for p in path.strip().lstrip(".").split(".") if p]:
        if not isinstance(obj, Mapping) or part not in obj:
            return None
        obj = obj[part]
    return obj


def _age(timestamp: str, now: datetime.datetime) -> str:
    """kubectl's short human duration: 45s, 3m, 2h, 4d."""
    seconds = int((now - datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size * (2 if unit != "d" else 1):
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"


def table(definition: Definition, objects: list[Mapping[str, Any]], resource_version: str) -> dict[str, Any]:
    """A meta.k8s.io/v1 Table of the objects with the CRD's additionalPrinterColumns, as kubectl asks for."""
    now = datetime.datetime.now(datetime.UTC)
    columns = [NAME_COLUMN] + [
        {
            "name": c["name"],
            "type": c.get("type", "string"),
            "format": c.get("format", ""),
            "description": c.get("description", ""),
            "priority": int(c.get("priority", 0)),
        }
        for c in definition.printer_columns
    ]
    rows = []
    for obj in objects:
        cells: list[Any] = [obj["metadata"]["name"]]
        for column in definition.printer_columns:
            value = _json_path(obj, column["jsonPath"])
            cells.append(_age(value, now) if column.get("type") == "date" and isinstance(value, str) else value)
        partial = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]}
        rows.append({"cells": cells, "object": partial})
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": columns,
        "rows": rows,
    }


# -- pruning and defaults ------------------------------------------------------------------------------------


def _properties(schema: Mapping[str, Any]) -> Mapping[str, Any]:
    return schema.get("properties") or {}


def unknown_fields(schema: Mapping[str, Any], value: Any, path: str) -> list[str]:
    """Paths of the fields the schema does not declare (where it does not preserve unknown fields)."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    found: list[str] = []
    if isinstance(value, dict) and schema.get("type") == "object":
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            child = f"{path}.{key}" if path else key
            if path == "" and key in TOP_LEVEL:
                continue
            if key in _properties(schema):
                found += unknown_fields(_properties(schema)[key], item, child)
            elif isinstance(extra, Mapping):
                found += unknown_fields(extra, item, child)
            else:
                found.append(child)
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for index, item in enumerate(value):
            found += unknown_fields(schema["items"], item, f"{path}[{index}]")
    return found


def pruned(schema: Mapping[str, Any], value: Any, top: bool = True) -> Any:
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return value
    if isinstance(value, dict) and schema.get("type") == "object":
        extra = schema.get("additionalProperties")
        kept = {}
        for key, item in value.items():
            if top and key in TOP_LEVEL:
                kept[key] = item  # metadata is the API's, never pruned by the CRD's schema
            elif key in _properties(schema):
                kept[key] = pruned(_properties(schema)[key], item, False)
            elif isinstance(extra, Mapping):
                kept[key] = pruned(extra, item, False)
        return kept
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        return [pruned(schema["items"], item, False) for item in value]
    return value


def defaulted(schema: Mapping[str, Any], value: Any) -> Any:
    """Schema defaults filled in, outermost first, as the API server does before validation."""
    if isinstance(value, dict):
        for key, child in _properties(schema).items():
            if key not in value and "default" in child:
                value[key] = copy.deepcopy(child["default"])
            if key in value:
                value[key] = defaulted(child, value[key])
        extra = schema.get("additionalProperties")
        if isinstance(extra, Mapping):
            for key in set(value) - set(_properties(schema)):
                value[key] = defaulted(extra, value[key])
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        return [defaulted(schema["items"], item) for item in value]
    return value


# -- the structural schema -----------------------------------------------------------------------------------

TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "boolean": (bool,),
    "integer": (int,),
    "number": (int, float),
}


def _type_matches(schema: Mapping[str, Any], value: Any) -> bool:
    if schema.get("x-kubernetes-int-or-string"):
        return isinstance(value, int | str) and not isinstance(value, bool)
    wanted = schema.get("type")
    if wanted is None:
        return True
    if isinstance(value, bool) and wanted != "boolean":
        return False
    return isinstance(value, TYPES.get(wanted, (object,)))


def _type_name(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer", float: "number"}.get(
        type(value), "null"
    )


def schema_errors(schema: Mapping[str, Any], value: Any, path: str) -> list[FieldError]:
    """Errors of one value against its schema node and everything below it."""
    if value is None:
        return (
            []
            if schema.get("nullable")
            else [
                FieldError(
                    path, "Invalid value", f'{path} in body must be of type {schema.get("type")}: "null"', "null"
                )
            ]
        )
    if not _type_matches(schema, value):
        detail = f'{path} in body must be of type {schema.get("type")}: "{_type_name(value)}"'
        return [FieldError(path, "Invalid value", detail, _type_name(value))]
    errors = _bounds_errors(schema, value, path)
    if isinstance(value, dict):
        for key in schema.get("required") or []:
            if key not in value:
                errors.append(FieldError(f"{path}.{key}", "Required value"))
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            child = _properties(schema).get(key, extra if isinstance(extra, Mapping) else None)
            if child is not None and not (path == "" and key in TOP_LEVEL):
                errors += schema_errors(child, item, f"{path}.{key}" if path else key)
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for index, item in enumerate(value):
            errors += schema_errors(schema["items"], item, f"{path}[{index}]")
    return errors


def _bounds_errors(schema: Mapping[str, Any], value: Any, path: str) -> list[FieldError]:
    errors = []
    if "enum" in schema and value not in schema["enum"]:
        supported = ", ".join(json.dumps(v) for v in schema["enum"])
        errors.append(FieldError(path, "Unsupported value", f"supported values: {supported}", value))
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            detail = f"{path} in body should be greater than or equal to {schema['minimum']}"
            errors.append(FieldError(path, "Invalid value", detail, value))
        if "maximum" in schema and value > schema["maximum"]:
            detail = f"{path} in body should be less than or equal to {schema['maximum']}"
            errors.append(FieldError(path, "Invalid value", detail, value))
    if isinstance(value, str):
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(FieldError(path, "Too long", f"may not be more than {schema['maxLength']} bytes"))
        if "minLength" in schema and len(value) < schema["minLength"]:
            detail = f"{path} in body should be at least {schema['minLength']} chars long"
            errors.append(FieldError(path, "Invalid value", detail, value))
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errors.append(
                FieldError(path, "Invalid value", f"{path} in body should match '{schema['pattern']}'", value)
            )
    if isinstance(value, list):
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            errors.append(FieldError(path, "Too many", f"must have at most {schema['maxItems']} items", len(value)))
        if "minItems" in schema and len(value) < schema["minItems"]:
            detail = f"{path} in body should have at least {schema['minItems']} items"
            errors.append(FieldError(path, "Invalid value", detail, len(value)))
    if isinstance(value, dict) and "minProperties" in schema and len(value) < schema["minProperties"]:
        detail = f"{path} in body should have at least {schema['minProperties']} properties"
        errors.append(FieldError(path, "Invalid value", detail, len(value)))
    return errors


# -- CEL rules -----------------------------------------------------------------------------------------------

CEL = celpy.Environment()
CEL_REASONS = {
    "FieldValueInvalid": "Invalid value",
    "FieldValueForbidden": "Forbidden",
    "FieldValueRequired": "Required value",
    "FieldValueDuplicate": "Duplicate value",
}


class _Optional:
    """`oldSelf` of a rule with optionalOldSelf: CEL's optional, as much of it as such a rule uses."""

    def __init__(self, value: Any) -> None:
        self.held = value


# oldSelf.hasValue() and oldSelf.value(): cel-python calls a method `x.f()` as the function f(x).
OPTIONAL_FUNCTIONS = {
    "hasValue": lambda optional: celpy.celtypes.BoolType(optional.held is not None),
    "value": lambda optional: optional.held,
}


@functools.cache
def _program(expression: str) -> Any:
    return CEL.program(CEL.compile(expression), functions=OPTIONAL_FUNCTIONS)


def _evaluate(expression: str, self_value: Any, old_value: Any, optional_old: bool = False) -> Any:
    activation: dict[str, Any] = {"self": celpy.json_to_cel(self_value)}
    if optional_old:
        activation["oldSelf"] = _Optional(celpy.json_to_cel(old_value) if old_value is not None else None)
    elif old_value is not None:
        activation["oldSelf"] = celpy.json_to_cel(old_value)
    try:
        return _program(expression).evaluate(activation)
    except celpy.CELEvalError as error:
        return error


def cel_errors(schema: Mapping[str, Any], value: Any, old: Any, path: str) -> list[FieldError]:
    """Every x-kubernetes-validations rule on this node and below. A transition rule (one that reads `oldSelf`)
    runs only on an update whose old object has a value at the same place, as the API server correlates them.
    Validation ratcheting (on by default since Kubernetes 1.30): a rule without oldSelf is not run on a value the
    update leaves unchanged (Kubernetes compares the whole value, which never matches one holding a map under
    x-kubernetes-preserve-unknown-fields, so our spec rules ratchet themselves with optionalOldSelf). A rule with
    optionalOldSelf runs on every write, its `oldSelf` an optional that is empty on a create."""
    errors = []
    unchanged = old is not None and value == old
    for rule in schema.get("x-kubernetes-validations") or []:
        expression = rule["rule"]
        optional_old = bool(rule.get("optionalOldSelf"))
        transition = re.search(r"\boldSelf\b", expression) is not None
        if (transition and old is None and not optional_old) or (unchanged and not transition):
            continue
        result = _evaluate(expression, value, old if transition else None, optional_old)
        if isinstance(result, celpy.CELEvalError):
            errors.append(FieldError(path, "Invalid value", f"rule evaluation error: {result}", schema.get("type", "")))
        elif not bool(result):
            errors.append(_rule_failure(rule, schema, value, path))
    if isinstance(value, dict):
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            child = _properties(schema).get(key, extra if isinstance(extra, Mapping) else None)
            old_item = old.get(key) if isinstance(old, dict) else None
            if child is not None and not (path == "" and key in TOP_LEVEL):
                errors += cel_errors(child, item, old_item, f"{path}.{key}" if path else key)
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        # Items of a list correlate with the old list's only in map-typed lists; these never see oldSelf.
        for index, item in enumerate(value):
            errors += cel_errors(schema["items"], item, None, f"{path}[{index}]")
    return errors


def _rule_failure(rule: Mapping[str, Any], schema: Mapping[str, Any], value: Any, path: str) -> FieldError:
    message = rule.get("message") or f"failed rule: {rule['rule']}"
    if rule.get("messageExpression"):
        produced = _evaluate(rule["messageExpression"], value, None)
        if isinstance(produced, str) and produced:
            message = str(produced)
    where = path + (rule.get("fieldPath") or "")
    kind = CEL_REASONS.get(rule.get("reason") or "FieldValueInvalid", "Invalid value")
    if kind == "Invalid value":
        return FieldError(where, kind, message, schema.get("type", "object"))
    return FieldError(where, kind, message)


def read_back(definition: Definition, stored: Mapping[str, Any]) -> dict[str, Any]:
    """A stored object as the API server reads it from storage: pruned and defaulted by today's schema."""
    return defaulted(definition.schema, pruned(definition.schema, copy.deepcopy(dict(stored))))


# -- a write ---------------------------------------------------------------------------------------------------


def admit(
    definition: Definition,
    obj: dict[str, Any],
    old: Mapping[str, Any] | None,
    *,
    strict_fields: bool = False,
) -> tuple[dict[str, Any], list[str]]:
    """The custom resource as it will be stored and the warnings to send, or a refusal."""
    schema = definition.schema
    name = str((obj.get("metadata") or {}).get("name") or "")
    unknown = unknown_fields(schema, obj, "")
    if unknown and strict_fields:
        raise statuses.bad_request(
            f'{definition.kind} in version "{definition.version}" cannot be handled as a {definition.kind}: '
            f'strict decoding error: unknown field "{unknown[0]}"'
        )
    stored = defaulted(schema, pruned(schema, copy.deepcopy(obj)))
    errors = admission.metadata_errors(definition.plural, stored.get("metadata") or {})
    structural = schema_errors(schema, stored, "")
    errors += structural
    if not structural:
        # The stored object is read back with today's defaults, as the API server defaults on read.
        old_read = read_back(definition, old) if old else None
        errors += cel_errors(schema, stored, old_read, "")
    if errors:
        raise statuses.invalid(definition.kind, definition.group, name, errors)
    return stored, [f'unknown field "{path}"' for path in unknown]
