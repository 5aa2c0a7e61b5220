"""Fixtures for the chart tests: the real helm binary and the chart rendered with given values.

Fixtures only; what the tests share besides them is tests.chart.helpers.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.chart.helpers import NON_DEFAULT_VALUES, render


@pytest.fixture(scope="session")
def default_objects() -> list[dict[str, Any]]:
    return render()


@pytest.fixture(scope="session")
def non_default_objects() -> list[dict[str, Any]]:
    return render(NON_DEFAULT_VALUES)
