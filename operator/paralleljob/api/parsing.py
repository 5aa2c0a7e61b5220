"""Turns a ParallelJob document (a dict from YAML or the API) into typed API objects.

Driven by the dataclass declarations in `paralleljob.api.types`: required fields, types, enums, bounds and
unknown fields are all checked here, and every problem is reported with its field path. Nothing raises on
bad input; callers get `(object or None, problems)`.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re
import sys
import types
import typing
from typing import Any, Literal, get_args, get_origin

from paralleljob.api import types as api_types
from paralleljob.api.fields import DNS_LABEL, field_info, has_default, json_name
from paralleljob.api.problems import Problem, error

_SCALAR_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


@functools.cache
def type_hints(cls: type) -> dict[str, Any]:
    """Resolved annotations of an API dataclass, in its own section's namespace (`api.sections`) and the API's."""
    return typing.get_type_hints(cls, {**vars(api_types), **vars(sys.modules[cls.__module__])})


def unwrap_optional(hint: Any) -> tuple[Any, bool]:
    """(inner type, whether None is allowed)."""
    if get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return hint, False


def describe(hint: Any) -> str:
    """How a type is named in messages."""
    hint, _ = unwrap_optional(hint)
    origin = get_origin(hint)
    if origin is Literal:
        return "one of " + ", ".join(str(a) for a in get_args(hint))
    if origin is list:
        return "a list"
    if origin is dict or dataclasses.is_dataclass(hint):
        return "a mapping"
    return _SCALAR_NAMES.get(hint, str(hint))


class _Parser:
    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def fail(self, path: str, message: str) -> None:
        self.problems.append(error(path, message))

    def value(self, hint: Any, raw: Any, path: str) -> Any:
        hint, optional = unwrap_optional(hint)
        if raw is None:
            if not optional:
                self.fail(path, f"must be {describe(hint)}, not null; set a value or remove the field.")
            return None
        origin = get_origin(hint)
        if dataclasses.is_dataclass(hint):
            return self.dataclass(typing.cast(type, hint), raw, path)
        if origin is Literal:
            return self.literal(hint, raw, path)
        if origin is list:
            return self.list_(get_args(hint)[0], raw, path)
        if origin is dict:
            return self.dict_(get_args(hint)[1], raw, path)
        return self.scalar(hint, raw, path)

    def scalar(self, hint: Any, raw: Any, path: str) -> Any:
        ok = isinstance(raw, hint) and not (hint in (int, float) and isinstance(raw, bool))
        if hint is float and isinstance(raw, int) and not isinstance(raw, bool):
            return float(raw)
        if hint is int and isinstance(raw, float) and raw.is_integer():
            return int(raw)
        if not ok:
            self.fail(path, f"must be {describe(hint)}, got {raw!r}; write it as {describe(hint)}.")
            return None
        return raw

    def literal(self, hint: Any, raw: Any, path: str) -> Any:
        allowed = get_args(hint)
        if raw not in allowed:
            choices = ", ".join(str(a) for a in allowed)
            self.fail(path, f"{raw!r} is not allowed; use one of {choices}.")
            return None
        return raw

    def list_(self, item: Any, raw: Any, path: str) -> Any:
        if not isinstance(raw, list):
            self.fail(path, f"must be a list, got {type(raw).__name__}; write it as a YAML list.")
            return None
        if item is dict or (get_origin(item) is dict and get_args(item)[1] is Any):
            return [self.raw_object(entry, f"{path}[{i}]") for i, entry in enumerate(raw)]
        return [self.value(item, entry, f"{path}[{i}]") for i, entry in enumerate(raw)]

    def dict_(self, item: Any, raw: Any, path: str) -> Any:
        if not isinstance(raw, dict):
            self.fail(path, f"must be a mapping, got {type(raw).__name__}; write it as key: value pairs.")
            return None
        if item is Any:
            return raw
        return {str(k): self.value(item, v, f"{path}.{k}") for k, v in raw.items()}

    def raw_object(self, raw: Any, path: str) -> Any:
        if not isinstance(raw, dict):
            self.fail(path, f"must be a mapping, got {type(raw).__name__}; write it as a Kubernetes object.")
            return None
        return raw

    def dataclass(self, cls: type, raw: Any, path: str) -> Any:
        if not isinstance(raw, dict):
            self.fail(path, f"must be a mapping, got {type(raw).__name__}; write it as key: value pairs.")
            return None
        hints = type_hints(cls)
        fields = {json_name(f): f for f in dataclasses.fields(cls)}
        for key in raw:
            if key not in fields:
                self.unknown(str(key), list(fields), f"{path}.{key}")
        values: dict[str, Any] = {}
        complete = True
        for name, field in fields.items():
            sub = f"{path}.{name}"
            if name not in raw:
                if not has_default(field):
                    self.fail(sub, f"is required: {field_info(field).description}")
                    complete = False
                continue
            before = len(self.problems)
            parsed = self.value(hints[field.name], raw[name], sub)
            if parsed is not None and not self.bounds(field, parsed, sub):
                parsed = None
            if len(self.problems) > before:
                # The error is recorded; an optional field falls back to its default so that the
                # remaining rules still run and every problem in the file is reported at once.
                complete = complete and has_default(field)
                continue
            values[field.name] = parsed
        if not complete:
            return None
        return cls(**values)

    def unknown(self, key: str, known: list[str], path: str) -> None:
        close = difflib.get_close_matches(key, known, n=1)
        hint = f"did you mean {close[0]}?" if close else f"known fields: {', '.join(known)}."
        self.fail(path, f"unknown field; remove it ({hint})")

    def bounds(self, field: dataclasses.Field[Any], value: Any, path: str) -> bool:
        """Check minimum/maximum, and a string's pattern and length (as the CRD schema does); False (with the
        error recorded) when out of bounds."""
        info = field_info(field)
        if info.schema_properties and isinstance(value, dict):
            return self.declared_properties(info.schema_properties, value, path)
        if isinstance(value, str):
            return self.string_bounds(info, value, path)
        if not isinstance(value, int | float) or isinstance(value, bool):
            return True
        if info.minimum is not None and value < info.minimum:
            self.fail(path, f"must be at least {info.minimum:g}, got {value}; set a value >= {info.minimum:g}.")
            return False
        if info.maximum is not None and value > info.maximum:
            self.fail(path, f"must be at most {info.maximum:g}, got {value}; set a value <= {info.maximum:g}.")
            return False
        return True

    def string_bounds(self, info: Any, value: str, path: str) -> bool:
        if info.max_length is not None and len(value) > info.max_length:
            self.fail(path, f"is {len(value)} characters long; use at most {info.max_length}.")
            return False
        if info.pattern is not None and not re.search(info.pattern, value):
            self.fail(path, f"{value!r} does not match {info.pattern}; {info.pattern_fix or 'change it to match'}.")
            return False
        return True

    def declared_properties(self, schema: dict[str, Any], raw: dict[str, Any], path: str) -> bool:
        """Check the keys a preserved object declares (types and bounds), ignoring the rest."""
        ok = True
        for key, prop in schema.items():
            if key not in raw:
                continue
            value, sub = raw[key], f"{path}.{key}"
            kind = prop.get("type")
            if kind == "object":
                if not isinstance(value, dict):
                    self.fail(sub, f"must be a mapping, got {value!r}; write it as key: value pairs.")
                    ok = False
                elif "properties" in prop:
                    ok = self.declared_properties(prop["properties"], value, sub) and ok
                continue
            python_type = {"integer": int, "number": float, "boolean": bool, "string": str}[kind]
            if self.scalar(python_type, value, sub) is None:
                ok = False
                continue
            if "minimum" in prop and value < prop["minimum"]:
                self.fail(sub, f"must be at least {prop['minimum']}, got {value}; set a value >= {prop['minimum']}.")
                ok = False
            if "maximum" in prop and value > prop["maximum"]:
                self.fail(sub, f"must be at most {prop['maximum']}, got {value}; set a value <= {prop['maximum']}.")
                ok = False
        return ok


def parse_spec(raw: Any, path: str = "spec") -> tuple[api_types.ParallelJobSpec | None, list[Problem]]:
    """Parse a spec mapping; returns None when a required part is missing or malformed."""
    parser = _Parser()
    if raw is None:
        return None, [error(path, "is missing; a ParallelJob needs spec.parallelism, spec.model and spec.training.")]
    spec = parser.dataclass(api_types.ParallelJobSpec, raw, path)
    return spec, parser.problems


def parse_metadata(raw: Any) -> tuple[api_types.ObjectMeta | None, list[Problem]]:
    """Parse metadata, keeping only the fields the API reads, and check the name."""
    if not isinstance(raw, dict) or "name" not in raw:
        return None, [error("metadata.name", "is required; give the job a name (a DNS-1123 label).")]
    known = {json_name(f) for f in dataclasses.fields(api_types.ObjectMeta)}
    parser = _Parser()
    meta = parser.dataclass(api_types.ObjectMeta, {k: v for k, v in raw.items() if k in known}, "metadata")
    problems = parser.problems
    if meta is not None:
        problems += check_name(meta.name)
    return meta, problems


def check_name(name: str) -> list[Problem]:
    """Pods are named <job>-<nodeRank>, so the job name must be a short DNS-1123 label."""
    if not DNS_LABEL.match(name):
        return [
            error(
                "metadata.name",
                f"{name!r} is not a DNS-1123 label; use lowercase letters, digits and '-', starting and "
                "ending with a letter or digit.",
            )
        ]
    if len(name) > api_types.MAX_NAME_LENGTH:
        return [
            error(
                "metadata.name",
                f"is {len(name)} characters; use at most {api_types.MAX_NAME_LENGTH} so that pod names "
                "<name>-<nodeRank> stay valid hostnames.",
            )
        ]
    return []


def parse_job(doc: Any) -> tuple[api_types.ParallelJob | None, list[Problem]]:
    """Parse a whole ParallelJob document: apiVersion, kind, metadata and spec."""
    if not isinstance(doc, dict):
        return None, [error("(document)", f"is {type(doc).__name__}, not a mapping; write a ParallelJob object.")]
    kind, version = doc.get("kind"), doc.get("apiVersion")
    if kind != api_types.KIND:
        what = f"a {version} {kind}" if kind else "an object without kind"
        return None, [error("kind", f"is {kind!r}: this is {what}, not a ParallelJob; set kind: {api_types.KIND}.")]
    if version != api_types.API_VERSION:
        return None, [error("apiVersion", f"is {version!r}; set apiVersion: {api_types.API_VERSION}.")]
    meta, meta_problems = parse_metadata(doc.get("metadata"))
    spec, spec_problems = parse_spec(doc.get("spec"))
    problems = meta_problems + spec_problems
    if meta is None or spec is None:
        return None, problems
    return api_types.ParallelJob(metadata=meta, spec=spec), problems
