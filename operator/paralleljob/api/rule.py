"""What a cross-field rule of a ParallelJob spec is: where it applies, its CEL form for the CRD and its Python
form. The spec sections (`api.sections`) each declare theirs; `api.rules` gathers them.
"""

from __future__ import annotations

import dataclasses
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
        return {"rule": self.cel, "message": self.message, "fieldPath": self.field_path, "reason": "FieldValueInvalid"}
