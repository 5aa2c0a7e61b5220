"""Suite-wide: the multi-process training runs (marked `slow`) share one pytest-xdist group.

`make test` runs the suite on two workers with `--dist loadgroup`. Every training run is a gang of up to 8
processes that keeps both cores busy, so two at once would only slow each other and crowd their timeouts;
grouped, they run one after another on one worker while the other worker takes the operator, chart, planning
and API tests, which spend most of their time waiting on timers and the API server.

The tests of tests/upstream share one group too: they run against one upstream control plane (etcd, the API
server, the scheduler and the controller-manager, about 1 GB), started once by the worker that takes the group.

Hypothesis runs derandomized under CI (the "ci" profile below).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

# CI draws the same examples on every run (a fuzz test that finds something new fails the change that brought
# it, never an unrelated landing); a developer's run draws new ones each time, and Hypothesis keeps what failed.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

TRAINING_GROUP = "training-runs"
UPSTREAM_GROUP = "upstream-control-plane"
UPSTREAM = "tests/upstream/"


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("slow") is not None:
            item.add_marker(pytest.mark.xdist_group(TRAINING_GROUP))
        elif UPSTREAM in item.nodeid:
            item.add_marker(pytest.mark.xdist_group(UPSTREAM_GROUP))
