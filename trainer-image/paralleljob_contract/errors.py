"""The one error of the contract: a layout, job file or environment that cannot be used, with a one-line reason
that names the field or variable and says what to change."""

from __future__ import annotations


class ContractError(ValueError):
    """The job file, the environment or a layout breaks the contract; the message names what and the fix."""
