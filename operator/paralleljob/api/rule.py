"""What a cross-field rule of a ParallelJob spec is: where it applies, its CEL form for the CRD and its Python
form. The spec sections (`api.sections`) each declare theirs; `api.rules` gathers them.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from paralleljob.api.problems import Problem

if TYPE_CHECKING:
    from paralleljob.api import types as t

Check = Callable[["t.ParallelJobSpec"], Problem | None]


@dataclasses.dataclass(frozen=True)
class Rule:
    """One cross-field rule: where it applies, its CEL form and its Python form."""

    name: str
    field_path: str  # relative to spec, as the CRD's fieldPath (".parallelism.tensor")
    cel: str
    message: str  # the fixed message CEL reports
    check: Check
    # Only for a job on a cluster (the CRD, the operator, `paralleljob validate`); `paralleljob run` skips it.
    cluster_only: bool = False

    def x_kubernetes_validation(self) -> dict[str, Any]:
        """The CRD's form: the rule, passed on an update that leaves every field it reads unchanged."""
        return {
            "rule": f"({ratchet(self.cel)}) || ({self.cel})",
            "optionalOldSelf": True,
            "message": self.message,
            "fieldPath": self.field_path,
            "reason": "FieldValueInvalid",
        }


# A field the rule reads: `self.a.b`, less a method called on it (`self.template.labels.all(...)` reads labels).
_READ = re.compile(r"\bself((?:\.[A-Za-z_]\w*)+)(\s*\()?")


def fields_read(cel: str) -> tuple[str, ...]:
    """The spec fields a rule reads, deepest only: `has(self.a) && self.a.b > 0` reads a.b."""
    paths = set()
    for found in _READ.finditer(cel):
        parts = found.group(1)[1:].split(".")
        if found.group(2):
            parts = parts[:-1]
        if parts:
            paths.add(".".join(parts))
    return tuple(sorted(path for path in paths if not any(other.startswith(path + ".") for other in paths)))


def unchanged(path: str, old: str = "oldSelf") -> str:
    """CEL: the field at `path` is set in both `self` and `old` or in neither, and equal when set (every level
    guarded, since CEL errors on has(a.b) when a is absent)."""
    parts = path.split(".")
    prefixes = [".".join(parts[: i + 1]) for i in range(len(parts))]

    def present(root: str) -> str:
        return " && ".join(f"has({root}.{prefix})" for prefix in prefixes)

    return f"(({present('self')}) == ({present(old)}) && (!({present('self')}) || self.{path} == {old}.{path}))"


def ratchet(cel: str) -> str:
    """CEL, with `optionalOldSelf`: an update that leaves every field the rule reads as it was. Kubernetes'
    own ratcheting never applies to a spec rule of ours: it needs the whole spec to compare equal to the stored
    one, and neither its walk nor CEL's `==` sees inside a map under x-kubernetes-preserve-unknown-fields
    (spec.deepspeed), so a job stored before a rule existed could not be written at all, not even its status
    (docs/operator.md). Compared field by field, scalars compare."""
    reads = " && ".join(unchanged(path, "oldSelf.value()") for path in fields_read(cel))
    return f"oldSelf.hasValue() && {reads}"
