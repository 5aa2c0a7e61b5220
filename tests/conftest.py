"""Suite-wide: the lanes of `make test`'s two workers (tests/lanes.py: the multi-process training runs share one
pytest-xdist group, the upstream tests another), and Hypothesis derandomized under CI (the "ci" profile below).
"""

from __future__ import annotations

import os

from hypothesis import settings

from tests.lanes import pytest_collection_modifyitems  # noqa: F401 (the hook, registered by being here)

# CI draws the same examples on every run (a fuzz test that finds something new fails the change that brought
# it, never an unrelated landing); a developer's run draws new ones each time, and Hypothesis keeps what failed.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
