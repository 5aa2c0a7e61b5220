"""The suite's two lanes on `make test`'s two pytest-xdist workers (`--dist loadgroup`), assigned by the hook that
tests/conftest.py registers: the multi-process training runs (marked `slow`) share one group, and so do the tests
of tests/upstream.

Every training run is a gang of up to 8 processes that keeps both cores busy, so two at once would only slow each
other and crowd their timeouts; grouped, they run one after another on one worker while the other worker takes the
operator, chart, planning and API tests, which spend most of their time waiting on timers and the API server.
The tests of tests/upstream run against one upstream control plane (etcd, the API server, the scheduler and the
controller-manager, about 1 GB), started once by the worker that takes the group.

A helper module rather than the conftest itself, so that tests/setup/test_suite_lanes.py runs a small suite through
this very hook without importing a conftest.
"""

from __future__ import annotations

import pytest

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
