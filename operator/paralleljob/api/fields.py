"""Field declarations shared by the API types, the parser and the CRD generator.

Every field of a ParallelJob type is declared once with `api_field(...)`: its description, bounds, enum and
default live in the dataclass field's metadata. `paralleljob.api.parsing` reads that metadata to turn YAML
into typed objects with path-named errors, and `paralleljob.api.crd` reads the same metadata to write the
CRD's openAPIV3Schema, so the two cannot drift.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

# A Kubernetes object kept as the user wrote it (a volume source, a toleration, an env var...).
RawObject = dict[str, Any]

_MISSING: Any = dataclasses.MISSING


@dataclasses.dataclass(frozen=True)
class FieldInfo:
    """What the parser and the CRD generator know about one field."""

    description: str
    json_name: str | None = None
    minimum: float | None = None
    maximum: float | None = None
    pattern: str | None = None
    # What to write instead, when a value does not match `pattern`.
    pattern_fix: str | None = None
    max_length: int | None = None
    format: str | None = None
    # Known keys of a preserved object, declared so that CEL rules can read them.
    schema_properties: dict[str, Any] | None = None
    # Whether the CRD should default this field (only for scalars with a default).
    crd_default: bool = True


def api_field(
    description: str,
    *,
    default: Any = _MISSING,
    default_factory: Any = _MISSING,
    json_name: str | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
    pattern: str | None = None,
    pattern_fix: str | None = None,
    max_length: int | None = None,
    format: str | None = None,
    schema_properties: dict[str, Any] | None = None,
    crd_default: bool = True,
) -> Any:
    """Declare a dataclass field of the ParallelJob API with its documentation and bounds."""
    info = FieldInfo(
        description=description,
        json_name=json_name,
        minimum=minimum,
        maximum=maximum,
        pattern=pattern,
        pattern_fix=pattern_fix,
        max_length=max_length,
        format=format,
        schema_properties=schema_properties,
        crd_default=crd_default,
    )
    metadata = {"api": info}
    if default_factory is not _MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def field_info(field: dataclasses.Field[Any]) -> FieldInfo:
    """The FieldInfo of a declared field."""
    info = field.metadata.get("api")
    if not isinstance(info, FieldInfo):
        raise TypeError(f"field {field.name} was not declared with api_field()")
    return info


def json_name(field: dataclasses.Field[Any]) -> str:
    """The camelCase name a field has in YAML."""
    info = field.metadata.get("api")
    explicit = info.json_name if isinstance(info, FieldInfo) else None
    if explicit:
        return explicit
    head, *rest = field.name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def has_default(field: dataclasses.Field[Any]) -> bool:
    """Whether the field may be omitted."""
    return field.default is not _MISSING or field.default_factory is not _MISSING


DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
