"""Generates the ParallelJob CustomResourceDefinition from the API types.

The openAPIV3Schema comes from the dataclasses of `paralleljob.api.types` (descriptions, bounds, enums and
defaults from their field declarations), the cross-field CEL rules from `paralleljob.api.rules`.
`paralleljob crd` prints the result; `crds/paralleljob.io_paralleljobs.yaml` is its committed copy.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, get_args, get_origin

from paralleljob.api import rules
from paralleljob.api import types as t
from paralleljob.api.fields import field_info, has_default, json_name
from paralleljob.api.parsing import type_hints, unwrap_optional

CRD_FILE = "crds/paralleljob.io_paralleljobs.yaml"

_SCALARS = {int: {"type": "integer"}, float: {"type": "number"}, str: {"type": "string"}, bool: {"type": "boolean"}}

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Layout", "type": "string", "jsonPath": ".status.layout", "description": "pipeline x tensor x data"},
    {"name": "GPUs", "type": "integer", "jsonPath": ".status.worldSize", "description": "Total ranks"},
    {"name": "Nodes", "type": "integer", "jsonPath": ".status.nodes", "description": "Pods (node ranks)"},
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase", "description": "Job phase"},
    {"name": "Step", "type": "integer", "jsonPath": ".status.progress.step", "description": "Last step"},
    {"name": "Loss", "type": "number", "jsonPath": ".status.progress.loss", "description": "Loss at step"},
    {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts", "description": "Restarts, in place or not"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {
        "name": "Tokens/s",
        "type": "number",
        "jsonPath": ".status.progress.tokensPerSecond",
        "priority": 1,
        "description": "Training throughput",
    },
    {
        "name": "Val-loss",
        "type": "number",
        "jsonPath": ".status.progress.validationLoss",
        "priority": 1,
        "description": "Held-out loss at the latest evaluation",
    },
    {
        "name": "Checkpoint",
        "type": "integer",
        "jsonPath": ".status.lastCheckpointStep",
        "priority": 1,
        "description": "Step of the latest checkpoint",
    },
    {
        "name": "In-place",
        "type": "integer",
        "jsonPath": ".status.inPlaceRestarts",
        "priority": 1,
        "description": "Of the restarts, those made inside the pods the gang had",
    },
    {
        "name": "TFLOP/s",
        "type": "number",
        "jsonPath": ".status.progress.tflopsPerGpu",
        "priority": 1,
        "description": "Achieved model TFLOP/s per GPU",
    },
    {
        "name": "MFU",
        "type": "number",
        "jsonPath": ".status.progress.mfu",
        "priority": 1,
        "description": "Model FLOPs utilisation",
    },
    {
        "name": "Step-s",
        "type": "number",
        "jsonPath": ".status.progress.stepSeconds",
        "priority": 1,
        "description": "Measured median step time",
    },
    {
        "name": "Modeled-s",
        "type": "number",
        "jsonPath": ".status.progress.modeledStepSeconds",
        "priority": 1,
        "description": "The planner's modeled step time",
    },
    {
        "name": "Vs-model",
        "type": "number",
        "jsonPath": ".status.progress.stepOverModeled",
        "priority": 1,
        "description": "Measured over modeled step time",
    },
    {
        "name": "Stragglers",
        "type": "string",
        "jsonPath": ".status.progress.stragglers[*].node",
        "priority": 1,
        "description": "Nodes the last window named slower than their peers (spec.failurePolicy.stragglers)",
    },
    {"name": "Message", "type": "string", "jsonPath": ".status.message", "priority": 1},
]


def schema_of(hint: Any) -> dict[str, Any]:
    """The structural schema of one type."""
    hint, _ = unwrap_optional(hint)
    origin = get_origin(hint)
    if dataclasses.is_dataclass(hint):
        return object_schema(hint)  # type: ignore[arg-type]
    if origin is Literal:
        return {"type": "string", "enum": list(get_args(hint))}
    if origin is list:
        return {"type": "array", "items": schema_of(get_args(hint)[0])}
    if origin is dict:
        value = get_args(hint)[1]
        if value is Any:
            return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        return {"type": "object", "additionalProperties": schema_of(value)}
    return dict(_SCALARS[hint])


def field_schema(field: dataclasses.Field[Any], hint: Any) -> dict[str, Any]:
    """A property's schema: its type's schema plus the field's description, bounds and default."""
    info = field_info(field)
    schema = schema_of(hint)
    schema["description"] = info.description
    for key, value in (
        ("minimum", info.minimum),
        ("maximum", info.maximum),
        ("pattern", info.pattern),
        ("maxLength", info.max_length),
        ("format", info.format),
    ):
        if value is not None:
            schema[key] = int(value) if key in ("minimum", "maximum") and float(value).is_integer() else value
    if info.schema_properties:
        # On a list, the declared properties are its items'.
        target = schema["items"] if schema.get("type") == "array" else schema
        target["properties"] = info.schema_properties
    if info.crd_default and field.default is not dataclasses.MISSING and field.default is not None:
        schema["default"] = field.default
    elif field.default_factory is not dataclasses.MISSING and schema.get("type") == "object":
        # An empty default object lets the API server fill the nested defaults.
        schema["default"] = {}
    return schema


def object_schema(cls: type) -> dict[str, Any]:
    """The schema of an API dataclass: its properties and required fields."""
    hints = type_hints(cls)
    props = {json_name(f): field_schema(f, hints[f.name]) for f in dataclasses.fields(cls)}
    required = [json_name(f) for f in dataclasses.fields(cls) if not has_default(f)]
    schema: dict[str, Any] = {"type": "object", "description": (cls.__doc__ or "").strip(), "properties": props}
    if required:
        schema["required"] = required
    return schema


def spec_schema() -> dict[str, Any]:
    schema = object_schema(t.ParallelJobSpec)
    schema["x-kubernetes-validations"] = [
        *(rule.x_kubernetes_validation() for rule in rules.RULES),
        {"rule": rules.SPEC_IMMUTABLE_CEL, "message": rules.SPEC_IMMUTABLE_MESSAGE, "reason": "FieldValueForbidden"},
    ]
    return schema


def root_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "description": "ParallelJob runs one multi-node 3D-parallel (pipeline x tensor x data) DeepSpeed "
        "training job: the operator places tensor-parallel groups inside NVLink domains, lays pipeline "
        "stages close in the fabric, launches one pod per node, and restarts the gang from checkpoints.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "paralleljob.io/v1alpha1"},
            "kind": {"type": "string", "description": "ParallelJob"},
            "metadata": {"type": "object"},
            "spec": spec_schema(),
            "status": object_schema(t.ParallelJobStatus),
        },
        "x-kubernetes-validations": [
            {"rule": rules.NAME_RULE_CEL, "message": rules.NAME_RULE_MESSAGE, "reason": "FieldValueInvalid"}
        ],
    }


def build_crd() -> dict[str, Any]:
    """The whole CustomResourceDefinition."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{t.PLURAL}.{t.GROUP}"},
        "spec": {
            "group": t.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": t.KIND,
                "listKind": f"{t.KIND}List",
                "plural": t.PLURAL,
                "singular": t.SINGULAR,
                "shortNames": list(t.SHORT_NAMES),
                "categories": ["all"],
            },
            "versions": [
                {
                    "name": t.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": root_schema()},
                }
            ],
        },
    }


def apply_defaults(schema: dict[str, Any], obj: Any) -> Any:
    """Fill schema defaults into an object the way the API server does before validation."""
    if not isinstance(obj, dict) or schema.get("type") != "object":
        return obj
    out = dict(obj)
    for name, prop in schema.get("properties", {}).items():
        if name not in out and "default" in prop:
            out[name] = prop["default"]
        if name in out:
            if prop.get("type") == "array" and isinstance(out[name], list):
                out[name] = [apply_defaults(prop["items"], item) for item in out[name]]
            else:
                out[name] = apply_defaults(prop, out[name])
    return out
