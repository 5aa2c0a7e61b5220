"""The API server's answers that are not objects: `Status` bodies and field errors, in kube-apiserver's shapes.

Every refusal the strict cluster makes goes through `APIError`, so a client sees the code, reason and message
that a real cluster would send (`kubectl` prints `Error from server (<reason>): <message>`).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import aiohttp.web

_NO_VALUE = object()


@dataclasses.dataclass(frozen=True)
class FieldError:
    """One entry of an Invalid status, printed as apimachinery's field.Error prints it."""

    path: str
    kind: str  # "Invalid value", "Required value", "Unsupported value", "Forbidden", "Too long", "Duplicate value"
    detail: str = ""
    value: Any = _NO_VALUE

    def __str__(self) -> str:
        text = f"{self.path or '<nil>'}: {self.kind}"
        if self.value is not _NO_VALUE:
            text += f": {value_text(self.value)}"
        return f"{text}: {self.detail}" if self.detail else text

    @property
    def reason(self) -> str:
        return {
            "Invalid value": "FieldValueInvalid",
            "Required value": "FieldValueRequired",
            "Unsupported value": "FieldValueNotSupported",
            "Forbidden": "FieldValueForbidden",
            "Too long": "FieldValueTooLong",
            "Duplicate value": "FieldValueDuplicate",
        }.get(self.kind, "FieldValueInvalid")


def value_text(value: Any) -> str:
    """How field.Error shows a value: strings quoted, numbers and booleans bare, anything else as JSON."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value, sort_keys=True)


class APIError(Exception):
    """A refusal, answered as a `Status` with the given code and reason."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details or {}

    def response(self) -> aiohttp.web.Response:
        return status_response(self.code, self.reason, self.message, self.details)


def status_response(
    code: int, reason: str, message: str, details: dict[str, Any] | None = None
) -> aiohttp.web.Response:
    return aiohttp.web.json_response(status_body(code, reason, message, details), status=code)


def status_body(code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    """A `Status` object: the body of a refusal, and the object of a watch's ERROR event."""
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Status",
        "metadata": {},
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    }
    if details:
        body["details"] = details
    return body


def qualified_kind(kind: str, group: str) -> str:
    """`Pod` for the core group, `ParallelJob.paralleljob.io` for any other, as Invalid messages name kinds."""
    return f"{kind}.{group}" if group else kind


def invalid(kind: str, group: str, name: str, errors: list[FieldError]) -> APIError:
    """422 Invalid: `<Kind> "<name>" is invalid: <error>` or `...: [<error>, <error>]` for several."""
    listed = str(errors[0]) if len(errors) == 1 else "[" + ", ".join(str(e) for e in errors) + "]"
    causes = [{"reason": e.reason, "message": str(e).split(": ", 1)[-1], "field": e.path} for e in errors]
    details = {"name": name, "group": group, "kind": kind, "causes": causes}
    return APIError(422, "Invalid", f'{qualified_kind(kind, group)} "{name}" is invalid: {listed}', details)


def bad_request(message: str) -> APIError:
    return APIError(400, "BadRequest", message)


def not_found(plural: str, name: str, group: str = "") -> APIError:
    resource = f"{plural}.{group}" if group else plural
    return APIError(404, "NotFound", f'{resource} "{name}" not found', {"name": name, "group": group, "kind": plural})


def already_exists(plural: str, name: str, group: str = "") -> APIError:
    resource = f"{plural}.{group}" if group else plural
    return APIError(409, "AlreadyExists", f'{resource} "{name}" already exists', {"name": name, "kind": plural})


def conflict(plural: str, name: str, group: str = "") -> APIError:
    resource = f"{plural}.{group}" if group else plural
    message = (
        f'Operation cannot be fulfilled on {resource} "{name}": the object has been modified; '
        "please apply your changes to the latest version and try again"
    )
    return APIError(409, "Conflict", message, {"name": name, "group": group, "kind": plural})
