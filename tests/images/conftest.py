"""Fixtures for the image tests: the images `make images` built (the local store, testcluster/images.py), and
commands run inside them the way the test cluster's kubelet runs a container (testcluster/sandbox.py): the
image's root filesystem under an overlay of the test's own, read-only unless asked, as the image's user unless
told otherwise, with the chart's emptyDirs as the only writable folders.

Fixtures only; what the tests share besides them is tests.images.helpers.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from testcluster import images
from tests.images.helpers import OPERATOR, TRAINER_CPU, InImage, built


@pytest.fixture(scope="session")
def store() -> Iterator[images.Store]:
    made = images.Store()
    try:
        yield made
    finally:
        made.close()


@pytest.fixture(scope="session")
def operator_image(store: images.Store, tmp_path_factory: pytest.TempPathFactory) -> InImage:
    return InImage(built(store, OPERATOR), tmp_path_factory.mktemp("operator-image"))


@pytest.fixture(scope="session")
def trainer_image(store: images.Store, tmp_path_factory: pytest.TempPathFactory) -> InImage:
    return InImage(built(store, TRAINER_CPU), tmp_path_factory.mktemp("trainer-image"))
