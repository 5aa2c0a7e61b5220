"""Builders for manifest tests: a job from YAML a user could write, a planner's Plan, node dicts.

Fixtures only; what the tests share besides them is tests.manifests.helpers.
"""

from __future__ import annotations

import pytest

from paralleljob.api import ResolvedJob
from paralleljob.planning import Plan
from tests.manifests.helpers import make_plan, resolve


@pytest.fixture
def resolved() -> ResolvedJob:
    return resolve()


@pytest.fixture
def plan() -> Plan:
    return make_plan()
